"""The backend contract: what a ``TrainableModel`` (and the HTTP service) asks of a backend.

``Backend`` is the public protocol. ``LocalBackend`` (engines and trainer on this machine) and
``RemoteBackend`` (the same calls over HTTP to ``art-core serve``) implement it, and so can a
user's own backend. ``BackendBase`` gives an implementation the parts every backend shares:
ART's keyword style for training settings (``backend.train(model, groups,
learning_rate=1e-5)``) and the private spellings ART's ``TrainableModel`` used
(``_train``, ``_get_step``, ``_log``, ...), kept as thin shims for code written against them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from art_core.dev.apply import internal_overrides
from art_core.trajectories import LLMCall, TrajectoryGroup

if TYPE_CHECKING:
    from art_core.export import ExportFormat, ExportResult
    from art_core.model import TrainableModel
    from art_core.sft.data import SFTData
    from art_core.training.config import SFTConfig, TrainConfig, TrainingSettings, TrainResult

# Called with each JSON-serializable progress record of a training step (micro-batches,
# optimizer steps), in whatever thread produces it: it must be quick and thread-safe.
ProgressCallback = Callable[[dict[str, Any]], None]


@runtime_checkable
class Backend(Protocol):
    """Where a model is served and trained.

    Every method takes the model it acts on; a model is usable once ``register`` returned.
    Errors: ``ValueError`` for a request that is wrong in itself (bad groups, a config that
    contradicts the model's adapter, an unknown model), ``RuntimeError`` for a backend that
    cannot do it now (closed, the model not registered); remote backends raise subclasses of
    both (``art_core.backends.remote.RemoteError``).
    """

    async def register(self, model: TrainableModel) -> None:
        """Load ``model`` (resuming from its latest complete checkpoint) and serve it: sets
        ``model.inference_base_url`` / ``inference_api_key`` / ``inference_model_name``."""
        ...

    async def train(
        self,
        model: TrainableModel,
        trajectory_groups: Iterable[TrajectoryGroup],
        config: TrainConfig | None = None,
        *,
        on_progress: ProgressCallback | None = None,
        serve_while_training: bool = False,
        **overrides: Any,
    ) -> TrainResult:
        """One training step on finished groups. ``overrides`` are ``TrainConfig`` fields in
        ART's keyword style (``learning_rate=1e-5``). When this returns, the new adapter is
        the one served by default and its checkpoint is on disk; a step that raises leaves
        the previous checkpoint in force. ``serve_while_training``: the model keeps serving
        while the step trains (pipelined training; ``ValueError`` where sampling and
        training would share one device)."""
        ...

    async def train_sft(
        self,
        model: TrainableModel,
        trajectories: SFTData,
        config: SFTConfig | None = None,
        *,
        on_progress: ProgressCallback | None = None,
        **overrides: Any,
    ) -> TrainResult:
        """Supervised epochs on demonstrations (``art_core.sft``: a JSONL path, trajectories,
        groups, chat records), written as the next checkpoint like a ``train`` step.
        ``overrides`` are ``SFTConfig`` fields. Every record is checked first: a bad one
        raises ``ValueError`` naming it and nothing is trained."""
        ...

    async def get_step(self, model: TrainableModel) -> int:
        """The step of the latest complete checkpoint (0: the base model)."""
        ...

    async def log(
        self,
        model: TrainableModel,
        trajectory_groups: Iterable[TrajectoryGroup] | None = None,
        *,
        split: str = "val",
        metrics: Mapping[str, float | None] | None = None,
        step: int | None = None,
    ) -> None:
        """Append groups to ``trajectories/{split}/{step:04d}.jsonl`` and one record to
        ``history.jsonl`` (their mean reward and ``metrics``); ``step`` defaults to the
        latest checkpoint's."""
        ...

    async def delete_checkpoints(
        self, model: TrainableModel, best_checkpoint_metric: str = "val/reward"
    ) -> list[int]:
        """Delete every checkpoint but the latest and the best by the metric; return the
        deleted steps."""
        ...

    async def export(
        self,
        model: TrainableModel,
        out: str | Path,
        *,
        format: ExportFormat = "peft",
        step: int | None = None,
        best: str | None = None,
        higher_is_better: bool | None = None,
        overwrite: bool = False,
        gguf_type: str = "f16",
    ) -> ExportResult:
        """Export a checkpoint of ``model`` (``step``, else the best by the history metric
        ``best``, else the latest) to the folder ``out`` as a PEFT adapter, a merged model or
        a GGUF file (``art_core.export.export_checkpoint``)."""
        ...

    async def rollout_calls(
        self, model: TrainableModel, rollout_id: str, *, release: bool = False
    ) -> list[LLMCall]:
        """The calls recorded for a rollout, in issue order; ``release`` forgets them in
        memory (they stay on disk)."""
        ...

    async def close(self) -> None:
        """Release what this backend holds (engines, connections)."""
        ...


class BackendBase:
    """Shared by the backends: ART keyword settings and ART's private spellings.

    Subclasses implement the ``Backend`` methods; the shims below only forward to them.

    Example:
        >>> config = BackendBase.train_config(None, {"learning_rate": 1e-5})
        >>> config.learning_rate
        1e-05
    """

    @staticmethod
    def train_config(
        config: TrainConfig | None,
        overrides: Mapping[str, Any],
        *,
        model: TrainableModel | None = None,
    ) -> TrainConfig:
        """``config`` (default: ``TrainConfig()``) with ART-style keyword ``overrides``.

        With ``model``, the knobs of its ART ``_internal_config`` that mean something here
        (``art_core.dev.apply``) fill the fields that neither ``config`` nor ``overrides`` set.
        Raises ``TypeError`` naming an override that is not a ``TrainConfig`` field, and
        ``ValueError`` (pydantic's) for a value out of its range.
        """
        # Pydantic models: kept off `import art_core` (~15 ms).
        from art_core.training.config import TrainConfig

        base = TrainConfig() if config is None else config
        internal = getattr(model, "_internal_config", None)
        if internal and isinstance(base, TrainConfig):
            overrides = {**internal_overrides(internal, base, overrides), **overrides}
        return _with_overrides(TrainConfig, base, overrides, "train")

    @staticmethod
    def sft_config(config: SFTConfig | None, overrides: Mapping[str, Any]) -> SFTConfig:
        """``config`` (default: ``SFTConfig()``) with keyword ``overrides``, as ``train_config``.

        Example:
            >>> BackendBase.sft_config(None, {"epochs": 3}).epochs
            3
        """
        # Pydantic models: kept off `import art_core` (~15 ms).
        from art_core.training.config import SFTConfig

        return _with_overrides(SFTConfig, config, overrides, "train_sft")

    # ART's private spellings: thin shims over the public methods.
    async def _train(
        self,
        model: TrainableModel,
        groups: Iterable[TrajectoryGroup],
        config: TrainConfig | None = None,
        **kwargs: Any,
    ) -> TrainResult:
        return await self.train(model, groups, config, **kwargs)  # type: ignore[attr-defined]

    async def _train_sft(
        self,
        model: TrainableModel,
        trajectories: SFTData,
        config: SFTConfig | None = None,
        **kwargs: Any,
    ) -> TrainResult:
        return await self.train_sft(model, trajectories, config, **kwargs)  # type: ignore[attr-defined]

    async def _get_step(self, model: TrainableModel) -> int:
        return await self.get_step(model)  # type: ignore[attr-defined]

    async def _log(
        self,
        model: TrainableModel,
        groups: Iterable[TrajectoryGroup] | None = None,
        split: str = "val",
        **kwargs: Any,
    ) -> None:
        await self.log(model, groups, split=split, **kwargs)  # type: ignore[attr-defined]

    async def _delete_checkpoints(
        self, model: TrainableModel, best_checkpoint_metric: str = "val/reward", *_: Any
    ) -> list[int]:
        return await self.delete_checkpoints(model, best_checkpoint_metric)  # type: ignore[attr-defined]

    async def _rollout_calls(
        self, model: TrainableModel, rollout_id: str, *, release: bool = False
    ) -> list[LLMCall]:
        return await self.rollout_calls(model, rollout_id, release=release)  # type: ignore[attr-defined]


Settings = TypeVar("Settings", bound="TrainingSettings")


def _with_overrides(
    cls: type[Settings], config: Settings | None, overrides: Mapping[str, Any], call: str
) -> Settings:
    """``config`` (default ``cls()``) with ``overrides``; ``TypeError`` naming unknown keys."""
    base = cls() if config is None else config
    if not isinstance(base, cls):
        raise TypeError(f"config must be a {cls.__name__}, got {type(base).__name__}")
    if not overrides:
        return base
    unknown = sorted(set(overrides) - set(cls.model_fields))
    if unknown:
        raise TypeError(
            f"{call}() got settings that are not {cls.__name__} fields: {', '.join(unknown)}; "
            f"known: {', '.join(sorted(cls.model_fields))}"
        )
    return cls.model_validate({**base.model_dump(), **overrides})
