"""Weights & Biases: each model's metric history (what ``history.jsonl`` holds) as a W&B run.

One run per model, id derived from its project and name so a restarted training resumes the
same run. ``wandb.init`` (seconds: it starts W&B's service process) and every ``log`` run in
a background thread; failures are logged, never raised into training.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from typing import Any

from art_core.background import Worker

logger = logging.getLogger("art_core.metrics")


def run_id(project: str, name: str) -> str:
    """A stable W&B run id for a model (letters, digits, ``-`` and ``_``; at most 64 chars).

    Example:
        >>> run_id("demo", "agent-001")
        'demo-agent-001-8169cbe9'
    """
    digest = hashlib.sha256(f"{project}/{name}".encode()).hexdigest()[:8]
    stem = re.sub(r"[^A-Za-z0-9_-]", "-", f"{project}-{name}")[:55]
    return f"{stem}-{digest}"


class WandbLogger:
    """Log metric records of ``TrainableModel`` s to W&B.

    Example:
        >>> logger = WandbLogger(project="agent-rl", mode="offline")  # starts a server: W&B's service process  # doctest: +SKIP
        >>> logger.log(model, {"train/reward": 0.4}, step=0)         # starts a server  # doctest: +SKIP
    """

    def __init__(
        self, project: str | None = None, entity: str | None = None, **init_kwargs: Any
    ) -> None:
        try:
            import wandb  # noqa: F401  (fail at enable time, not in the background)
        except ImportError as exc:
            raise ImportError("W&B logging needs `wandb`: pip install 'art-core[wandb]'") from exc
        self.project = project
        self.entity = entity
        self.init_kwargs = init_kwargs
        self.runs: dict[str, Any] = {}
        self.worker = Worker(max_queue_size=10_000, name="art-wandb")

    def log(self, model: Any, metrics: dict[str, Any], step: int) -> None:
        """Queue one record of ``model`` at ``step`` (the history's step)."""
        key = f"{getattr(model, 'project', 'default')}/{getattr(model, 'name', 'model')}"
        info = {
            "project": getattr(model, "project", "default"),
            "name": getattr(model, "name", "model"),
            "base_model": getattr(model, "base_model", None),
        }
        self.worker.submit(lambda: self._log(key, info, metrics, step))

    def _run(self, key: str, info: dict[str, Any]) -> Any:
        run = self.runs.get(key)
        if run is None:
            import wandb

            kwargs: dict[str, Any] = {
                "project": self.project or os.environ.get("WANDB_PROJECT") or info["project"],
                "entity": self.entity,
                "name": info["name"],
                "id": run_id(info["project"], info["name"]),
                "resume": "allow",
                "reinit": "create_new",
                "config": {"base_model": info["base_model"], "art_project": info["project"]},
            }
            kwargs.update(self.init_kwargs)
            run = wandb.init(**kwargs)
            self.runs[key] = run
        return run

    def _log(self, key: str, info: dict[str, Any], metrics: dict[str, Any], step: int) -> None:
        run = self._run(key, info)
        values = {
            k: v
            for k, v in metrics.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        if values:
            run.log(values, step=step)

    def flush(self, timeout_s: float) -> bool:
        return self.worker.flush(timeout_s)

    def close(self, timeout_s: float) -> None:
        """Finish every run (uploads them unless offline)."""
        self.worker.submit(self._finish_all)
        self.worker.close(timeout_s)

    def _finish_all(self) -> None:
        for run in self.runs.values():
            try:
                run.finish()
            except Exception:
                logger.exception("metrics: a W&B run failed to finish")
        self.runs.clear()
