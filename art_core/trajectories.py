"""The data model of a rollout: recorded LLM calls, trajectories and groups of them.

Everything here round-trips through JSON (``model_dump_json`` / ``model_validate_json``):
trajectories are saved as JSONL, sent over HTTP and loaded back without pickle.
"""

from __future__ import annotations

import asyncio
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterable
from contextlib import asynccontextmanager
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    field_validator,
)

from art_core.messages import MessageList, is_choice, message_of, plain_message

JSONScalar = float | int | bool | str | None

# Rewards closer than this are "equal": float noise must not create a training signal.
EQUAL_REWARDS_TOLERANCE = 1e-9


def rewards_differ(rewards: Iterable[float]) -> bool:
    """Whether GRPO can learn from these rewards of one group: two or more, not all equal.

    Example:
        >>> rewards_differ([0.0, 1.0, 0.0]), rewards_differ([1.0, 1.0]), rewards_differ([1.0])
        (True, False, False)
    """
    values = list(rewards)
    return len(values) >= 2 and max(values) - min(values) > EQUAL_REWARDS_TOLERANCE


def new_id(prefix: str) -> str:
    """A random, URL-safe id such as ``rollout_3f9c...``."""
    return f"{prefix}_{uuid.uuid4().hex}"


class LLMCall(BaseModel):
    """One chat completion served by the gateway, recorded token-exactly.

    ``prompt_token_ids`` are the ids the engine actually ran, ``completion_token_ids`` the ids it
    sampled (including the end-of-turn token when the model stopped by itself), and ``logprobs``
    the sampler's log-probability of each sampled id under the model at temperature 1, before
    any grammar mask. The trainer uses these ids directly and never re-tokenizes text.

    Example:
        >>> call = LLMCall(model="m", messages=[{"role": "user", "content": "hi"}],
        ...                prompt_token_ids=[1, 2], completion_token_ids=[3], logprobs=[-0.1])
        >>> call.num_completion_tokens
        1
    """

    model_config = ConfigDict(extra="forbid")

    id: str = Field(default_factory=lambda: new_id("call"))
    rollout_id: str | None = None
    index: int = 0
    choice_index: int = 0
    model: str
    adapter_step: int = 0
    # The replica that served it, when the model is served by several (``replicas=N``).
    replica: int | None = None
    # The wire API the call came through: "chat.completions", "responses" (OpenAI
    # Responses), "messages" (Anthropic Messages) or "completions". Whatever it was, the
    # call is recorded in one shape: chat messages and tools, prompt and sampled ids.
    api: str = "chat.completions"
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    request_params: dict[str, Any] = Field(default_factory=dict)
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    logprobs: list[float]
    completion_text: str = ""
    response_message: dict[str, Any] = Field(
        default_factory=lambda: {"role": "assistant", "content": ""}
    )
    finish_reason: str = "stop"
    created_at: float = Field(default_factory=time.time)
    latency_s: float = 0.0
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_completion_tokens(self) -> int:
        return len(self.completion_token_ids)

    def conversation(self) -> list[dict[str, Any]]:
        """The request messages followed by the assistant message this call returned."""
        return [*self.messages, self.response_message]


def _plain_items(value: Any) -> list[dict[str, Any]]:
    """``messages_and_choices`` as JSON dicts (openai ``Choice`` objects dumped)."""
    if value is None:
        return []
    if isinstance(value, str | bytes | dict) or not isinstance(value, Iterable):
        raise ValueError(
            f"messages_and_choices must be a list of messages and choices, got {type(value).__name__}"
        )
    try:
        return [plain_message(item) for item in value]
    except TypeError as exc:  # a ValueError becomes a validation error naming the field
        raise ValueError(str(exc)) from None


# Plain JSON dicts, kept so by ``MessageList`` however the list is changed afterwards.
PlainMessagesAndChoices = Annotated[
    list[dict[str, Any]], BeforeValidator(_plain_items), AfterValidator(MessageList)
]


