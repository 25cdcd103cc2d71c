"""The statistics of an eval: pass@k, and bootstrap intervals resampled by task.

Every number is a mean over tasks of a per-task value (the task's mean reward, its share of
solved runs, its pass@k), so each task weighs the same whatever its number of runs. The
runs of one task are not independent draws of the eval's population (a hard task fails all
its runs together), so the intervals resample whole tasks, not runs: a run-level bootstrap
would give intervals too narrow by about the square root of the runs per task.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

DEFAULT_RESAMPLES = 2000
DEFAULT_CONFIDENCE = 0.95


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one task from ``n`` runs of which ``c`` solved it (Chen et al.
    2021): the chance that ``k`` runs drawn without replacement from the ``n`` include a
    solved one, ``1 - C(n-c, k) / C(n, k)``.

    The naive ``1 - (1 - c/n)**k`` draws with replacement and underestimates pass@k.

    Example:
        >>> pass_at_k(4, 1, 1)
        0.25
        >>> pass_at_k(4, 1, 2)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        0.5
        >>> pass_at_k(4, 0, 4), pass_at_k(4, 3, 2)
        (0.0, 1.0)
    """
    if n < 1:
        raise ValueError(f"pass@k needs at least one run, got n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"solved runs must be between 0 and n={n}, got c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n (the runs per task, {n})")
    if n - c < k:
        return 1.0  # every draw of k runs includes a solved one
    # The product form of C(n-c, k) / C(n, k): exact in floats where the binomials overflow.
    failing = 1.0
    for i in range(n - c + 1, n + 1):
        failing *= 1.0 - k / i
    return 1.0 - failing


def bootstrap_interval(
    values: Sequence[float],
    *,
    weights: Sequence[float] | None = None,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
) -> tuple[float, float]:
    """The percentile bootstrap interval of the mean of ``values`` (one value per task):
    ``resamples`` resamples of the tasks with replacement, seeded. With ``weights`` (e.g.
    each task's number of runs) the mean is weighted: a per-run mean, still resampled by task.

    Example:
        >>> bootstrap_interval([0.0, 1.0, 1.0, 0.0, 1.0], seed=0)
        (0.2, 1.0)
        >>> bootstrap_interval([0.5])
        (0.5, 0.5)
        >>> bootstrap_interval([1.0, 0.0], weights=[3, 1])
        (0.0, 1.0)
    """
    if not values:
        raise ValueError("a bootstrap interval needs at least one task")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    data = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(data)):
        raise ValueError("bootstrap values must be finite numbers")
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(data), size=(resamples, len(data)))
    if weights is None:
        means = data[picks].mean(axis=1)
    else:
        weight = _weights(weights, len(data))
        means = (data * weight)[picks].sum(axis=1) / weight[picks].sum(axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    # Rounded off float noise (a mean of equal values prints as itself), never past the data.
    low = max(float(np.round(low, 12)), float(data.min()))
    high = min(float(np.round(high, 12)), float(data.max()))
    return low, high


def _weights(weights: Sequence[float], count: int) -> np.ndarray:
    weight = np.asarray(weights, dtype=np.float64)
    if weight.shape != (count,):
        raise ValueError(f"{len(weights)} weights for {count} values")
    if not np.all(np.isfinite(weight)) or np.any(weight <= 0):
        raise ValueError("weights must be finite and > 0")
    return weight


@dataclass(frozen=True)
class Estimate:
    """A mean over tasks with its bootstrap interval.

    Example:
        >>> str(Estimate(0.4123, 0.301, 0.53))
        '0.412 [0.301, 0.530]'
    """

    value: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.value:.3f} [{self.low:.3f}, {self.high:.3f}]"

    def percent(self) -> str:
        """The estimate as percentages, e.g. ``41.2% [30.1%, 53.0%]``."""
        return f"{self.value:.1%} [{self.low:.1%}, {self.high:.1%}]"


def estimate(
    values: Sequence[float],
    *,
    weights: Sequence[float] | None = None,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
) -> Estimate:
    """The mean of per-task ``values`` (weighted by ``weights`` if given) with its bootstrap
    interval.

    Example:
        >>> str(estimate([1.0, 0.0, 0.5, 0.5]))
        '0.500 [0.125, 0.875]'
        >>> estimate([1.0, 0.0], weights=[3, 1]).value
        0.75
    """
    low, high = bootstrap_interval(
        values, weights=weights, resamples=resamples, confidence=confidence, seed=seed
    )
    data = np.asarray(values, dtype=np.float64)
    if weights is None:
        return Estimate(float(data.mean()), low, high)
    weight = _weights(weights, len(data))
    return Estimate(float((data * weight).sum() / weight.sum()), low, high)


@dataclass(frozen=True)
class TaskSummary:
    """Mean reward, solve rate and pass@k over tasks, each with its interval."""

    tasks: int
    runs: int
    mean_reward: Estimate
    solve_rate: Estimate
    pass_at: dict[int, Estimate] = field(default_factory=dict)


def summarize(
    rewards_by_task: Sequence[Sequence[float]],
    *,
    k: Sequence[int] = (1,),
    solve_threshold: float = 1.0,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
) -> TaskSummary:
    """Summarize the rewards of each task's runs: a run solved its task when its reward is
    at least ``solve_threshold``; pass@k for each ``k`` (at most the runs of every task).

    Example:
        >>> s = summarize([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]], k=(1, 2))
        >>> s.mean_reward.value, s.pass_at[2].value
        (0.5, 0.6666666666666666)
    """
    tasks = [list(runs) for runs in rewards_by_task]
    if not tasks:
        raise ValueError("nothing to summarize: no tasks")
    if any(not runs for runs in tasks):
        raise ValueError("every task needs at least one run")
    if any(not math.isfinite(r) for runs in tasks for r in runs):
        raise ValueError("rewards must be finite numbers")
    fewest = min(len(runs) for runs in tasks)
    for each in k:
        if not 1 <= each <= fewest:
            raise ValueError(f"pass@{each} needs 1 <= k <= the runs per task ({fewest})")
    solved = [sum(r >= solve_threshold for r in runs) for runs in tasks]
    interval = functools.partial(estimate, resamples=resamples, confidence=confidence, seed=seed)
    return TaskSummary(
        tasks=len(tasks),
        runs=sum(len(runs) for runs in tasks),
        mean_reward=interval([sum(runs) / len(runs) for runs in tasks]),
        solve_rate=interval([c / len(runs) for c, runs in zip(solved, tasks, strict=True)]),
        pass_at={
            each: interval(
                [pass_at_k(len(runs), c, each) for c, runs in zip(solved, tasks, strict=True)]
            )
            for each in sorted(set(k))
        },
    )
