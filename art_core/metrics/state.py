"""The process-wide metric switches: which ``WandbLogger`` and which ``MlflowLogger`` (if any)
receive the metric history.

One ``ProcessSwitch`` each (like tracing's), changed only through ``enable_wandb`` /
``disable_wandb`` and ``enable_mlflow`` / ``disable_mlflow``; ``ART_WANDB=1`` / ``ART_MLFLOW=1``
apply on the first read. Standard library only until one of them is enabled.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from art_core.switch import ProcessSwitch, env_flag

if TYPE_CHECKING:
    from art_core.metrics.mlflow import MlflowLogger
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


def _configure_mlflow_from_env() -> None:
    if env_flag(os.environ, "ART_MLFLOW", False):
        enable_mlflow()


def _exit_mlflow() -> None:
    disable_mlflow(EXIT_TIMEOUT_S)


_mlflow_state: ProcessSwitch[MlflowLogger] = ProcessSwitch(
    _configure_mlflow_from_env,
    _exit_mlflow,
    "metrics: ART_MLFLOW could not be applied; MLflow logging stays off",
)


def wandb_logger() -> WandbLogger | None:
    """The active W&B logger, or None. The first call reads ``ART_WANDB``."""
    return _state.get()


def mlflow_logger() -> MlflowLogger | None:
    """The active MLflow logger, or None. The first call reads ``ART_MLFLOW``."""
    return _mlflow_state.get()


def enable_wandb(project: str | None = None, entity: str | None = None, **init_kwargs: Any) -> None:
    """Log each model's metric history (train and val records) to Weights & Biases.

    One W&B run per model (resumed across processes); ``project`` defaults to
    ``$WANDB_PROJECT``, then to the model's project. ``WANDB_MODE=offline`` works as usual.
    Replaces an earlier ``enable_wandb`` (its runs are finished).

    Example:
        >>> from art_core import metrics
        >>> metrics.enable_wandb(project="agent-rl")  # changes process-wide state: every model's records go to W&B from then on  # doctest: +SKIP
    """
    # Loaded once enabled.
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


def enable_mlflow(
    tracking_uri: str | None = None,
    experiment_name: str | None = None,
    experiment_id: str | None = None,
) -> None:
    """Log each model's metric history (train and val records) to an MLflow tracking server.

    One MLflow run per model (tag ``art.model`` = ``project/name``, found again by a restarted
    training), in experiment ``experiment_id`` or ``experiment_name`` (created when missing;
    default ``$MLFLOW_EXPERIMENT_ID`` / ``$MLFLOW_EXPERIMENT_NAME``, else MLflow's Default).
    ``tracking_uri`` defaults to ``$MLFLOW_TRACKING_URI``, else ``http://127.0.0.1:5000``.
    Nothing is sent from the caller's thread, and an unreachable server is logged, never
    raised. With ``tracing.enable("mlflow", ...)`` too, rollout traces are linked to the run.
    Replaces an earlier ``enable_mlflow`` (its runs are marked finished).

    Example:
        >>> from art_core import metrics
        >>> metrics.enable_mlflow("http://127.0.0.1:5000", experiment_name="agent-rl")
        >>> metrics.disable_mlflow()
    """
    # Loaded once enabled (httpx's MLflow client).
    from art_core.metrics.mlflow import MlflowLogger

    logger = MlflowLogger(
        tracking_uri, experiment_name=experiment_name, experiment_id=experiment_id
    )
    previous = _mlflow_state.swap(logger)
    if previous is not None:
        previous.close(EXIT_TIMEOUT_S)


def disable_mlflow(timeout_s: float = EXIT_TIMEOUT_S) -> None:
    """Stop logging to MLflow: send what is queued and mark the runs finished (waiting at most
    ``timeout_s``).

    Example:
        >>> disable_mlflow()
    """
    previous = _mlflow_state.swap(None)
    if previous is not None:
        previous.close(timeout_s)


def mlflow_run_id(model_project: str, model_name: str) -> str | None:
    """The id of the MLflow run ``enable_mlflow`` logs model ``model_project/model_name`` to
    (created when missing), or None when MLflow logging is off or the server cannot be
    reached. It may send a few requests (each bounded): call it from a background thread, as
    the MLflow tracing exporter does to link rollout traces to the run.

    Example:
        >>> mlflow_run_id("tests", "tiny") is None  # MLflow logging is off
        True
    """
    logger = _mlflow_state.get()
    return logger.run_id(model_project, model_name) if logger is not None else None


def flush(timeout_s: float = 30.0) -> bool:
    """Wait until every record queued for W&B and MLflow has been handed to them (True) or
    ``timeout_s`` passed (False). True at once when both are off.

    Example:
        >>> flush(1.0)
        True
    """
    deadline = time.monotonic() + timeout_s
    ok = True
    for logger in (_state.value, _mlflow_state.value):
        if logger is not None:
            ok = logger.flush(max(0.0, deadline - time.monotonic())) and ok
    return ok
