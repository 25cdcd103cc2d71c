"""``ScenarioHistory``: how often each scenario was solved lately, and what to sample next.

A scenario's recent outcomes (the last ``window`` rollouts: reward >= ``success_threshold``
or not) say whether it is solved always, never, or is being learned. The curriculum weight of
a scenario is the chance that a fresh group of its rollouts carries a learning signal,
``1 - p**G - (1 - p)**G``: highest at a 50% success rate, small (never zero) for scenarios
solved always or never. ``p`` is shrunk toward the pool's success rate, so an untried
scenario in a pool that is almost never solved is not assumed to be a coin flip.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Prior strength (in rollouts) of the pool's success rate in a scenario's estimate.
PRIOR_ROLLOUTS = 2.0
# Floor of a curriculum weight: every scenario keeps some chance to be sampled.
MIN_WEIGHT = 1e-6


class ScenarioOutcomes(BaseModel):
    """One scenario's record: all-time counts and the most recent outcomes (True = solved)."""

    model_config = ConfigDict(extra="forbid")

    attempts: int = Field(default=0, ge=0)
    successes: int = Field(default=0, ge=0)
    recent: list[bool] = Field(default_factory=list)


class ScenarioDistribution(BaseModel):
    """How the scenarios stand: untried, solved never / always in their recent rollouts, or
    being learned (some solved, some not).

    Example:
        >>> ScenarioDistribution(total=4, untried=1, never_solved=2, learning=1).never_solved_share
        0.6666666666666666
    """

    model_config = ConfigDict(extra="forbid")

    total: int = 0
    untried: int = 0
    never_solved: int = 0
    always_solved: int = 0
    learning: int = 0

    @property
    def tried(self) -> int:
        return self.total - self.untried

    @property
    def never_solved_share(self) -> float:
        """Share of the tried scenarios that no recent rollout solved (0 when none tried)."""
        return self.never_solved / self.tried if self.tried else 0.0

    def metrics(self) -> dict[str, float]:
        """Shares of the tried scenarios, and how many were tried, as flat metrics."""
        tried = self.tried or 1
        return {
            "scenarios_tried": float(self.tried),
            "scenarios_never_solved": self.never_solved / tried if self.tried else 0.0,
            "scenarios_always_solved": self.always_solved / tried if self.tried else 0.0,
            "scenarios_learning": self.learning / tried if self.tried else 0.0,
        }

    def summary(self) -> str:
        """One line, e.g. ``12 scenarios: 3 untried, 6 never solved, 1 always, 2 learning``."""
        return (
            f"{self.total} scenarios: {self.untried} untried, {self.never_solved} never solved, "
            f"{self.always_solved} always, {self.learning} learning"
        )


class ScenarioHistory(BaseModel):
    """Per-scenario success, kept across steps (JSON round-trips: save it to resume).

    Example:
        >>> history = ScenarioHistory(window=4)
        >>> history.record("a", [0.0, 1.0]); history.record("b", [0.0, 0.0])
        >>> history.success_rate("a"), history.success_rate("b"), history.success_rate("c")
        (0.5, 0.0, None)
        >>> history.distribution(["a", "b", "c"]).summary()
        '3 scenarios: 1 untried, 1 never solved, 0 always, 1 learning'
    """

    model_config = ConfigDict(extra="forbid")

    window: int = Field(default=32, ge=1, le=100_000, description="Recent rollouts per scenario.")
    success_threshold: float = Field(
        default=1.0, description="A rollout solved its scenario when reward >= this."
    )
    scenarios: dict[str, ScenarioOutcomes] = Field(default_factory=dict)

    @field_validator("success_threshold")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("success_threshold must be a finite number")
        return value

    def record(self, key: str, rewards: Iterable[float]) -> None:
        """Add the rewards of some rollouts of scenario ``key``."""
        outcomes = self.scenarios.setdefault(key, ScenarioOutcomes())
        for reward in rewards:
            solved = reward >= self.success_threshold
            outcomes.attempts += 1
            outcomes.successes += solved
            outcomes.recent.append(solved)
        del outcomes.recent[: -self.window]

    def success_rate(self, key: str) -> float | None:
        """The share of ``key``'s recent rollouts that solved it (None: never tried)."""
        outcomes = self.scenarios.get(key)
        if outcomes is None or not outcomes.recent:
            return None
        return sum(outcomes.recent) / len(outcomes.recent)

    def pool_rate(self) -> float:
        """The recent success rate over all scenarios, smoothed into (0, 1)."""
        solved = sum(sum(o.recent) for o in self.scenarios.values())
        runs = sum(len(o.recent) for o in self.scenarios.values())
        return (solved + 1) / (runs + 2)

    def weights(self, keys: Sequence[str], group_size: int) -> list[float]:
        """Curriculum weights of ``keys``: the chance a group of ``group_size`` has signal.

        Example:
            >>> history = ScenarioHistory()
            >>> history.record("half", [1.0, 0.0] * 4); history.record("never", [0.0] * 8)
            >>> [round(w, 2) for w in history.weights(["half", "never"], 8)]
            [0.99, 0.37]
        """
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        prior = self.pool_rate()
        out = []
        for key in keys:
            outcomes = self.scenarios.get(key)
            solved = sum(outcomes.recent) if outcomes else 0
            runs = len(outcomes.recent) if outcomes else 0
            p = (solved + PRIOR_ROLLOUTS * prior) / (runs + PRIOR_ROLLOUTS)
            out.append(max(1.0 - p**group_size - (1.0 - p) ** group_size, MIN_WEIGHT))
        return out

    def distribution(self, keys: Iterable[str]) -> ScenarioDistribution:
        """Where the scenarios ``keys`` stand (untried / never / always / learning)."""
        counts = ScenarioDistribution()
        for key in keys:
            counts.total += 1
            outcomes = self.scenarios.get(key)
            if outcomes is None or not outcomes.recent:
                counts.untried += 1
            elif not any(outcomes.recent):
                counts.never_solved += 1
            elif all(outcomes.recent):
                counts.always_solved += 1
            else:
                counts.learning += 1
        return counts
