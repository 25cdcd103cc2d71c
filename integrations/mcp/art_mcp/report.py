"""Summaries of validation passes and the before/after table printed at the end of training."""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import mean

import art_core as art


@dataclass
class ValSummary:
    """What one validation pass measured (at one adapter step)."""

    step: int
    rewards: list[float] = field(default_factory=list)
    completed: float = 0.0
    tool_calls: float = 0.0
    tool_errors: float = 0.0
    failed_rollouts: int = 0

    @property
    def mean_reward(self) -> float:
        return mean(self.rewards) if self.rewards else 0.0

    @property
    def solved(self) -> float:
        """The share of runs with a full reward (>= 0.999)."""
        return sum(r >= 0.999 for r in self.rewards) / len(self.rewards) if self.rewards else 0.0

    @classmethod
    def of(cls, step: int, groups: list[art.TrajectoryGroup]) -> ValSummary:
        """Summarize the groups of a validation pass.

        Example:
            >>> ValSummary.of(0, [art.TrajectoryGroup([art.Trajectory(reward=1.0)])]).mean_reward
            1.0
        """
        runs = [t for g in groups for t in g.trajectories]
        summary = cls(step=step, rewards=[t.reward for t in runs])
        summary.failed_rollouts = sum(len(g.exceptions) for g in groups)
        if runs:
            summary.completed = mean(float(bool(t.metrics.get("completed"))) for t in runs)
            summary.tool_calls = mean(float(t.metrics.get("tool_calls", 0)) for t in runs)
            summary.tool_errors = mean(float(t.metrics.get("tool_errors", 0)) for t in runs)
        return summary


def before_after_table(before: ValSummary, after: ValSummary, *, title: str = "") -> str:
    """A plain-text table comparing two validation passes.

    Example:
        >>> print(before_after_table(ValSummary(0, [0.2]), ValSummary(5, [0.9])))  # doctest: +NORMALIZE_WHITESPACE
        metric                  before (step 0)   after (step 5)
        mean reward                       0.200            0.900
        solved (reward = 1)                0.0%             0.0%
        finished the task                  0.0%             0.0%
        tool calls per run                 0.00             0.00
        tool errors per run                0.00             0.00
        runs (failed)                     1 (0)            1 (0)
    """
    left, right = f"before (step {before.step})", f"after (step {after.step})"
    rows = [
        ("mean reward", f"{before.mean_reward:.3f}", f"{after.mean_reward:.3f}"),
        ("solved (reward = 1)", f"{before.solved:.1%}", f"{after.solved:.1%}"),
        ("finished the task", f"{before.completed:.1%}", f"{after.completed:.1%}"),
        ("tool calls per run", f"{before.tool_calls:.2f}", f"{after.tool_calls:.2f}"),
        ("tool errors per run", f"{before.tool_errors:.2f}", f"{after.tool_errors:.2f}"),
        (
            "runs (failed)",
            f"{len(before.rewards)} ({before.failed_rollouts})",
            f"{len(after.rewards)} ({after.failed_rollouts})",
        ),
    ]
    width = max(len(left), len(right), 12)
    lines = [title] if title else []
    lines.append(f"{'metric':<22}  {left:>{width}}  {right:>{width}}")
    lines += [f"{name:<22}  {a:>{width}}  {b:>{width}}" for name, a, b in rows]
    return "\n".join(lines)
