"""The tracing pipeline: rollouts and train steps in, span trees out to every exporter.

Caller side (event loop, any thread): cheap snapshots handed to the ``Worker``. Worker side:
build the span tree once, give it to each sink, remember what was exported so that a
trajectory reaching us twice (from ``gather`` and again at ``train``) is exported once, and
scores that changed in between are sent as score updates.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from art_core.background import Worker
from art_core.tracing.build import RolloutRecord, rollout_scores, rollout_tree, train_tree
from art_core.tracing.settings import TracingSettings
from art_core.tracing.tools import ToolRecord
from art_core.tracing.tree import ScoreUpdate, SpanNode
from art_core.trajectories import LLMCall, Trajectory

logger = logging.getLogger("art_core.tracing")

MAX_PENDING = 100_000  # rollouts started but not yet exported (their context waits here)


class Sink(Protocol):
    """An exporter of span trees (``OtelSink``, ``LangfuseSink``, ``WeaveSink``, or yours)."""

    name: str

    def capture_parent(self) -> Any: ...
    def emit(self, node: SpanNode, parent: Any) -> None: ...
    def update_scores(self, update: ScoreUpdate) -> None: ...
    def flush(self, timeout_s: float) -> bool: ...
    def shutdown(self, timeout_s: float) -> None: ...


@dataclass
class RunContext:
    """What a rollout's trace needs that its trajectory does not carry."""

    model_name: str | None = None
    project: str | None = None
    base_model: str | None = None
    parents: dict[str, Any] = field(default_factory=dict)
    tools: list[ToolRecord] = field(default_factory=list)


