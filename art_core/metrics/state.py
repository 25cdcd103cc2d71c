"""The process-wide W&B switch: which ``WandbLogger`` (if any) receives the metric history.

Process-wide on purpose, like tracing's switch: train steps finish on the backend's threads
and must all see one logger. It changes only through ``enable_wandb`` / ``disable_wandb``
(under a lock); the first read applies ``ART_WANDB=1`` from the environment. Standard library
only until W&B is enabled.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from typing import TYPE_CHECKING, Any

from art_core.tracing.settings import env_flag

if TYPE_CHECKING:
    from art_core.metrics.wandb import WandbLogger

logger = logging.getLogger("art_core.metrics")

EXIT_TIMEOUT_S = 5.0


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.wandb: WandbLogger | None = None
        self.env_checked = False
        self.exit_hook = False


_state = _State()


def wandb_logger() -> WandbLogger | None:
    """The active W&B logger, or None. The first call reads ``ART_WANDB``."""
    if not _state.env_checked:
        _configure_from_env()
    return _state.wandb


def _configure_from_env() -> None:
    with _state.lock:
        if _state.env_checked:
            return
        _state.env_checked = True
    try:
        if env_flag(os.environ, "ART_WANDB", False) and _state.wandb is None:
            enable_wandb()
    except Exception:
        # A bad variable or a missing package must not break training: say so, log nothing.
        logger.exception("metrics: ART_WANDB could not be applied; W&B logging stays off")


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

    logger_ = WandbLogger(project=project, entity=entity, **init_kwargs)
    with _state.lock:
        previous, _state.wandb = _state.wandb, logger_
        _state.env_checked = True
        if not _state.exit_hook:
            atexit.register(disable_wandb, EXIT_TIMEOUT_S)
            _state.exit_hook = True
    if previous is not None:
        previous.close(EXIT_TIMEOUT_S)


def disable_wandb(timeout_s: float = EXIT_TIMEOUT_S) -> None:
    """Stop logging to W&B and finish its runs (waiting at most ``timeout_s``).

    Example:
        >>> disable_wandb()
    """
    with _state.lock:
        previous, _state.wandb = _state.wandb, None
        _state.env_checked = True
    if previous is not None:
        previous.close(timeout_s)


def flush(timeout_s: float = 30.0) -> bool:
    """Wait until every record queued for W&B has been handed to it (True) or ``timeout_s``
    passed (False). True at once when W&B logging is off.

    Example:
        >>> flush(1.0)
        True
    """
    wandb = _state.wandb
    return wandb.flush(timeout_s) if wandb is not None else True
