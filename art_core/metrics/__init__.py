"""Metrics: a model's history (``history.jsonl``) as curves and, optionally, as W&B or MLflow
runs.

- ``art-core plot MODEL_DIR`` / ``plot_history``: reward, loss and judge-score curves (PNG and
  an HTML page) from a model folder's history.
- ``enable_wandb(...)`` (or ``ART_WANDB=1``): every train and ``model.log`` record of every
  model is logged to Weights & Biases too, from a background thread.
- ``enable_mlflow(...)`` (or ``ART_MLFLOW=1``): the same records go to an MLflow tracking
  server, one run per model; with ``tracing.enable("mlflow", ...)`` the rollout traces are
  linked to that run.

Example:
    >>> from art_core import metrics
    >>> metrics.enable_wandb(project="agent-rl")  # changes process-wide state: every model's records go to W&B from then on  # doctest: +SKIP
    >>> metrics.enable_mlflow("http://127.0.0.1:5000", experiment_name="agent-rl")  # changes process-wide state: and needs an MLflow server  # doctest: +SKIP
    >>> metrics.plot_history(Path(".art/demo/models/agent-001"))  # needs files: a model folder with a history  # doctest: +SKIP

``wandb``, ``httpx`` (MLflow) and ``matplotlib`` are imported only when W&B or MLflow is
enabled or a plot is drawn.
"""

from __future__ import annotations

from art_core.metrics.plot import PlotResult, metric_series, plot_history
from art_core.metrics.state import (
    disable_mlflow,
    disable_wandb,
    enable_mlflow,
    enable_wandb,
    flush,
    mlflow_run_id,
)

__all__ = [
    "PlotResult",
    "disable_mlflow",
    "disable_wandb",
    "enable_mlflow",
    "enable_wandb",
    "flush",
    "metric_series",
    "mlflow_run_id",
    "plot_history",
]
