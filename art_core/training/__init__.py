"""GRPO training of LoRA adapters on token-exact captured trajectories.

``Trainer`` runs the steps; ``TrainConfig`` (GRPO) and ``SFTConfig`` (supervised) say how;
``TrainResult`` says what came out.
The modules each hold one idea: ``sequences`` (token-exact assembly), ``advantages``
(group-relative credit), ``loss`` (PPO/CISPO objective), ``packing`` (micro-batches),
``checkpoints`` (pickle-free save/resume), ``loading`` (peft / Unsloth), ``batch`` (groups to
rollouts), ``step_stats`` (a step's metrics and progress), ``memory`` (micro-batches sized to
the memory budget; ``SequenceTooLargeError``) and ``sft`` (supervised steps on the same
adapter). The model folder's layout belongs to ``art_core.model_folder``.

Example:
    >>> from art_core.training import Trainer, TrainConfig
    >>> trainer = Trainer(base_model_path, model_dir)                          # fragment: a model's `base_model_path`, `model_dir`  # doctest: +SKIP
    >>> result = trainer.train_step(groups, TrainConfig(learning_rate=1e-5))   # fragment: `groups` with recorded calls  # doctest: +SKIP
"""

from typing import TYPE_CHECKING, Any

from art_core.training.config import (
    DEFAULT_LORA_TARGET_MODULES,
    SFTConfig,
    TrainConfig,
    TrainingSettings,
    TrainResult,
)
from art_core.training.memory import SequenceTooLargeError

if TYPE_CHECKING:
    from art_core.training.trainer import Trainer


def __getattr__(name: str) -> Any:
    # ``Trainer`` imports torch (about 2 s): loaded when first asked for, so the modules that
    # only read records (``sequences``, ``advantages``; the viewer) start without it.
    if name == "Trainer":
        from art_core.training.trainer import Trainer

        return Trainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_LORA_TARGET_MODULES",
    "SFTConfig",
    "SequenceTooLargeError",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "TrainingSettings",
]
