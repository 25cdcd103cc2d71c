"""Distillation: run the user's rollout function with a teacher model and keep its runs as SFT data.

The rollout function stays as it is: it gets a model and opens ``art.capture(model)`` as for
training. The model it gets here is a stand-in whose base URL is a ``TeacherProxy``: a small
OpenAI-compatible server on loopback that forwards each chat completion to the teacher (any
OpenAI-compatible endpoint: a bigger model on vLLM, a hosted API, another ``art-core``
gateway) and records the request and the answer under the rollout, so
``run.trajectory()`` works as usual. The teacher's calls carry text, not token ids; when the
student trains on them, ``train_sft`` re-renders them with the student's chat template
(``art_core.sft.render``), tool calls included.

Recipe (see docs/training/warm-start.md):

    teacher = art.Model(name="teacher", inference_base_url="http://gpu-box:8000/v1",
                        inference_model_name="Qwen/Qwen2.5-7B-Instruct", inference_api_key="...")
    demos = await art.teacher_trajectories(rollout, teacher, scenarios, min_reward=1.0)
    await model.train_sft(demos, config=art.SFTConfig(epochs=3, learning_rate=2e-4))
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from art_core.clients import shared_ssl_context
from art_core.gateway.body import DEFAULT_MAX_BODY_BYTES, read_json_object
from art_core.gateway.errors import APIError
from art_core.gateway.prompts import normalize_message
from art_core.gateway.requests import parse_chat_request
from art_core.gateway.server import GatewayServer
from art_core.gateway.wire import SSE_DONE, sse
from art_core.gather import gather_trajectory_groups
from art_core.model import Model, TrainableModel
from art_core.names import check_name
from art_core.sft.data import Demonstration, best_trajectories, check_demonstration
from art_core.trajectories import LLMCall, Trajectory, TrajectoryGroup

logger = logging.getLogger(__name__)
Scenario = TypeVar("Scenario")
# Request fields that only mean something to our gateway: kept in the call record, not sent.
_NOT_FORWARDED = frozenset({"metadata", "stream", "stream_options"})
# The teacher's rollouts kept in memory before capture releases them (oldest dropped first).
DEFAULT_MAX_ROLLOUTS = 10_000


def _answer_message(message: Any) -> dict[str, Any]:
    """The teacher's answer as a normalized assistant message."""
    if not isinstance(message, dict):
        raise ValueError(f"the teacher's choice has no message object: {message!r:.200}")
    return normalize_message({**message, "role": "assistant"})


