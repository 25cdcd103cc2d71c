"""Weave: each rollout a call tree (``art.rollout`` > ``art.chat`` / ``art.tool.*``), reward and
RULER score as feedback and in the call's summary, train steps as ``art.train_step`` calls.

Calls are logged with the real ``weave`` client (its batching and retries), with the times
the gateway recorded. A rollout started inside a ``@weave.op`` is logged as a child of that
op's call, so users keep decorating their own functions.
"""

from __future__ import annotations

import contextlib
import datetime
import re
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from art_core.background import call_with_timeout
from art_core.metrics import state
from art_core.metrics.wandb import run_id
from art_core.tracing import genai
from art_core.tracing.settings import TracingSettings
from art_core.tracing.tree import Score, ScoreUpdate, SpanNode

MAX_REMEMBERED = 20_000
# Content already shown as the call's inputs/outputs: not repeated in its attributes.
_CONTENT_ATTRIBUTES = {
    genai.INPUT_MESSAGES,
    genai.OUTPUT_MESSAGES,
    genai.TOOL_DEFINITIONS,
    genai.TOOL_ARGUMENTS,
    genai.TOOL_RESULT,
    "art.logs",
    "art.error.traceback",
}
_OP_NAME = re.compile(r"[^A-Za-z0-9_.-]")


def op_name(node: SpanNode) -> str:
    """The Weave op a node is logged as (one op per tool name).

    Example:
        >>> op_name(SpanNode("execute_tool get weather", "tool", 0, 1, display_name="get weather"))
        'art.tool.get_weather'
    """
    if node.kind == "tool":
        return "art.tool." + _OP_NAME.sub("_", node.display_name or "tool")
    return {"rollout": "art.rollout", "llm": "art.chat", "train": "art.train_step"}.get(
        node.kind, f"art.{node.kind}"
    )


def wandb_run_id(node: SpanNode) -> str | None:
    """The id of the W&B run ``metrics.enable_wandb`` logs this node's model to, or None when
    W&B logging is off.

    Example:
        >>> wandb_run_id(SpanNode("r", "rollout", 0, 1)) is None
        True
    """
    if state.wandb_logger() is None:
        return None
    project, name = node.attributes.get("art.project"), node.attributes.get("art.model.name")
    if not isinstance(name, str):
        return None
    return run_id(str(project or "default"), name)


def _time(seconds: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)


class RolloutError(Exception):
    """How a rollout that raised shows up on its Weave call."""


class WeaveSink:
    """Log span trees to Weave.

    Uses ``client`` if given, else the client of an earlier ``weave.init`` in this process,
    else ``weave.init(project)``.

    Example:
        >>> sink = WeaveSink(TracingSettings(), project="my-team/agent-rl")  # needs a network service: W&B  # doctest: +SKIP
    """

    name = "weave"

    def __init__(
        self, settings: TracingSettings, client: Any = None, project: str | None = None
    ) -> None:
        try:
            import weave
            from weave.trace.context import weave_client_context
        except ImportError as exc:
            raise ImportError("Weave tracing needs `weave`: pip install 'art-core[weave]'") from exc
        if client is None:
            client = weave_client_context.get_weave_client()
        if client is None:
            if not project:
                raise ValueError(
                    "Weave tracing needs a project: call weave.init(...) first, pass "
                    "weave_project='entity/project', or set ART_WEAVE_PROJECT"
                )
            client = weave.init(project)
        self.client = client
        self.settings = settings
        self._calls: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()
        # Calls and feedback handed to the client since its last complete flush: none, and
        # ``shutdown`` has nothing of ours to wait for (a flush waits out the client's batch
        # intervals, ~2 s, even with an empty queue).
        self._handed = 0

    # -------------------------------------------------------------- caller side
    def capture_parent(self) -> Any:
        from weave.trace.context.call_context import get_current_call

        return get_current_call()

    # -------------------------------------------------------------- worker side
    def emit(self, node: SpanNode, parent: Any) -> None:
        with self._lock:
            self._handed += 1
        with self._wandb_run(node):
            self._log(node, parent)

    @contextlib.contextmanager
    def _wandb_run(self, node: SpanNode) -> Iterator[None]:
        """Link the calls to the model's W&B run (Weave's ``wb_run_id``) while metric logging
        to W&B is on (``metrics.enable_wandb``), unless the client already has a run set."""
        run = wandb_run_id(node)
        if run is None or getattr(self.client, "_wandb_run_context", None) is not None:
            yield
            return
        self.client.set_wandb_run_context(run_id=run)
        try:
            yield
        finally:
            self.client.clear_wandb_run_context()

    def _log(self, node: SpanNode, parent: Any) -> Any:
        attributes = {
            key: value for key, value in node.attributes.items() if key not in _CONTENT_ATTRIBUTES
        }
        call = self.client.create_call(
            op_name(node),
            {"input": node.input} if not isinstance(node.input, dict) else node.input,
            parent=parent,
            attributes={"art": attributes},
            display_name=node.display_name or node.name,
            use_stack=False,
            started_at=_time(node.start_time),
        )
        # A rollout is a Weave thread: its model and tool calls, logged in the thread's
        # context below a call outside it, each become one of the thread's turns.
        with self._thread(node):
            for child in node.children:
                self._log(child, call)
        if node.scores:
            call.summary = {"art": {score.name: score.value for score in node.scores}}
        self.client.finish_call(
            call,
            node.output,
            exception=RolloutError(node.error) if node.error else None,
            ended_at=_time(node.end_time),
        )
        self._add_feedback(call, node.scores)
        if node.key:
            with self._lock:
                self._calls[node.key] = call
                while len(self._calls) > MAX_REMEMBERED:
                    self._calls.popitem(last=False)
        return call

    @staticmethod
    @contextlib.contextmanager
    def _thread(node: SpanNode) -> Iterator[None]:
        if node.kind != "rollout" or not node.key:
            yield
            return
        from weave.trace.context import call_context

        with call_context.set_thread_id(node.key):
            yield

    @staticmethod
    def _add_feedback(call: Any, scores: list[Score]) -> None:
        for score in scores:
            payload: dict[str, Any] = {"value": score.value}
            if score.comment:
                payload["explanation"] = score.comment
            call.feedback.add(score.name, payload)

    def update_scores(self, update: ScoreUpdate) -> None:
        with self._lock:
            call = self._calls.get(update.key)
        if call is not None:
            with self._lock:
                self._handed += 1
            self._add_feedback(call, update.scores)

    def flush(self, timeout_s: float) -> bool:
        with self._lock:
            handed = self._handed
        done = call_with_timeout(self.client.flush, timeout_s, name="art-weave-flush")
        if done:
            with self._lock:
                self._handed -= handed  # what came in during the flush is still to send
        return done

    def shutdown(self, timeout_s: float) -> None:
        with self._lock:
            pending = self._handed
        if pending:  # after a complete flush, nothing of ours is left to wait for
            self.flush(timeout_s)

    def stats(self) -> dict[str, int]:
        return {}
