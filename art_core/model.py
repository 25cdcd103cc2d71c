"""``Model`` (any OpenAI-compatible model, e.g. a judge) and ``TrainableModel`` (ours).

Both keep OpenPipe ART's names and call shapes: ``model.backend()`` is a method,
``config`` is any JSON-serializable value (a user's pydantic model in ART's examples, or a
dict) and ``TrainableModel[MyConfig]`` works as a type. A model talks to its backend only
through the public ``art_core.backends.base.Backend`` protocol.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic

from pydantic import BaseModel, ConfigDict, PrivateAttr, field_validator
from typing_extensions import TypeVar

from art_core.clients import SharedOpenAIClient, async_openai_client
from art_core.names import check_name
from art_core.trajectories import Trajectory, TrajectoryGroup

if TYPE_CHECKING:
    from openai import AsyncOpenAI

    from art_core.backends.base import Backend
    from art_core.export import ExportFormat, ExportResult
    from art_core.sft.data import SFTData
    from art_core.training.config import SFTConfig, TrainConfig, TrainResult

# The type of ``config`` (ART: the user's pydantic model); unparametrized, anything JSON.
ModelConfig = TypeVar("ModelConfig", default=Any)

# ART's ``_config`` (its ``dev.TrainConfig``) keys that mean the same here, by TrainConfig
# field; the rest tune ART's own GPU pipeline and have nothing to act on here.
_DEV_TRAIN_FIELDS = {
    "epsilon": "epsilon",
    "epsilon_high": "epsilon_high",
    "scale_rewards": "scale_rewards",
    # ART's "token" and "sequence" (GSPO); its "average"/"geometric_average" are refused by
    # TrainConfig's validation, naming the two levels there are.
    "importance_sampling_level": "importance_sampling_level",
}


def _plain_config(config: Any) -> Any:
    """A model's ``config`` as JSON data (pydantic models are dumped), for saving it."""
    return config.model_dump(mode="json") if isinstance(config, BaseModel) else config


