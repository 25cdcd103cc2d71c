"""The calls the backends make into metrics: one line each where a history record is made.

Each returns at once when W&B logging is off (one attribute read once the environment has
been checked), so training pays nothing for them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from art_core.metrics import state


def train_step_finished(model: Any, metrics: Mapping[str, Any], step: int) -> None:
    """A ``train`` call finished at adapter ``step`` with these metrics: log them to W&B.

    Example:
        >>> train_step_finished(model, {"train/reward": 0.4}, step=3)  # doctest: +SKIP
    """
    wandb = state.wandb_logger()
    if wandb is not None:
        # The history's step convention: step s = the adapter that served the rollouts.
        wandb.log(model, dict(metrics), step=step - 1)


def history_logged(model: Any, record: Mapping[str, Any]) -> None:
    """``model.log`` appended a record (e.g. validation reward) to the history: log it to W&B.

    Example:
        >>> history_logged(model, {"step": 2, "val/reward": 0.5})  # doctest: +SKIP
    """
    wandb = state.wandb_logger()
    if wandb is not None:
        metrics = {k: v for k, v in record.items() if "/" in k and isinstance(v, int | float)}
        wandb.log(model, metrics, step=int(record.get("step", 0)))
