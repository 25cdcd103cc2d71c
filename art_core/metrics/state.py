"""The process-wide W&B switch: which ``WandbLogger`` (if any) receives the metric history.

One ``ProcessSwitch`` (like tracing's), changed only through ``enable_wandb`` /
``disable_wandb``; ``ART_WANDB=1`` applies on the first read. Standard library only until W&B
is enabled.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from art_core.tracing.settings import env_flag
from art_core.tracing.switch import ProcessSwitch

if TYPE_CHECKING:
    from art_core.metrics.wandb import WandbLogger

EXIT_TIMEOUT_S = 5.0


def _configure_from_env() -> None:
    if env_flag(os.environ, "ART_WANDB", False):
        enable_wandb()


def _exit() -> None:
    disable_wandb(EXIT_TIMEOUT_S)


_state: ProcessSwitch[WandbLogger] = ProcessSwitch(
    _configure_from_env, _exit, "metrics: ART_WANDB could not be applied; W&B logging stays off"
)


def wandb_logger() -> WandbLogger | None:
    """The active W&B logger, or None. The first call reads ``ART_WANDB``."""
    return _state.get()


def enable_wandb(project: str | None = None, entity: str | None = None, **init_kwargs: Any) -> None:
    """Log each model's metric history (train and val records) to Weights & Biases.

    One W&B run per model (resumed across processes); ``project`` defaults to
    ``$WANDB_PROJECT``, then to the model's project. ``WANDB_MODE=offline`` works as usual.
    Replaces an earlier ``enable_wandb`` (its runs are finished).

    Example:
        >>> from art_core import metrics
        >>> metrics.enable_wandb(project="agent-rl")  # doctest: +SKIP
    """
    from art_core.metrics.wandb import WandbLogger

    previous = _state.swap(WandbLogger(project=project, entity=entity, **init_kwargs))
    if previous is not None:
        previous.close(EXIT_TIMEOUT_S)


def disable_wandb(timeout_s: float = EXIT_TIMEOUT_S) -> None:
    """Stop logging to W&B and finish its runs (waiting at most ``timeout_s``).

    Example:
        >>> disable_wandb()
    """
    previous = _state.swap(None)
    if previous is not None:
        previous.close(timeout_s)


def flush(timeout_s: float = 30.0) -> bool:
    """Wait until every record queued for W&B has been handed to it (True) or ``timeout_s``
    passed (False). True at once when W&B logging is off.

    Example:
        >>> flush(1.0)
        True
    """
    wandb = _state.value
    return wandb.flush(timeout_s) if wandb is not None else True
