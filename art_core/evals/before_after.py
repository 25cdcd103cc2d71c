"""Two validation passes side by side: what a training loop prints at its end.

A validation pass is the rewards of each task's runs (one list per task, or per scenario).
Its mean reward and solved share are means over runs, with 95% bootstrap intervals that
resample whole tasks (``stats.estimate``): the runs of one task succeed or fail together,
so it is the number of tasks, not of runs, that says how far a difference can be trusted.

The integrations' training loops (``art_mcp.train``, ``art_cli_agents.train``) print these
two rows first, then rows of their own (tool calls; an agent's exits and timeouts), in the
table ``before_after_table`` lays out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from statistics import fmean

from art_core.evals.stats import Estimate, estimate

# A run solved its task at a full reward (float noise allowed).
SOLVED_AT = 0.999

# One row of a before/after table: the metric's name, its value before and after.
Row = tuple[str, str, str]


def solved_share(rewards: Sequence[float]) -> float:
    """The share of ``rewards`` that are full (>= ``SOLVED_AT``); 0.0 without any.

    Example:
        >>> solved_share([1.0, 0.9999, 0.5, 0.0])
        0.5
    """
    return sum(r >= SOLVED_AT for r in rewards) / len(rewards) if rewards else 0.0


def _by_task(
    tasks: Sequence[Sequence[float]], per_task: Callable[[Sequence[float]], float], seed: int
) -> Estimate | None:
    groups = [runs for runs in tasks if runs]
    if not groups:
        return None
    # Weighted by runs: the value is the per-run mean the pass's own numbers give.
    values = [per_task(runs) for runs in groups]
    return estimate(values, weights=[len(runs) for runs in groups], seed=seed)


def mean_reward_by_task(tasks: Sequence[Sequence[float]], *, seed: int = 0) -> Estimate | None:
    """The mean reward over runs with its 95% interval, resampled by task; None without runs.

    Example:
        >>> str(mean_reward_by_task([[1.0, 1.0], [0.0]]))
        '0.667 [0.000, 1.000]'
    """
    return _by_task(tasks, fmean, seed)


def solved_by_task(tasks: Sequence[Sequence[float]], *, seed: int = 0) -> Estimate | None:
    """The solved share of runs with its 95% interval, resampled by task; None without runs.

    Example:
        >>> solved_by_task([[1.0, 0.0], [1.0, 1.0]]).percent()
        '75.0% [50.0%, 100.0%]'
    """
    return _by_task(tasks, solved_share, seed)


def _cell(value: Estimate | None, *, percent: bool) -> str:
    if value is None:
        return "no runs"
    return value.percent() if percent else str(value)


def reward_rows(before: Sequence[Sequence[float]], after: Sequence[Sequence[float]]) -> list[Row]:
    """The first rows of a before/after table: mean reward and solved share, each with its
    interval, from the rewards of each task's runs before and after.

    Example:
        >>> reward_rows([[0.0, 1.0]], [[1.0, 1.0]])[1]
        ('solved (reward = 1)', '50.0% [50.0%, 50.0%]', '100.0% [100.0%, 100.0%]')
    """
    return [
        (
            "mean reward",
            _cell(mean_reward_by_task(before), percent=False),
            _cell(mean_reward_by_task(after), percent=False),
        ),
        (
            "solved (reward = 1)",
            _cell(solved_by_task(before), percent=True),
            _cell(solved_by_task(after), percent=True),
        ),
    ]


def before_after_table(
    before_step: int,
    after_step: int,
    rows: Sequence[Row],
    *,
    unit: str = "task",
    title: str = "",
    name_width: int = 22,
) -> str:
    """A plain-text table of ``rows`` (name, before, after) under the two passes' steps,
    ending with what the intervals are (resampled by ``unit``).

    Example:
        >>> print(before_after_table(0, 3, reward_rows([[0.0, 1.0]], [[1.0, 1.0]])))
        metric                          before (step 0)           after (step 3)
        mean reward                0.500 [0.500, 0.500]     1.000 [1.000, 1.000]
        solved (reward = 1)        50.0% [50.0%, 50.0%]  100.0% [100.0%, 100.0%]
        [low, high]: 95% bootstrap intervals, resampled by task
    """
    left, right = f"before (step {before_step})", f"after (step {after_step})"
    width = max(len(left), len(right), *(len(cell) for _, a, b in rows for cell in (a, b)))
    lines = [title] if title else []
    lines.append(f"{'metric':<{name_width}}  {left:>{width}}  {right:>{width}}")
    lines += [f"{name:<{name_width}}  {a:>{width}}  {b:>{width}}" for name, a, b in rows]
    lines.append(f"[low, high]: 95% bootstrap intervals, resampled by {unit}")
    return "\n".join(lines)
