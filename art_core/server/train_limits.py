"""``TrainLimits``: how much training one request may ask of ``art-core serve``.

``TrainConfig`` / ``SFTConfig`` bound every field for any process (their ``Field`` ranges).
A shared server bounds further what decides a step's time and memory, since one caller's
step holds the model (its chat waits behind lock-step training): the passes over the data,
the optimizer steps per pass and the adapter's rank. The defaults cover real runs; an
operator raises them with ``art-core serve --max-num-epochs N`` etc.
"""

from __future__ import annotations

from dataclasses import dataclass

from art_core.server.schemas import FieldError
from art_core.training.config import SFTConfig, TrainConfig


@dataclass(frozen=True)
class TrainLimits:
    """Upper bounds a server puts on training requests (422 naming the field beyond them).

    Example:
        >>> TrainLimits().check(TrainConfig(num_epochs=3))  # within the limits: nothing
        >>> TrainLimits(max_num_epochs=2).check(TrainConfig(num_epochs=3))
        Traceback (most recent call last):
        art_core.server.schemas.FieldError: config.num_epochs: is 3; this server allows at most 2 (art-core serve --max-num-epochs)
    """

    max_num_epochs: int = 100
    max_optimizer_steps_per_epoch: int = 1000
    max_lora_rank: int = 256
    # A distillation teacher makes the server load a model from a path or call a URL a caller
    # names: off unless the operator allows it (art-core serve --allow-teachers).
    allow_teachers: bool = False

    def check(self, config: TrainConfig | SFTConfig) -> None:
        """``FieldError`` (a 422) for the first field of ``config`` beyond a limit."""
        if (
            isinstance(config, TrainConfig)
            and config.teacher is not None
            and not self.allow_teachers
        ):
            raise FieldError(
                "config.teacher",
                "this server does not load distillation teachers for its callers (a teacher "
                "reads a model path or calls a URL the request names); start it with "
                "art-core serve --allow-teachers",
            )
        epochs = config.num_epochs if isinstance(config, TrainConfig) else config.epochs
        epochs_field = "num_epochs" if isinstance(config, TrainConfig) else "epochs"
        bounds = [
            (epochs_field, epochs, self.max_num_epochs, "--max-num-epochs"),
            ("lora_rank", config.lora_rank, self.max_lora_rank, "--max-lora-rank"),
        ]
        if isinstance(config, TrainConfig):
            bounds.append(
                (
                    "optimizer_steps_per_epoch",
                    config.optimizer_steps_per_epoch,
                    self.max_optimizer_steps_per_epoch,
                    "--max-optimizer-steps-per-epoch",
                )
            )
        for name, value, limit, flag in bounds:
            if value > limit:
                raise FieldError(
                    f"config.{name}",
                    f"is {value}; this server allows at most {limit} (art-core serve {flag})",
                )
