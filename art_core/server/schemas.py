"""Request bodies of the backend API, validated with pydantic (never unpickled, never run).

Trajectories arrive as JSON and are validated field by field into ``TrajectoryGroup``; on
top of their own schema, every recorded call's token ids must lie in the model's vocabulary
and carry one logprob per completion token, so a malformed request is a 422 naming the
field rather than a failure deep inside the trainer.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from art_core.chat_formats import CHAT_FORMAT_KEYS, chat_format_settings
from art_core.names import check_name
from art_core.server.jobs import JOB_ID
from art_core.training.config import SFTConfig, TrainConfig
from art_core.trajectories import RolloutException, Trajectory, TrajectoryGroup


class FieldError(ValueError):
    """A semantic error in a valid-looking request; ``field`` is its dotted path."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class GroupPayload(BaseModel):
    """A ``TrajectoryGroup`` as JSON, validated field by field.

    ``TrajectoryGroup`` has its own ``__init__`` (it also takes awaitables), which pydantic
    calls for nested data before validating it: a wrong type there raises ``TypeError``
    instead of a ``ValidationError``. This mirror validates first, then builds the group.
    """

    model_config = ConfigDict(extra="forbid")

    trajectories: list[Trajectory] = Field(default_factory=list)
    exceptions: list[RolloutException] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    metrics: dict[str, float | int | bool] = Field(default_factory=dict)
    logs: list[str] = Field(default_factory=list)

    def to_group(self) -> TrajectoryGroup:
        return TrajectoryGroup(
            self.trajectories,
            exceptions=self.exceptions,
            metadata=self.metadata,
            metrics=self.metrics,
            logs=self.logs,
        )


def to_groups(payloads: list[GroupPayload]) -> list[TrajectoryGroup]:
    """The validated payloads as ``TrajectoryGroup`` objects."""
    return [payload.to_group() for payload in payloads]


class RegisterRequest(BaseModel):
    """``POST /api/models/register``."""

    model_config = ConfigDict(extra="forbid")

    name: str
    project: str = "default"
    base_model: str = Field(min_length=1, max_length=4096)
    config: dict[str, Any] = Field(default_factory=dict)
    # How the model's answers are read (see art_core.chat_formats); detected when absent.
    tool_call_parser: str | None = Field(default=None, max_length=64)
    reasoning_parser: str | None = Field(default=None, max_length=64)

    @model_validator(mode="after")
    def _chat_format(self) -> RegisterRequest:
        chat_format_settings(self.chat_format())
        return self

    def chat_format(self) -> dict[str, str]:
        """The chat-format choices, as a model's ``_internal_config`` carries them."""
        return {key: value for key in CHAT_FORMAT_KEYS if (value := getattr(self, key)) is not None}

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_name(value, "model name")

    @field_validator("project")
    @classmethod
    def _project(cls, value: str) -> str:
        return check_name(value, "project name")


class TrainRequest(BaseModel):
    """``POST /api/models/{project}/{name}/train``: the groups, the config, a job id.

    ``job_id`` is chosen by the client so that a retried request after a dropped connection
    attaches to the same job instead of training twice.
    """

    model_config = ConfigDict(extra="forbid")

    job_id: str | None = Field(default=None, pattern=JOB_ID.pattern)
    groups: list[GroupPayload] = Field(min_length=1)
    config: TrainConfig = Field(default_factory=TrainConfig)
    # Pipelined training: the model keeps serving while the step trains.
    serve_while_training: bool = False


# The most records one ``train_sft`` request may carry (the body limit bounds their size).
MAX_SFT_RECORDS = 100_000


class TrainSFTRequest(BaseModel):
    """``POST /api/models/{project}/{name}/train_sft``: demonstrations, their labels, the config.

    ``labels`` (one per trajectory, e.g. ``chat.jsonl:7``) are what errors name; the client
    sends the names its user knows. ``job_id`` as for ``TrainRequest``.
    """

    model_config = ConfigDict(extra="forbid")

    job_id: str | None = Field(default=None, pattern=JOB_ID.pattern)
    trajectories: list[Trajectory] = Field(min_length=1, max_length=MAX_SFT_RECORDS)
    labels: list[str] | None = None
    config: SFTConfig = Field(default_factory=SFTConfig)

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and any(len(label) > 1024 for label in value):
            raise ValueError("labels are at most 1024 characters")
        return value


class LogRequest(BaseModel):
    """``POST /api/models/{project}/{name}/log``."""

    model_config = ConfigDict(extra="forbid")

    groups: list[GroupPayload] = Field(default_factory=list)
    split: str = "val"
    metrics: dict[str, float | None] | None = Field(default=None, max_length=1024)
    step: int | None = Field(default=None, ge=0, le=10**9)

    @field_validator("split")
    @classmethod
    def _split(cls, value: str) -> str:
        return check_name(value, "split")


class ExportRequest(BaseModel):
    """``POST /api/models/{project}/{name}/export``: which checkpoint, in which format."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["peft", "merged", "gguf"] = "peft"
    step: int | None = Field(default=None, ge=1, le=10**9)
    best: str | None = Field(default=None, min_length=1, max_length=256)
    higher_is_better: bool | None = None
    gguf_type: str = Field(default="f16", min_length=1, max_length=16)


class DeleteCheckpointsRequest(BaseModel):
    """``POST /api/models/{project}/{name}/delete_checkpoints``."""

    model_config = ConfigDict(extra="forbid")

    best_checkpoint_metric: str = Field(default="val/reward", min_length=1, max_length=256)


def check_calls(groups: list[TrajectoryGroup], vocab_size: int) -> None:
    """Raise ``FieldError`` for token ids outside ``[0, vocab_size)`` or misaligned logprobs.

    Example:
        >>> check_calls([], vocab_size=100)
    """
    for g, group in enumerate(groups):
        for t, trajectory in enumerate(group.trajectories):
            for c, call in enumerate(trajectory.calls):
                where = f"groups.{g}.trajectories.{t}.calls.{c}"
                for name in ("prompt_token_ids", "completion_token_ids"):
                    ids: list[int] = getattr(call, name)
                    bad = next((i for i, tok in enumerate(ids) if not 0 <= tok < vocab_size), None)
                    if bad is not None:
                        raise FieldError(
                            f"{where}.{name}.{bad}",
                            f"token id {ids[bad]} is outside the model's vocabulary [0, {vocab_size})",
                        )
                if not call.prompt_token_ids:
                    raise FieldError(f"{where}.prompt_token_ids", "must not be empty")
                if len(call.logprobs) != len(call.completion_token_ids):
                    raise FieldError(
                        f"{where}.logprobs",
                        f"has {len(call.logprobs)} values for "
                        f"{len(call.completion_token_ids)} completion tokens",
                    )
                bad = next(
                    (i for i, lp in enumerate(call.logprobs) if not math.isfinite(lp) or lp > 1e-4),
                    None,
                )
                if bad is not None:
                    raise FieldError(f"{where}.logprobs.{bad}", "logprobs must be finite and <= 0")
