"""The bookkeeping of one training step, kept out of the step loop.

``StepStats`` sums the micro-batches' weighted metrics, counts optimizer updates, drives the
progress bar and the ``on_progress`` records (micro-batch / optimizer-step events that
``RemoteBackend`` streams to its client), and turns it all into the step's metrics.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from tqdm.auto import tqdm

logger = logging.getLogger(__name__)
ProgressCallback = Callable[[dict[str, Any]], None]
# Reported every step, even with nothing trained: plots and best-checkpoint lookups need the
# same keys at every step.
ALWAYS_REPORTED = ("loss", "policy_loss", "entropy", "clip_fraction", "logprob_mismatch")


class StepStats:
    """Metrics, progress bar and progress events of one training step.

    Example:
        >>> stats = StepStats(step=1, num_micro_batches=2, on_progress=None, show_bar=False)
        >>> stats.micro_batch({"loss": 0.25}, tokens=8, epoch=0, update=0)
        >>> stats.micro_batch({"loss": 0.25}, tokens=8, epoch=0, update=0)
        >>> stats.optimizer_step(grad_norm=1.5, epoch=0, update=0)
        >>> stats.metrics(updates=1, tokens_run=16, learning_rate=1e-5)["train/loss"]
        0.5
    """

    def __init__(
        self,
        *,
        step: int,
        num_micro_batches: int,
        on_progress: ProgressCallback | None,
        show_bar: bool = True,
        started: float | None = None,
    ) -> None:
        self.step = step
        self.num_micro_batches = num_micro_batches
        self.on_progress = on_progress
        # ``time.perf_counter()`` when the step began (loading included), default now.
        self.started = time.perf_counter() if started is None else started
        self.sums: defaultdict[str, float] = defaultdict(float)
        self.grad_norms: list[float] = []
        self.skipped_updates = 0
        self.micro_batches_done = 0
        self._bar = tqdm(
            total=num_micro_batches,
            desc=f"train step {step}",
            unit="batch",
            leave=False,
            disable=not show_bar,
        )

    def set_total(self, num_micro_batches: int) -> None:
        """Correct the expected number of micro-batches (a step that builds its micro-batches
        as it goes, e.g. SFT, knows the exact total only at the end)."""
        self.num_micro_batches = num_micro_batches
        self._bar.total = num_micro_batches
        self._bar.refresh()

    def micro_batch(
        self, metrics: dict[str, float], *, tokens: int, epoch: int, update: int, **extra: Any
    ) -> None:
        """A micro-batch's forward and backward are done (``extra`` goes into its record,
        e.g. the data-parallel rank that ran it)."""
        for name, value in metrics.items():
            self.sums[name] += value
        self.micro_batches_done += 1
        self._bar.update(1)
        self._bar.set_postfix(loss=f"{metrics['loss']:.4f}")
        self._emit(
            {
                "event": "micro_batch",
                "epoch": epoch,
                "optimizer_step": update,
                "micro_batch": self.micro_batches_done,
                "num_micro_batches": self.num_micro_batches,
                "loss": metrics["loss"],
                "tokens": tokens,
                **extra,
            }
        )

    def optimizer_step(self, grad_norm: float, *, epoch: int, update: int, **extra: Any) -> None:
        """An optimizer update was applied (a finite ``grad_norm``) or skipped (non-finite);
        ``extra`` goes into its record."""
        if math.isfinite(grad_norm):
            self.grad_norms.append(grad_norm)
        else:
            # One bad batch must not poison the adapter with NaNs: the update was skipped.
            self.skipped_updates += 1
            logger.warning("non-finite gradient norm at step %d; update skipped", self.step)
        self._emit(
            {
                "event": "optimizer_step",
                "epoch": epoch,
                "optimizer_step": update,
                "grad_norm": grad_norm,
                **extra,
            }
        )

    def _emit(self, record: dict[str, Any]) -> None:
        if self.on_progress is not None:
            self.on_progress({**record, "step": self.step})

    def close(self) -> None:
        self._bar.close()

    def metrics(self, *, updates: int, tokens_run: int, learning_rate: float) -> dict[str, float]:
        """The step's ``train/...`` metrics: the micro-batch sums averaged over ``updates``
        (each optimizer update's token weights sum to 1), gradient norms and throughput."""
        seconds = time.perf_counter() - self.started
        metrics = {f"train/{name}": value / max(updates, 1) for name, value in self.sums.items()}
        for name in ALWAYS_REPORTED:
            metrics.setdefault(f"train/{name}", 0.0)
        norms = self.grad_norms
        metrics.update(
            {
                "train/grad_norm": sum(norms) / len(norms) if norms else 0.0,
                "train/optimizer_steps": float(len(norms)),
                "train/skipped_updates": float(self.skipped_updates),
                "train/num_micro_batches": float(self.num_micro_batches),
                "train/learning_rate": learning_rate,
                "train/seconds": seconds,
                "train/tokens_per_second": tokens_run / max(seconds, 1e-9),
            }
        )
        return metrics