class Model(BaseModel, Generic[ModelConfig]):
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
    config: ModelConfig | None = None
    inference_base_url: str | None = None
    inference_api_key: str | None = None
    inference_model_name: str | None = None

    _backend: Backend | None = PrivateAttr(default=None)
    _shared_client: SharedOpenAIClient = PrivateAttr(default_factory=SharedOpenAIClient)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_name(value, "model name")

    @field_validator("project")
    @classmethod
    def _project(cls, value: str) -> str:
        return check_name(value, "project name")

    @property
    def trainable(self) -> bool:
        return False

    def backend(self) -> Backend:
        """The backend this model is registered with (``register`` first)."""
        if self._backend is None:
            raise RuntimeError(
                f"model {self.name!r} is not registered: `await model.register(backend)`"
            )
        return self._backend

    def config_json(self) -> Any:
        """``config`` as JSON data (a pydantic config is dumped); ``ValueError`` when it
        cannot be serialized."""
        try:
            plain = _plain_config(self.config)
            json.dumps(plain, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"model {self.name!r}: config is not JSON-serializable: {exc}"
            ) from None
        return plain

    def get_inference_name(self, step: int | None = None) -> str:
        """The model name to put in chat-completion requests; ``step`` names one adapter
        (``NAME@STEP``, as the gateway serves it)."""
        name = self.inference_model_name or self.name
        return name if step is None else f"{name}@{step}"

    def openai_client(self, **kwargs: Any) -> AsyncOpenAI:
        """An ``openai.AsyncOpenAI`` client for this model's inference endpoint.

        Without arguments, the same client on every call in one event loop, as OpenPipe
        ART's (``SharedOpenAIClient``: rollouts that each ask for it share its connections,
        so close it only when none uses it: ``close_openai_client``); with constructor
        arguments (``timeout=``, ``max_retries=``, ...), a new client of the caller's own, to
        close when done.

        Example:
            >>> judge = Model(name="judge", inference_base_url="http://127.0.0.1:8000/v1")
            >>> judge.openai_client() is judge.openai_client()
            True
            >>> judge.openai_client(max_retries=0) is judge.openai_client()
            False
        """

        if self.inference_base_url is None:
            raise RuntimeError(f"model {self.name!r} has no inference_base_url (register it first)")
        api_key = self.inference_api_key or "art"
        if kwargs:
            return async_openai_client(self.inference_base_url, api_key, **kwargs)
        return self._shared_client.get(self.inference_base_url, api_key)

    async def close_openai_client(self) -> None:
        """Close the client ``openai_client()`` shares (its connections); the next call makes
        a new one. Backends call it for their models when they close.

        Example:
            >>> judge = Model(name="judge", inference_base_url="http://127.0.0.1:8000/v1")
            >>> client = judge.openai_client()
            >>> import asyncio
            >>> asyncio.run(judge.close_openai_client())
            >>> client.is_closed(), judge.openai_client() is client
            (True, False)
        """
        await self._shared_client.aclose()

    async def register(self, backend: Backend) -> None:
        """Register with ``backend`` (for a trainable model: load and serve it)."""
        self.config_json()
        await backend.register(self)  # type: ignore[arg-type]
        self._backend = backend

    async def log(
        self,
        trajectories: Iterable[Trajectory | BaseException | TrajectoryGroup] | None = None,
        split: str = "val",
        *,
        metrics: Mapping[str, float] | None = None,
        step: int | None = None,
    ) -> None:
        """Save trajectories (e.g. a validation pass) and metrics to the model's history.

        ``trajectories`` may be groups, or trajectories (and exceptions) forming one group.

        Example:
            >>> await model.log(val_groups)                                   # needs a registered model: `model`, `val_groups`  # doctest: +SKIP
            >>> await model.log(metrics=result.metrics, step=result.step)     # needs a registered model  # doctest: +SKIP
        """
        groups: list[TrajectoryGroup] | None = None
        if trajectories is not None:
            items = list(trajectories)
            if all(isinstance(item, TrajectoryGroup) for item in items):
                groups = [item for item in items if isinstance(item, TrajectoryGroup)]
            elif any(isinstance(item, TrajectoryGroup) for item in items):
                raise TypeError("log() takes trajectory groups or trajectories, not a mix")
            else:
                groups = [TrajectoryGroup(items)]
        split = check_name(split, "split")
        # A plain Model logs through the backend of a trainable one too (ART's comparisons).
        model: Any = self
        await self.backend().log(model, groups, split=split, metrics=metrics, step=step)