class History(BaseModel):
    """A further conversation of a rollout (ART's ``additional_histories``): a sub-agent's
    calls, or the turns after the agent compacted its context. Its choices are trained on
    with the trajectory's reward, as their own sequences.

    Example:
        >>> History(messages_and_choices=[{"role": "user", "content": "Summarize."}]).messages()
        [{'role': 'user', 'content': 'Summarize.'}]
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    messages_and_choices: PlainMessagesAndChoices = Field(default_factory=MessageList)
    tools: list[dict[str, Any]] | None = None

    def messages(self) -> list[dict[str, Any]]:
        """The OpenAI messages: each choice turned into its assistant message."""
        return [_chat_message(item) for item in self.messages_and_choices]

    def choices(self) -> list[dict[str, Any]]:
        """The choices (the items trained on), in order."""
        return [item for item in self.messages_and_choices if is_choice(item)]


def _chat_message(item: dict[str, Any]) -> dict[str, Any]:
    if not is_choice(item):
        return item
    # A choice's message as the next request takes it (ART's shape): unset fields left out.
    message = message_of(item)
    return {key: value for key, value in message.items() if value is not None or key == "content"}


class Trajectory(BaseModel):
    """One rollout: the LLM calls it made, its reward, metrics, metadata and logs.

    Built by ``art_core.capture`` from the gateway's record, or by hand ART-style from
    ``messages_and_choices``: the ``Choice`` objects the gateway returned (appended, inserted,
    assigned or passed to the constructor, as objects or dicts) are stored as JSON and matched
    to their recorded calls before training.

    Example:
        >>> t = Trajectory(messages_and_choices=[{"role": "user", "content": "2+2?"}], reward=1.0)
        >>> t.messages_and_choices.append(
        ...     {"index": 0, "message": {"role": "assistant", "content": "4"}, "finish_reason": "stop"})
        >>> t.messages()[-1]
        {'role': 'assistant', 'content': '4'}
        >>> Trajectory.model_validate_json(t.model_dump_json()).reward
        1.0
    """

    # validate_assignment: `trajectory.messages_and_choices = [...]` is converted like the
    # constructor's argument (and `trajectory.reward = nan` is refused).
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    id: str = Field(default_factory=lambda: new_id("rollout"))
    calls: list[LLMCall] = Field(default_factory=list)
    messages_and_choices: PlainMessagesAndChoices = Field(default_factory=MessageList)
    tools: list[dict[str, Any]] | None = None
    additional_histories: list[History] = Field(default_factory=list)
    reward: float = 0.0
    metrics: dict[str, float | int | bool] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)
    logs: list[str] = Field(default_factory=list)
    start_time: float = Field(default_factory=time.time)
    end_time: float | None = None

    @field_validator("reward")
    @classmethod
    def _finite_reward(cls, value: float) -> float:
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError("reward must be a finite number")
        return value

    def messages(self) -> list[dict[str, Any]]:
        """The OpenAI-messages view of the rollout's main conversation.

        For captured rollouts this is the conversation of the latest call (its request messages
        plus the answer); ART-style trajectories have their choices turned into messages.
        """
        if self.messages_and_choices:
            return [_chat_message(item) for item in self.messages_and_choices]
        if not self.calls:
            return []
        return self.calls[-1].conversation()

    def choices(self) -> list[dict[str, Any]]:
        """The ART-style choices of a hand-built trajectory, in order."""
        return [item for item in self.messages_and_choices if is_choice(item)]

    def log(self, message: str) -> None:
        self.logs.append(message)

    def finish(self) -> Trajectory:
        """Mark the rollout finished: ``end_time`` and ``metrics["duration"]`` (seconds).

        Example:
            >>> Trajectory().finish().metrics["duration"] >= 0
            True
        """
        self.end_time = time.time()
        self.metrics["duration"] = self.end_time - self.start_time
        return self

    @asynccontextmanager
    async def track_duration(self, metric_name: str) -> AsyncIterator[None]:
        """Add the time spent inside the block to ``metrics[f"{metric_name}_duration"]``.

        Example:
            >>> trajectory = Trajectory(messages_and_choices=[])
            >>> async with trajectory.track_duration("tool"):
            ...     result = await asyncio.sleep(0.01)  # the tool call
            >>> "tool_duration" in trajectory.metrics
            True
        """
        started = time.monotonic()
        try:
            yield
        finally:
            key = f"{metric_name}_duration"
            self.metrics[key] = float(self.metrics.get(key, 0.0)) + time.monotonic() - started

    @property
    def num_completion_tokens(self) -> int:
        """Tokens sampled: by the recorded calls, or, for an ART-style trajectory whose calls
        are not attached yet, by its choices (their ``token_ids``)."""
        if self.calls:
            return sum(call.num_completion_tokens for call in self.calls)
        choices = [*self.choices(), *(c for h in self.additional_histories for c in h.choices())]
        return sum(len(choice.get("token_ids") or ()) for choice in choices)


class RolloutException(BaseModel):
    """A rollout that raised, kept as text so a group stays JSON-serializable."""

    type: str
    message: str
    traceback: str = ""

    @classmethod
    def from_exception(cls, exc: BaseException) -> RolloutException:
        return cls(
            type=type(exc).__name__,
            message=str(exc),
            traceback="".join(traceback.format_exception(exc)),
        )


class TrajectoryGroup(BaseModel):
    """The rollouts of one scenario; GRPO compares rewards within a group.

    Accepts trajectories, awaitables of trajectories (rollouts still to run) and exceptions.
    Awaiting the group runs its pending rollouts concurrently; a rollout that raises is kept in
    ``exceptions`` rather than failing the group.

    Example:
        >>> group = TrajectoryGroup([Trajectory(reward=1.0), Trajectory(reward=0.0)])
        >>> [t.reward for t in group]
        [1.0, 0.0]
    """

    model_config = ConfigDict(extra="forbid")

    trajectories: list[Trajectory] = Field(default_factory=list)
    exceptions: list[RolloutException] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    metrics: dict[str, float | int | bool] = Field(default_factory=dict)
    logs: list[str] = Field(default_factory=list)

    _pending: list[Awaitable[Trajectory]] = PrivateAttr(default_factory=list)

    def __init__(
        self,
        trajectories: Iterable[Trajectory | Awaitable[Trajectory] | BaseException] = (),
        *,
        exceptions: Iterable[RolloutException | BaseException] = (),
        **data: Any,
    ) -> None:
        done: list[Any] = []
        pending: list[Awaitable[Trajectory]] = []
        errors: list[RolloutException] = []
        if isinstance(trajectories, str | bytes | dict) or not isinstance(trajectories, Iterable):
            # pydantic calls this __init__ for nested data too: a ValueError becomes a clean
            # validation error naming the field, where a TypeError would escape as a crash.
            raise ValueError("trajectories must be a list of trajectories")
        for item in trajectories:
            if isinstance(item, BaseException):
                errors.append(RolloutException.from_exception(item))
            elif isinstance(item, Trajectory | dict):
                done.append(item)
            elif hasattr(item, "__await__"):
                pending.append(item)
            else:
                raise ValueError(
                    "a TrajectoryGroup holds Trajectory objects or awaitables of them, "
                    f"got {type(item).__name__}"
                )
        for exc in exceptions:
            errors.append(
                exc if isinstance(exc, RolloutException) else RolloutException.from_exception(exc)
            )
        super().__init__(trajectories=done, exceptions=errors, **data)
        self._pending = pending

    def __iter__(self):
        return iter(self.trajectories)

    def __len__(self) -> int:
        return len(self.trajectories)

    @property
    def pending(self) -> int:
        """How many rollouts have not run yet."""
        return len(self._pending)

    @property
    def has_signal(self) -> bool:
        """Whether GRPO learns anything from this group: its rewards are not all equal.

        Example:
            >>> TrajectoryGroup([Trajectory(reward=1.0), Trajectory(reward=0.0)]).has_signal
            True
        """
        return rewards_differ(t.reward for t in self.trajectories)

    def cancel_pending(self) -> int:
        """Drop the rollouts that have not run (coroutines closed, tasks cancelled); how many.

        For a group that will never be awaited, e.g. one a sampling budget left out.
        """
        pending, self._pending = self._pending, []
        for awaitable in pending:
            close = getattr(awaitable, "close", None) or getattr(awaitable, "cancel", None)
            if close is not None:
                close()
        return len(pending)

    async def run(self) -> TrajectoryGroup:
        """Run the pending rollouts concurrently; exceptions are recorded, not raised."""
        pending, self._pending = self._pending, []
        results = await asyncio.gather(*pending, return_exceptions=True)
        for result in results:
            if isinstance(result, Trajectory):
                self.trajectories.append(result)
            elif isinstance(result, BaseException):
                if isinstance(result, asyncio.CancelledError | KeyboardInterrupt):
                    raise result
                self.exceptions.append(RolloutException.from_exception(result))
            else:
                self.exceptions.append(
                    RolloutException(
                        type="TypeError",
                        message=f"a rollout returned {type(result).__name__}, not a Trajectory",
                    )
                )
        return self

    def __await__(self):
        return self.run().__await__()


def require_finished(groups: Iterable[TrajectoryGroup]) -> None:
    """Raise ``ValueError`` when a group still has rollouts that have not run.

    Training, logging and judging need finished groups; a group built from coroutines must
    be awaited first (or gathered with ``gather_trajectory_groups``).

    Example:
        >>> require_finished([TrajectoryGroup([Trajectory(reward=1.0)])])
    """
    for index, group in enumerate(groups):
        if not isinstance(group, TrajectoryGroup):
            raise TypeError(f"groups[{index}] is a {type(group).__name__}, not a TrajectoryGroup")
        if group.pending:
            raise ValueError(
                f"groups[{index}] still has {group.pending} pending rollouts that have not run: "
                "await the group (or use gather_trajectory_groups) first"
            )
