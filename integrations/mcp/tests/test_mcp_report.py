"""The before/after table states mean reward and solved share with 95% intervals resampled
by scenario (a validation pass's groups are its scenarios)."""

from __future__ import annotations

import pytest
from art_mcp.report import ValSummary, before_after_table

import art_core as art


def groups(*scenarios: list[float], failed: int = 0) -> list[art.TrajectoryGroup]:
    made = [art.TrajectoryGroup([art.Trajectory(reward=r) for r in runs]) for runs in scenarios]
    made[0].exceptions.extend(
        art.RolloutException.from_exception(RuntimeError("boom")) for _ in range(failed)
    )
    return made


def test_the_summary_keeps_each_scenarios_runs_together() -> None:
    summary = ValSummary.of(3, groups([1.0, 1.0, 1.0], [0.0], failed=1))
    assert summary.scenarios == [[1.0, 1.0, 1.0], [0.0]] and summary.failed_rollouts == 1
    assert summary.rewards == [1.0, 1.0, 1.0, 0.0] and summary.mean_reward == 0.75
    interval = summary.mean_reward_interval()
    assert interval is not None and interval.value == 0.75  # the per-run mean, as before
    # Resampled by scenario: a resample holds only the solved one or only the failed one,
    # so the interval spans 0..1; resampling the 4 runs alone would give a narrower one.
    assert (interval.low, interval.high) == (0.0, 1.0)
    solved = summary.solved_interval()
    assert solved is not None and (solved.value, solved.low, solved.high) == (0.75, 0.0, 1.0)


def test_a_summary_without_runs_says_so() -> None:
    empty = ValSummary(0)
    assert empty.mean_reward_interval() is None and empty.by_scenario() == []
    table = before_after_table(empty, ValSummary(1, [1.0]))
    assert "no runs" in table


def test_the_table_states_every_interval() -> None:
    before = ValSummary.of(0, groups([0.0, 0.0], [0.0, 1.0], [0.5, 0.5]))
    after = ValSummary.of(4, groups([1.0, 1.0], [1.0, 1.0], [0.5, 1.0]))
    table = before_after_table(before, after, title="shop")
    lines = table.splitlines()
    assert lines[0] == "shop"
    mean_line = next(line for line in lines if line.startswith("mean reward"))
    assert str(before.mean_reward_interval()) in mean_line
    assert str(after.mean_reward_interval()) in mean_line
    assert f"{before.mean_reward:.3f} [" in mean_line and f"{after.mean_reward:.3f} [" in mean_line
    solved_line = next(line for line in lines if line.startswith("solved (reward = 1)"))
    after_solved = after.solved_interval()
    assert after_solved is not None and after_solved.percent() in solved_line
    assert after.solved == pytest.approx(5 / 6)
    assert lines[-1] == "[low, high]: 95% bootstrap intervals, resampled by scenario"
    assert any(line.split() == ["scenarios", "3", "3"] for line in lines)