class _Bounded(OrderedDict[str, Any]):
    """An insertion-ordered dict that forgets its oldest entries past ``limit``."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def put(self, key: str, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.limit:
            self.popitem(last=False)


def model_context(model: Any) -> RunContext:
    """Name, project and base model of a ``TrainableModel`` (duck-typed)."""
    return RunContext(
        model_name=getattr(model, "name", None),
        project=getattr(model, "project", None),
        base_model=getattr(model, "base_model", None),
    )


class Pipeline:
    """Everything tracing does while it is enabled.

    Example:
        >>> from art_core.tracing.otel import OtelSink
        >>> from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        >>> memory = InMemorySpanExporter()
        >>> pipeline = Pipeline([OtelSink(memory, TracingSettings())], TracingSettings())
        >>> pipeline.rollout_finished(Trajectory(reward=1.0))
        >>> pipeline.flush(5.0), len(memory.get_finished_spans())
        (True, 1)
        >>> pipeline.shutdown(1.0)
    """

    def __init__(self, sinks: list[Sink], settings: TracingSettings) -> None:
        self.sinks = list(sinks)
        self.settings = settings
        self.worker = Worker(settings.max_queue_size)
        self._lock = threading.Lock()
        self._contexts = _Bounded(MAX_PENDING)
        self._exported = _Bounded(MAX_PENDING)  # worker thread only: rollout id -> scores

    # ------------------------------------------------------------------ caller side
    def run_started(self, rollout_id: str, model: Any) -> None:
        """Remember the rollout's model and the caller's current span/call (its parent)."""
        context = model_context(model)
        for sink in self.sinks:
            try:
                parent = sink.capture_parent()
            except Exception:  # a broken tracing backend must not break the rollout
                parent = None
            if parent is not None:
                context.parents[sink.name] = parent
        with self._lock:
            self._contexts.put(rollout_id, context)

    def tool_call(self, rollout_id: str, record: ToolRecord) -> None:
        """Attach an integration's tool call (exact timings) to a running rollout."""
        with self._lock:
            context = self._contexts.get(rollout_id)
            if context is None:
                context = RunContext()
                self._contexts.put(rollout_id, context)
            context.tools.append(record)

    def _take_context(self, rollout_id: str) -> RunContext:
        with self._lock:
            return self._contexts.pop(rollout_id, None) or RunContext()

    def rollout_finished(self, trajectory: Trajectory, model: Any = None) -> None:
        """Export a final trajectory (once; later calls only send changed scores)."""
        context = self._take_context(trajectory.id)
        if model is not None and context.model_name is None:
            fallback = model_context(model)
            context.model_name, context.project, context.base_model = (
                fallback.model_name,
                fallback.project,
                fallback.base_model,
            )
        record = RolloutRecord(
            id=trajectory.id,
            calls=list(trajectory.calls),
            reward=trajectory.reward,
            start_time=trajectory.start_time,
            end_time=trajectory.end_time,
            metrics=dict(trajectory.metrics),
            metadata=dict(trajectory.metadata),
            logs=list(trajectory.logs),
            model_name=context.model_name,
            project=context.project,
            base_model=context.base_model,
            tools=list(context.tools),
        )
        self.worker.submit(lambda: self._export_rollout(record, context.parents))

    def rollout_failed(
        self,
        rollout_id: str,
        calls: Iterable[LLMCall],
        exc: BaseException,
        start: float,
        end: float,
    ) -> None:
        """Export a rollout whose code raised, with the calls it made and the error."""
        context = self._take_context(rollout_id)
        record = RolloutRecord(
            id=rollout_id,
            calls=list(calls),
            reward=None,
            start_time=start,
            end_time=end,
            model_name=context.model_name,
            project=context.project,
            base_model=context.base_model,
            error_type=type(exc).__name__,
            error_message=str(exc),
            error_traceback="".join(traceback.format_exception(exc)),
            tools=list(context.tools),
        )
        self.worker.submit(lambda: self._export_rollout(record, context.parents))

    def train_step(
        self,
        model: Any,
        trajectory_ids: list[str],
        step: int,
        metrics: Mapping[str, float],
        start: float,
        end: float,
        checkpoint_path: str | None,
        config: Mapping[str, Any] | None,
    ) -> None:
        """Export one ``train`` call (after the rollouts it trained on)."""
        context = model_context(model)
        node = train_tree(
            model_name=context.model_name or "model",
            project=context.project,
            step=step,
            metrics=dict(metrics),
            start_time=start,
            end_time=end,
            trajectory_ids=trajectory_ids,
            checkpoint_path=checkpoint_path,
            config=config,
        )
        self.worker.submit(lambda: self._emit(node, {}))

    # ------------------------------------------------------------------ worker side
    def _export_rollout(self, record: RolloutRecord, parents: dict[str, Any]) -> None:
        scores = rollout_scores(record, self.settings)
        before = self._exported.get(record.id)
        if before is None:
            self._exported.put(record.id, scores)
            self._emit(rollout_tree(record, self.settings), parents)
            return
        changed = [s for s in scores if s not in before]
        if not changed:
            return
        self._exported.put(record.id, scores)
        update = ScoreUpdate(record.id, changed, time.time())
        for sink in self.sinks:
            try:
                sink.update_scores(update)
            except Exception:
                logger.exception("tracing: %s failed to update scores", sink.name)

    def _emit(self, node: SpanNode, parents: dict[str, Any]) -> None:
        for sink in self.sinks:
            try:
                sink.emit(node, parents.get(sink.name))
            except Exception:
                logger.exception("tracing: %s failed to export %s", sink.name, node.name)

    # ------------------------------------------------------------------ lifecycle
    def flush(self, timeout_s: float) -> bool:
        """Wait for queued work, then for every sink to send what it holds."""
        deadline = time.monotonic() + timeout_s
        ok = self.worker.flush(timeout_s)
        for sink in self.sinks:
            left = max(0.1, deadline - time.monotonic())
            try:
                ok = sink.flush(left) and ok
            except Exception:
                logger.exception("tracing: %s failed to flush", sink.name)
                ok = False
        return ok

    def shutdown(self, timeout_s: float) -> None:
        """Flush (bounded by ``timeout_s``) and release every sink."""
        deadline = time.monotonic() + timeout_s
        self.worker.close(timeout_s)
        for sink in self.sinks:
            try:
                sink.shutdown(max(0.1, deadline - time.monotonic()))
            except Exception:
                logger.exception("tracing: %s failed to shut down", sink.name)

    def stats(self) -> dict[str, Any]:
        """Counters: rollouts/steps queued, dropped, failed; spans per exporter."""
        out: dict[str, Any] = {
            "submitted": self.worker.submitted,
            "dropped": self.worker.dropped,
            "failed": self.worker.failed,
            "busy_s": self.worker.busy_s,
        }
        for sink in self.sinks:
            stats = getattr(sink, "stats", None)
            if callable(stats):
                out[getattr(sink, "label", sink.name)] = stats()
        return out
