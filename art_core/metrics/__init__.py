"""Metrics: a model's history (``history.jsonl``) as curves and, optionally, as W&B runs.

- ``art-core plot MODEL_DIR`` / ``plot_history``: reward, loss and judge-score curves (PNG and
  an HTML page) from a model folder's history.
- ``enable_wandb(...)`` (or ``ART_WANDB=1``): every train and ``model.log`` record of every
  model is logged to Weights & Biases too, from a background thread.

Example:
    >>> from art_core import metrics
    >>> metrics.enable_wandb(project="agent-rl")  # doctest: +SKIP
    >>> metrics.plot_history(Path(".art/demo/models/agent-001"))  # doctest: +SKIP

``wandb`` and ``matplotlib`` are imported only when W&B is enabled or a plot is drawn.
"""

from __future__ import annotations

from art_core.metrics.plot import PlotResult, metric_series, plot_history
from art_core.metrics.state import disable_wandb, enable_wandb, flush

__all__ = [
    "PlotResult",
    "disable_wandb",
    "enable_wandb",
    "flush",
    "metric_series",
    "plot_history",
]
