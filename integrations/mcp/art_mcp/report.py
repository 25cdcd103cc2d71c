"""Summaries of validation passes and the before/after table printed at the end of training.

The table states mean reward and solved share with their 95% bootstrap intervals, resampled
by scenario (``art_core.evals.before_after``): the runs of one scenario succeed or fail
together, so it is the number of scenarios, not of runs, that says how far a difference can
be trusted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import mean

import art_core as art
from art_core.evals.before_after import (
    Row,
    mean_reward_by_task,
    reward_rows,
    solved_by_task,
    solved_share,
)
from art_core.evals.before_after import before_after_table as _table
from art_core.evals.stats import Estimate


@dataclass
class ValSummary:
    """What one validation pass measured (at one adapter step).

    ``scenarios`` holds the rewards of each scenario's runs (one list per scenario, the
    finished runs of its group); left empty, each reward counts as a scenario of its own.
    """

    step: int
    rewards: list[float] = field(default_factory=list)
    completed: float = 0.0
    tool_calls: float = 0.0
    tool_errors: float = 0.0
    failed_rollouts: int = 0
    scenarios: list[list[float]] = field(default_factory=list)

    @property
    def mean_reward(self) -> float:
        return mean(self.rewards) if self.rewards else 0.0

    @property
    def solved(self) -> float:
        """The share of runs with a full reward (>= 0.999)."""
        return solved_share(self.rewards)

    def by_scenario(self) -> list[list[float]]:
        """The rewards grouped by scenario (scenarios without a finished run left out)."""
        groups = self.scenarios or [[reward] for reward in self.rewards]
        return [list(runs) for runs in groups if runs]

    def mean_reward_interval(self, *, seed: int = 0) -> Estimate | None:
        """``mean_reward`` (a mean over runs) with its 95% interval, resampled by scenario;
        None without runs.

        Example:
            >>> str(ValSummary(0, [1.0, 1.0, 0.0], scenarios=[[1.0, 1.0], [0.0]]).mean_reward_interval())
            '0.667 [0.000, 1.000]'
        """
        return mean_reward_by_task(self.by_scenario(), seed=seed)

    def solved_interval(self, *, seed: int = 0) -> Estimate | None:
        """``solved`` (a share of runs) with its 95% interval, resampled by scenario; None
        without runs."""
        return solved_by_task(self.by_scenario(), seed=seed)

    @classmethod
    def of(cls, step: int, groups: list[art.TrajectoryGroup]) -> ValSummary:
        """Summarize the groups of a validation pass.

        Example:
            >>> ValSummary.of(0, [art.TrajectoryGroup([art.Trajectory(reward=1.0)])]).mean_reward
            1.0
        """
        runs = [t for g in groups for t in g.trajectories]
        summary = cls(
            step=step,
            rewards=[t.reward for t in runs],
            scenarios=[[t.reward for t in g.trajectories] for g in groups],
        )
        summary.failed_rollouts = sum(len(g.exceptions) for g in groups)
        if runs:
            summary.completed = mean(float(bool(t.metrics.get("completed"))) for t in runs)
            summary.tool_calls = mean(float(t.metrics.get("tool_calls", 0)) for t in runs)
            summary.tool_errors = mean(float(t.metrics.get("tool_errors", 0)) for t in runs)
        return summary


def before_after_table(before: ValSummary, after: ValSummary, *, title: str = "") -> str:
    """A plain-text table comparing two validation passes; mean reward and solved share with
    their 95% bootstrap intervals, resampled by scenario.

    Example:
        >>> before = ValSummary(0, [0.0, 0.5, 0.0, 0.5], scenarios=[[0.0, 0.5], [0.0, 0.5]])
        >>> after = ValSummary(5, [1.0, 1.0, 0.5, 1.0], scenarios=[[1.0, 1.0], [0.5, 1.0]])
        >>> print(before_after_table(before, after))  # doctest: +NORMALIZE_WHITESPACE
        metric                       before (step 0)          after (step 5)
        mean reward             0.250 [0.250, 0.250]    0.875 [0.750, 1.000]
        solved (reward = 1)        0.0% [0.0%, 0.0%]  75.0% [50.0%, 100.0%]
        finished the task                       0.0%                    0.0%
        tool calls per run                      0.00                    0.00
        tool errors per run                     0.00                    0.00
        runs (failed)                          4 (0)                   4 (0)
        scenarios                                  2                       2
        [low, high]: 95% bootstrap intervals, resampled by scenario
    """
    rows: list[Row] = [
        *reward_rows(before.by_scenario(), after.by_scenario()),
        ("finished the task", f"{before.completed:.1%}", f"{after.completed:.1%}"),
        ("tool calls per run", f"{before.tool_calls:.2f}", f"{after.tool_calls:.2f}"),
        ("tool errors per run", f"{before.tool_errors:.2f}", f"{after.tool_errors:.2f}"),
        (
            "runs (failed)",
            f"{len(before.rewards)} ({before.failed_rollouts})",
            f"{len(after.rewards)} ({after.failed_rollouts})",
        ),
        ("scenarios", str(len(before.by_scenario())), str(len(after.by_scenario()))),
    ]
    return _table(before.step, after.step, rows, unit="scenario", title=title)