class TeacherProxy:
    """A recording OpenAI-compatible proxy in front of a teacher model (see the module).

    It serves ``/v1/chat/completions`` and ``/rollouts/{id}/v1/chat/completions`` on its own
    thread (so agent code that blocks its event loop cannot stall it) and implements what
    ``art.capture`` asks of a backend (``rollout_calls``). A streamed request is answered as
    server-sent events once the teacher's whole answer is in.

    Example:
        >>> async with TeacherProxy(teacher) as proxy:               # fragment: a `teacher` model, the user's `rollout`  # doctest: +SKIP
        ...     trajectory = await rollout(proxy.model, scenario)   # the user's rollout
    """

    def __init__(
        self,
        teacher: Model,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        timeout: float = 600.0,
        max_rollouts: int = DEFAULT_MAX_ROLLOUTS,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        if not teacher.inference_base_url:
            raise ValueError(
                f"teacher {teacher.name!r} has no inference_base_url: give the OpenAI-compatible "
                "endpoint it is served at"
            )
        if max_rollouts < 1:
            raise ValueError(f"max_rollouts must be >= 1, got {max_rollouts}")
        self.teacher = teacher
        self.upstream = teacher.inference_base_url.rstrip("/")
        self.timeout = timeout
        self.max_rollouts = max_rollouts
        self.max_body_bytes = max_body_bytes
        self.app = Starlette(
            routes=[
                Route(f"{prefix}/v1/chat/completions", self._chat, methods=["POST"])
                for prefix in ("", "/rollouts/{rollout_id}")
            ]
            + [
                Route(f"{prefix}/v1/models", self._models, methods=["GET"])
                for prefix in ("", "/rollouts/{rollout_id}")
            ]
        )
        self.server = GatewayServer(None, host=host, port=port, app=self.app)
        self._rollouts: OrderedDict[str, list[LLMCall]] = OrderedDict()
        self._lock = threading.Lock()
        self._client: httpx.AsyncClient | None = None
        self._started = False
        self._model: TrainableModel | None = None

    # ------------------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> TeacherProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Start serving (on its own thread)."""
        if not self._started:
            await asyncio.to_thread(self.server.start)
            self._started = True

    async def close(self) -> None:
        """Stop serving; recorded calls not yet released are dropped."""
        if self._started:
            if self._client is not None:
                await self.server.call(self._client.aclose())
                self._client = None
            await asyncio.to_thread(self.server.stop)
            self._started = False

    @property
    def base_url(self) -> str:
        """The proxy's OpenAI base URL (``.../v1``)."""
        return f"{self.server.base_url}/v1"

    @property
    def model(self) -> TrainableModel:
        """The model to hand to the rollout function: its calls reach the teacher through the
        proxy and are captured as usual. It cannot be trained (``train`` raises)."""
        if not self._started:
            raise RuntimeError("start the TeacherProxy first (`async with TeacherProxy(...)`)")
        if self._model is None:
            model = TrainableModel(
                name=check_name(self.teacher.name, "model name"),
                project=self.teacher.project,
                base_model=f"teacher:{self.teacher.get_inference_name()}",
            )
            model._backend = self  # type: ignore[assignment]
            self._bind(model)
            self._model = model
        return self._model

    def _bind(self, model: Model) -> None:
        model.inference_base_url = self.base_url
        model.inference_api_key = "teacher-proxy"
        model.inference_model_name = self.teacher.get_inference_name()

    # ------------------------------------------------------------------------------ backend
    async def register(self, model: Model) -> None:
        """Point ``model`` at the proxy (what a backend's ``register`` does)."""
        await self.start()
        self._bind(model)

    async def rollout_calls(
        self, model: Model, rollout_id: str, *, release: bool = False
    ) -> list[LLMCall]:
        """The teacher calls recorded for ``rollout_id``; ``release`` forgets them."""
        with self._lock:
            calls = (
                self._rollouts.pop(rollout_id, [])
                if release
                else self._rollouts.get(rollout_id, [])
            )
            return list(calls)

    async def get_step(self, model: Model) -> int:
        """Always 0: the teacher has no checkpoints of ours."""
        return 0

    async def train(self, model: Model, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            "this model is a teacher behind a TeacherProxy: it only serves rollouts; train the "
            "student on its trajectories with student.train_sft(...)"
        )

    train_sft = train

    async def log(self, model: Model, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("a teacher behind a TeacherProxy keeps no history: log on the student")

    async def delete_checkpoints(self, model: Model, *args: Any) -> list[int]:
        raise RuntimeError("a teacher behind a TeacherProxy has no checkpoints")

    # ------------------------------------------------------------------------------ http
    async def _models(self, request: Request) -> Response:
        name = self.teacher.get_inference_name()
        return JSONResponse(
            {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "teacher"}]}
        )

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:  # on the proxy's own loop, where it is used
            headers = {}
            if self.teacher.inference_api_key:
                headers["Authorization"] = f"Bearer {self.teacher.inference_api_key}"
            self._client = httpx.AsyncClient(
                headers=headers,
                timeout=httpx.Timeout(self.timeout, connect=10.0),
                verify=shared_ssl_context(),
            )
        return self._client

    async def _chat(self, request: Request) -> Response:
        try:
            return await self._complete(request)
        except APIError as exc:
            return exc.response()

    async def _complete(self, request: Request) -> Response:
        rollout_id = request.path_params.get("rollout_id")
        payload = await read_json_object(request, self.max_body_bytes)
        chat = parse_chat_request(payload)  # the same 400s as our gateway
        messages = [normalize_message(m.model_dump(exclude_none=True)) for m in chat.messages]
        tools = [t.model_dump(exclude_none=True) for t in chat.tools] if chat.tools else None
        forwarded = {k: v for k, v in payload.items() if k not in _NOT_FORWARDED}
        forwarded["model"] = self.teacher.get_inference_name()
        started = time.time()
        try:
            upstream = await self._http().post(f"{self.upstream}/chat/completions", json=forwarded)
        except httpx.HTTPError as exc:
            raise APIError(
                502, f"the teacher at {self.upstream} did not answer: {exc}", type="server_error"
            ) from None
        if upstream.status_code >= 400:
            try:
                body = upstream.json()
            except ValueError:
                body = None
            if isinstance(body, dict) and "error" in body:
                return JSONResponse(body, status_code=upstream.status_code)
            raise APIError(
                upstream.status_code,
                f"the teacher answered HTTP {upstream.status_code}: {upstream.text[:500]}",
                type="server_error" if upstream.status_code >= 500 else "invalid_request_error",
            )
        try:
            answer = upstream.json()
            choices = answer["choices"]
            if not isinstance(choices, list) or not choices:
                raise ValueError("no choices")
            recorded = [
                LLMCall(
                    rollout_id=rollout_id,
                    choice_index=int(choice.get("index", position)),
                    model=str(forwarded["model"]),
                    messages=messages,
                    tools=tools,
                    request_params={
                        k: v for k, v in forwarded.items() if k not in ("messages", "tools")
                    },
                    prompt_token_ids=[],
                    completion_token_ids=[],
                    logprobs=[],
                    completion_text=str(choice["message"].get("content") or ""),
                    response_message=_answer_message(choice["message"]),
                    finish_reason=str(choice.get("finish_reason") or "stop"),
                    latency_s=time.time() - started,
                    metadata={**(chat.metadata or {}), "teacher": self.teacher.name},
                )
                for position, choice in enumerate(choices)
            ]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise APIError(
                502, f"the teacher's answer is not a chat completion: {exc}", type="server_error"
            ) from None
        if rollout_id is not None:
            self._record(str(rollout_id), recorded)
        answer["model"] = chat.model
        if chat.stream:
            include_usage = bool(chat.stream_options and chat.stream_options.include_usage)
            return StreamingResponse(
                _as_events(answer, include_usage), media_type="text/event-stream"
            )
        return JSONResponse(answer)

    def _record(self, rollout_id: str, calls: list[LLMCall]) -> None:
        with self._lock:
            existing = self._rollouts.setdefault(rollout_id, [])
            index = 1 + max((c.index for c in existing), default=-1)
            existing += [call.model_copy(update={"index": index}) for call in calls]
            self._rollouts.move_to_end(rollout_id)
            while len(self._rollouts) > self.max_rollouts:
                dropped, _ = self._rollouts.popitem(last=False)
                logger.warning(
                    "teacher proxy: more than %d rollouts not released; dropped %s",
                    self.max_rollouts,
                    dropped,
                )