class TrainableModel(Model[ModelConfig], Generic[ModelConfig]):
    """A LoRA-trainable model served by a backend.

    Example:
        >>> model = TrainableModel(name="agent-001", project="demo", base_model="tiny-random")
        >>> await model.register(LocalBackend())  # needs a registered model: a backend starts an engine and a gateway  # doctest: +SKIP
        >>> await model.train(groups)  # needs a registered model: `groups` made with it  # doctest: +SKIP
    """

    base_model: str
    # ART's unstable engine/trainer knobs (``art.dev.InternalModelConfig``); kept so ART
    # code that sets it runs, applied where a knob means something here.
    _internal_config: dict[str, Any] | None = PrivateAttr(default=None)

    def __init__(self, *, _internal_config: Mapping[str, Any] | None = None, **data: Any) -> None:
        super().__init__(**data)
        if _internal_config is not None:
            self._internal_config = dict(_internal_config)

    @property
    def trainable(self) -> bool:
        return True

    async def register(self, backend: Backend) -> None:
        """Load the model in ``backend`` (resuming from its latest checkpoint) and serve it."""
        await super().register(backend)

    async def train(
        self,
        trajectory_groups: Iterable[TrajectoryGroup],
        config: TrainConfig | None = None,
        _config: Mapping[str, Any] | None = None,
        verbose: bool = False,
    ) -> TrainResult:
        """One GRPO step on ``trajectory_groups``; the new adapter is served when this returns.

        ``_config`` takes ART's unstable ``dev.TrainConfig`` keys; those that mean the same
        here (``epsilon``, ``epsilon_high``, ``scale_rewards``, ``importance_sampling_level``)
        override ``config``, the rest
        tune ART's GPU pipeline and are ignored with a warning.
        """
        overrides: dict[str, Any] = {}
        ignored = []
        for key, value in (_config or {}).items():
            if key in _DEV_TRAIN_FIELDS:
                overrides[_DEV_TRAIN_FIELDS[key]] = value
            else:
                ignored.append(key)
        if ignored:
            warnings.warn(
                f"train(_config=...): {', '.join(sorted(ignored))} tune ART's own GPU pipeline "
                "and have no effect here",
                stacklevel=2,
            )
        return await self.backend().train(self, list(trajectory_groups), config, **overrides)

    async def train_sft(
        self,
        trajectories: SFTData,
        config: SFTConfig | None = None,
        _config: Mapping[str, Any] | None = None,
        verbose: bool = False,
    ) -> TrainResult:
        """Supervised fine-tuning (a warm start) on demonstrations; served when this returns.

        ``trajectories``: a path to a JSONL file (OpenAI chat records, trajectories or groups),
        or an iterable of trajectories (recorded ones train token-exactly, ART-style ones are
        rendered with the chat template), groups and chat records; see ``art_core.sft``.
        Writes the next checkpoint on the same adapter as ``train``, so SFT and GRPO steps
        can follow each other. ``_config`` takes ART's unstable ``dev.TrainSFTConfig``,
        which tunes ART's own pipeline and has no effect here.

        Example:
            >>> await model.train_sft("demos.jsonl", config=art.SFTConfig(epochs=3))  # needs a registered model: and `demos.jsonl`  # doctest: +SKIP
            >>> await model.train_sft(art.best_trajectories(groups, min_reward=1.0))  # needs a registered model  # doctest: +SKIP
        """
        if _config:
            warnings.warn(
                f"train_sft(_config=...): {', '.join(sorted(_config))} tune ART's own pipeline "
                "and have no effect here",
                stacklevel=2,
            )
        return await self.backend().train_sft(self, trajectories, config)

    async def get_step(self) -> int:
        """The step of the latest checkpoint (0 = the base model)."""
        return await self.backend().get_step(self)

    async def delete_checkpoints(self, best_checkpoint_metric: str = "val/reward") -> list[int]:
        """Delete all checkpoints but the latest and the best by ``best_checkpoint_metric``."""
        return await self.backend().delete_checkpoints(self, best_checkpoint_metric)

    async def export(
        self,
        out: str | Path,
        *,
        format: ExportFormat = "peft",
        step: int | None = None,
        best: str | None = None,
        higher_is_better: bool | None = None,
        overwrite: bool = False,
        gguf_type: str = "f16",
    ) -> ExportResult:
        """Export a checkpoint to the folder ``out``: ``format="peft"`` (the LoRA adapter),
        ``"merged"`` (base + adapter, a plain Hugging Face model) or ``"gguf"``. The
        checkpoint is ``step``, else the best by the history metric ``best``, else the
        latest; ``out`` must not exist unless ``overwrite``. Writes ``out/export.json``.

        Example:
            >>> result = await model.export("exports/agent", format="merged",
            ...                              best="val/reward")  # needs a registered model, trained  # doctest: +SKIP
            >>> result.step  # needs a registered model  # doctest: +SKIP
            3
        """
        return await self.backend().export(
            self,
            out,
            format=format,
            step=step,
            best=best,
            higher_is_better=higher_is_better,
            overwrite=overwrite,
            gguf_type=gguf_type,
        )
