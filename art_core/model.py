"""``Model`` (any OpenAI-compatible model, e.g. a judge) and ``TrainableModel`` (ours)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from art_core.trajectories import Trajectory, TrajectoryGroup

if TYPE_CHECKING:
    from openai import AsyncOpenAI

    from art_core.training.config import TrainConfig, TrainResult

# Names become folder names under the art path: no separators, no "..", no hidden files.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_name(value: str, what: str) -> str:
    if not NAME_PATTERN.match(value) or ".." in value:
        raise ValueError(
            f"{what} {value!r} must be 1-128 letters, digits, '.', '_' or '-', start with a "
            "letter or digit, and not contain '..'"
        )
    return value


class Backend(Protocol):
    """What a model needs from the backend it is registered with."""

    async def register(self, model: TrainableModel) -> None: ...
    async def _train(
        self, model: TrainableModel, groups: list[TrajectoryGroup], config: TrainConfig
    ) -> TrainResult: ...
    async def _get_step(self, model: TrainableModel) -> int: ...
    async def _log(
        self, model: TrainableModel, groups: list[TrajectoryGroup], split: str
    ) -> None: ...
    async def _delete_checkpoints(
        self, model: TrainableModel, best_checkpoint_metric: str
    ) -> list[int]: ...
    async def _rollout_calls(
        self, model: TrainableModel, rollout_id: str, *, release: bool
    ) -> list[Any]: ...


class Model(BaseModel):
    """A model reachable over the OpenAI API (a hosted judge, a vLLM server, ...).

    Example:
        >>> judge = Model(name="judge", inference_base_url="http://localhost:8000/v1",
        ...               inference_model_name="Qwen/Qwen3-8B")
        >>> judge.get_inference_name()
        'Qwen/Qwen3-8B'
    """

    model_config = ConfigDict(extra="forbid")

    name: str
    project: str = "default"
    inference_base_url: str | None = None
    inference_api_key: str | None = None
    inference_model_name: str | None = None
    trainable: bool = False
    config: dict[str, Any] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_name(value, "model name")

    @field_validator("project")
    @classmethod
    def _project(cls, value: str) -> str:
        return check_name(value, "project name")

    def get_inference_name(self) -> str:
        """The model name to put in chat-completion requests."""
        return self.inference_model_name or self.name

    def openai_client(self, **kwargs: Any) -> AsyncOpenAI:
        """An ``openai.AsyncOpenAI`` client for this model's inference endpoint."""
        from art_core.clients import async_openai_client

        if self.inference_base_url is None:
            raise RuntimeError(f"model {self.name!r} has no inference_base_url (register it first)")
        return async_openai_client(
            self.inference_base_url, self.inference_api_key or "art", **kwargs
        )


class TrainableModel(Model):
    """A LoRA-trainable model served by a backend.

    Example:
        >>> model = TrainableModel(name="agent-001", project="demo", base_model="tiny-random")
        >>> await model.register(LocalBackend())  # doctest: +SKIP
        >>> await model.train(groups)  # doctest: +SKIP
    """

    base_model: str
    trainable: bool = True
    _backend: Backend | None = PrivateAttr(default=None)

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            raise RuntimeError(
                f"model {self.name!r} is not registered: `await model.register(backend)`"
            )
        return self._backend

    async def register(self, backend: Backend) -> None:
        """Load the model in ``backend`` (resuming from its latest checkpoint) and serve it."""
        await backend.register(self)
        self._backend = backend

    async def train(
        self, groups: Iterable[TrajectoryGroup], config: TrainConfig | None = None
    ) -> TrainResult:
        """One GRPO step on ``groups``; the new adapter is served when this returns."""
        from art_core.training.config import TrainConfig

        return await self.backend._train(self, list(groups), config or TrainConfig())

    async def get_step(self) -> int:
        """The step of the latest checkpoint (0 = the base model)."""
        return await self.backend._get_step(self)

    async def log(
        self, trajectories: Iterable[Trajectory | TrajectoryGroup], split: str = "val"
    ) -> None:
        """Save trajectories (e.g. a validation pass) and their mean reward to the history."""
        items = list(trajectories)
        groups = [g if isinstance(g, TrajectoryGroup) else TrajectoryGroup([g]) for g in items]
        await self.backend._log(self, groups, check_name(split, "split"))

    async def delete_checkpoints(self, best_checkpoint_metric: str = "val/reward") -> list[int]:
        """Delete all checkpoints but the latest and the best by ``best_checkpoint_metric``."""
        return await self.backend._delete_checkpoints(self, best_checkpoint_metric)
