"""The calls the backends make into metrics: one line each where a history record is made.

Each returns at once when W&B and MLflow logging are off (two attribute reads once the
environment has been checked), so training pays nothing for them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from art_core.metrics import state


def train_step_finished(model: Any, metrics: Mapping[str, Any], step: int) -> None:
    """A ``train`` call finished at adapter ``step`` with these metrics: log them to W&B and
    MLflow.

    Example:
        >>> train_step_finished(model, {"train/reward": 0.4}, step=3)  # fragment: a trained `model`, with W&B or MLflow enabled  # doctest: +SKIP
    """
    # The history's step convention: step s = the adapter that served the rollouts.
    wandb = state.wandb_logger()
    if wandb is not None:
        wandb.log(model, dict(metrics), step=step - 1)
    mlflow = state.mlflow_logger()
    if mlflow is not None:
        mlflow.log(model, dict(metrics), step=step - 1)


def history_logged(model: Any, record: Mapping[str, Any]) -> None:
    """``model.log`` appended a record (e.g. validation reward) to the history: log it to W&B
    and MLflow.

    Example:
        >>> history_logged(model, {"step": 2, "val/reward": 0.5})  # fragment: a `model`, with W&B or MLflow enabled  # doctest: +SKIP
    """
    wandb = state.wandb_logger()
    mlflow = state.mlflow_logger()
    if wandb is None and mlflow is None:
        return
    metrics = {k: v for k, v in record.items() if "/" in k and isinstance(v, int | float)}
    step = int(record.get("step", 0))
    if wandb is not None:
        wandb.log(model, metrics, step=step)
    if mlflow is not None:
        mlflow.log(model, metrics, step=step)