async def _as_events(answer: dict[str, Any], include_usage: bool) -> Any:
    """A finished chat completion as the SSE chunks of a stream that sent it in one piece."""
    head = {k: answer.get(k) for k in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk"
    for choice in answer["choices"]:
        message = choice.get("message") or {}
        delta: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
        if message.get("tool_calls"):
            delta["tool_calls"] = [
                {"index": i, **call} for i, call in enumerate(message["tool_calls"])
            ]
        index = choice.get("index", 0)
        yield sse({**head, "choices": [{"index": index, "delta": delta, "finish_reason": None}]})
        finish = {"index": index, "delta": {}, "finish_reason": choice.get("finish_reason")}
        yield sse({**head, "choices": [finish]})
    if include_usage and answer.get("usage"):
        yield sse({**head, "choices": [], "usage": answer["usage"]})
    yield SSE_DONE


RolloutFn = Callable[[TrainableModel, Scenario], Awaitable[Trajectory]]


async def teacher_trajectories(
    rollout: RolloutFn[Scenario],
    teacher: Model,
    scenarios: Iterable[Scenario],
    *,
    rollouts_per_scenario: int = 1,
    per_group: int = 1,
    min_reward: float | None = None,
    max_exceptions: int | float = 0,
    pbar_desc: str | None = "teacher rollouts",
    proxy_options: Mapping[str, Any] | None = None,
) -> list[Trajectory]:
    """Run ``rollout(model, scenario)`` with ``teacher``; return its best runs as SFT data.

    Each scenario is run ``rollouts_per_scenario`` times (concurrently, as one group); of each
    group the ``per_group`` best runs scoring at least ``min_reward`` are kept
    (``best_trajectories``); a kept run with no finished answer to learn from (every answer
    cut by ``max_tokens``) is dropped, with a warning. The trajectories hold the teacher's calls as text (no token
    ids): ``student.train_sft(...)`` renders them in the student's chat template. Up to
    ``max_exceptions`` rollouts may fail (a count, or a share when < 1; see
    ``gather_trajectory_groups``). ``proxy_options`` go to ``TeacherProxy``.

    Example:
        >>> import art_core as art
        >>> teacher = art.Model(name="qwen-7b", inference_base_url="http://gpu:8000/v1",
        ...                     inference_model_name="Qwen/Qwen2.5-7B-Instruct")
        >>> demos = await art.teacher_trajectories(rollout, teacher, scenarios,
        ...                                        rollouts_per_scenario=4, min_reward=1.0)  # needs a network service: the teacher at that address; `rollout`, `scenarios`  # doctest: +SKIP
        >>> await student.train_sft(demos, config=art.SFTConfig(epochs=3))  # needs a registered model: `student`  # doctest: +SKIP
    """

    if rollouts_per_scenario < 1:
        raise ValueError(f"rollouts_per_scenario must be >= 1, got {rollouts_per_scenario}")
    async with TeacherProxy(teacher, **dict(proxy_options or {})) as proxy:
        model = proxy.model
        groups = await gather_trajectory_groups(
            (
                TrajectoryGroup(rollout(model, scenario) for _ in range(rollouts_per_scenario))
                for scenario in scenarios
            ),
            pbar_desc=pbar_desc,
            max_exceptions=max_exceptions,
        )
    kept = []
    for trajectory in best_trajectories(groups, per_group=per_group, min_reward=min_reward):
        try:
            check_demonstration(Demonstration(f"teacher run {trajectory.id}", trajectory))
        except ValueError as exc:
            logger.warning("dropped a teacher run that cannot be learned from: %s", exc)
            continue
        trajectory.metadata.setdefault("teacher", teacher.get_inference_name())
        kept.append(trajectory)
    return kept
