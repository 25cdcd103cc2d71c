"""What a set of agent runs shows: per-run statistics, validation summaries, the before/after
table printed at the end of training, and why a step had nothing to learn from.

The table states mean reward and solved share with their 95% bootstrap intervals, resampled
by task (``art_core.evals.before_after``): the runs of one task succeed or fail together, so
it is the number of tasks, not of runs, that says how far a difference can be trusted.

The agent-level diagnoses (``agent_diagnoses``) read what ``art_core.diagnoses`` cannot know:
a command-line agent's exit status, its time limit, its check's exit status, and whether it
reached the model at all. They are ``art_core.diagnoses.Diagnosis`` objects, so they go into
the same step records and the same final table as the backend's own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from statistics import mean

import art_core as art
from art_core.diagnoses import Diagnosis
from art_core.evals.before_after import (
    SOLVED_AT,
    Row,
    mean_reward_by_task,
    reward_rows,
    solved_by_task,
    solved_share,
)
from art_core.evals.before_after import before_after_table as _table
from art_core.evals.stats import Estimate

# Rewards closer than this are equal (as the trainer sees a group without advantage).
EQUAL_WITHIN = 1e-9
# The agent-level rules fire past these shares of a step's runs: a few runs that crashed or
# ran out of time are noise; a quarter of them is a setting to change.
NO_CALLS_SHARE = 0.25
AGENT_ERROR_SHARE = 0.25
TIMEOUT_SHARE = 0.25
# Exit statuses of ``sh -c CHECK`` that mean the check itself could not run (POSIX: 126 found
# but not executable, 127 not found): any such run is a broken task, not a wrong answer.
CHECK_CANNOT_RUN = {126: "not executable", 127: "command not found"}


def _metric(trajectory: art.Trajectory, name: str, default: float) -> float:
    value = trajectory.metrics.get(name, default)
    return float(value)


@dataclass(frozen=True)
class RunStats:
    """What the agent did over some runs: how many, mean agent seconds, how many timed out,
    how many exited with a status other than 0 (timeouts not counted), the mean prompt tokens
    of each run's first call (runs with a call), the mean calls per run, and how many runs
    made no call.

    Example:
        >>> runs = [art.Trajectory(reward=1.0, metrics={"exit_code": 0, "agent_seconds": 2.0}),
        ...         art.Trajectory(reward=0.0, metrics={"exit_code": -1, "timed_out": True,
        ...                                             "agent_seconds": 4.0})]
        >>> RunStats.of(runs)
        RunStats(runs=2, agent_s=3.0, timeouts=1, nonzero_exits=0, first_prompt_tokens=0.0, calls=0.0, no_calls=2)
    """

    runs: int = 0
    agent_s: float = 0.0
    timeouts: int = 0
    nonzero_exits: int = 0
    first_prompt_tokens: float = 0.0
    calls: float = 0.0
    no_calls: int = 0

    @classmethod
    def of(cls, trajectories: Iterable[art.Trajectory]) -> RunStats:
        runs = list(trajectories)
        if not runs:
            return cls()
        timed_out = [bool(t.metrics.get("timed_out")) for t in runs]
        first = [t.calls[0].num_prompt_tokens for t in runs if t.calls]
        return cls(
            runs=len(runs),
            agent_s=mean(_metric(t, "agent_seconds", 0.0) for t in runs),
            timeouts=sum(timed_out),
            nonzero_exits=sum(
                1
                for t, out in zip(runs, timed_out, strict=True)
                if not out and _metric(t, "exit_code", 0) != 0
            ),
            first_prompt_tokens=mean(first) if first else 0.0,
            calls=mean(float(len(t.calls)) for t in runs),
            no_calls=sum(1 for t in runs if not t.calls),
        )


@dataclass
class ValSummary:
    """One validation pass (at one adapter step): the rewards of each task's runs (one list
    per task), the rollouts that raised, and what the agent did.

    Example:
        >>> summary = ValSummary(0, [[1.0, 1.0], [0.0, 1.0]])
        >>> summary.mean_reward, summary.solved
        (0.75, 0.75)
    """

    step: int
    tasks: list[list[float]] = field(default_factory=list)
    failed_rollouts: int = 0
    runs: RunStats = field(default_factory=RunStats)

    @property
    def rewards(self) -> list[float]:
        return [reward for runs in self.tasks for reward in runs]

    @property
    def mean_reward(self) -> float:
        return mean(self.rewards) if self.rewards else 0.0

    @property
    def solved(self) -> float:
        """The share of runs with a full reward (>= ``SOLVED_AT``)."""
        return solved_share(self.rewards)

    def mean_reward_interval(self, *, seed: int = 0) -> Estimate | None:
        """``mean_reward`` (a mean over runs) with its 95% interval, resampled by task; None
        without runs.

        Example:
            >>> str(ValSummary(0, [[1.0, 1.0], [0.0]]).mean_reward_interval())
            '0.667 [0.000, 1.000]'
        """
        return mean_reward_by_task(self.tasks, seed=seed)

    def solved_interval(self, *, seed: int = 0) -> Estimate | None:
        """``solved`` (a share of runs) with its 95% interval, resampled by task; None without
        runs."""
        return solved_by_task(self.tasks, seed=seed)

    @classmethod
    def of(cls, step: int, groups: Sequence[art.TrajectoryGroup]) -> ValSummary:
        """Summarize the groups (one per task) of a validation pass.

        Example:
            >>> ValSummary.of(3, [art.TrajectoryGroup([art.Trajectory(reward=1.0)])]).tasks
            [[1.0]]
        """
        return cls(
            step=step,
            tasks=[[t.reward for t in g.trajectories] for g in groups],
            failed_rollouts=sum(len(g.exceptions) for g in groups),
            runs=RunStats.of(t for g in groups for t in g.trajectories),
        )


def _count(count: int, runs: int) -> str:
    return f"{count} of {runs}"


def before_after_table(before: ValSummary, after: ValSummary, *, title: str = "") -> str:
    """A plain-text table comparing two validation passes: mean reward and solved share with
    their 95% bootstrap intervals (resampled by task), then what the agent did.

    Example:
        >>> before = ValSummary(0, [[0.0, 0.5], [0.0, 0.5]])
        >>> after = ValSummary(2, [[1.0, 1.0], [0.5, 1.0]])
        >>> print(before_after_table(before, after))  # doctest: +NORMALIZE_WHITESPACE
        metric                            before (step 0)          after (step 2)
        mean reward                  0.250 [0.250, 0.250]    0.875 [0.750, 1.000]
        solved (reward = 1)             0.0% [0.0%, 0.0%]  75.0% [50.0%, 100.0%]
        agent exit status != 0                     0 of 0                  0 of 0
        agent timed out                            0 of 0                  0 of 0
        model calls per run                          0.00                    0.00
        prompt tokens, first call                       0                       0
        agent seconds per run                         0.0                     0.0
        runs (failed)                               4 (0)                   4 (0)
        tasks                                           2                       2
        [low, high]: 95% bootstrap intervals, resampled by task
    """
    rows: list[Row] = [
        *reward_rows(before.tasks, after.tasks),
        (
            "agent exit status != 0",
            _count(before.runs.nonzero_exits, before.runs.runs),
            _count(after.runs.nonzero_exits, after.runs.runs),
        ),
        (
            "agent timed out",
            _count(before.runs.timeouts, before.runs.runs),
            _count(after.runs.timeouts, after.runs.runs),
        ),
        ("model calls per run", f"{before.runs.calls:.2f}", f"{after.runs.calls:.2f}"),
        (
            "prompt tokens, first call",
            f"{before.runs.first_prompt_tokens:.0f}",
            f"{after.runs.first_prompt_tokens:.0f}",
        ),
        ("agent seconds per run", f"{before.runs.agent_s:.1f}", f"{after.runs.agent_s:.1f}"),
        (
            "runs (failed)",
            f"{len(before.rewards)} ({before.failed_rollouts})",
            f"{len(after.rewards)} ({after.failed_rollouts})",
        ),
        (
            "tasks",
            str(sum(1 for runs in before.tasks if runs)),
            str(sum(1 for runs in after.tasks if runs)),
        ),
    ]
    return _table(before.step, after.step, rows, unit="task", title=title, name_width=27)


def _stderr_line(trajectory: art.Trajectory) -> str | None:
    """The last non-empty line the agent wrote to stderr, from the run's logs."""
    for entry in trajectory.logs:
        if entry.startswith("stderr (end):"):
            lines = [line.strip() for line in entry.splitlines()[1:] if line.strip()]
            return lines[-1][:200] if lines else None
    return None


def _share(count: int, total: int) -> float:
    return count / total if total else 0.0


def agent_diagnoses(groups: Sequence[art.TrajectoryGroup]) -> list[Diagnosis]:
    """What the runs' exit statuses, time limits, checks and calls say about a step, as
    ``Diagnosis`` rules (see the thresholds above), most basic first: a check that cannot run,
    runs that never reached the model, runs that crashed, runs that ran out of time.

    Example:
        >>> runs = [art.Trajectory(reward=0.0, metrics={"exit_code": 127}) for _ in range(4)]
        >>> [d.code for d in agent_diagnoses([art.TrajectoryGroup(runs)])]
        ['agent_no_calls', 'agent_errors']
    """
    runs = [t for g in groups for t in g.trajectories]
    stats = RunStats.of(runs)
    rules = (
        _check_cannot_run(runs),
        _no_calls(stats, len(runs)),
        _agent_errors(runs, stats),
        _timeouts(stats, len(runs)),
    )
    return [diagnosis for diagnosis in rules if diagnosis is not None]


def _check_cannot_run(runs: list[art.Trajectory]) -> Diagnosis | None:
    """``check_cannot_run``: the task's check could not run in some runs."""
    total = len(runs)
    broken = Counter(
        int(_metric(t, "check_exit_code", 0))
        for t in runs
        if int(_metric(t, "check_exit_code", 0)) in CHECK_CANNOT_RUN
    )
    if not broken:
        return None
    code, _ = broken.most_common(1)[0]
    names = sorted({str(t.metadata.get("task", "?")) for t in runs})
    return Diagnosis(
        code="check_cannot_run",
        finding=(
            f"the check could not run in {sum(broken.values())} of {total} runs "
            f"(exit {code}: {CHECK_CANNOT_RUN[code]}; tasks: {', '.join(names)})"
        ),
        setting=(
            "fix the task's check: run it by hand in a copy of the task's files/ "
            "(a program missing from PATH, or a script not reached as ${task_dir}/check/...)"
        ),
        share=_share(sum(broken.values()), total),
        threshold=0.0,
    )


def _no_calls(stats: RunStats, total: int) -> Diagnosis | None:
    """``agent_no_calls``: runs that never reached the model."""
    if not (stats.no_calls and _share(stats.no_calls, total) >= NO_CALLS_SHARE):
        return None
    return Diagnosis(
        code="agent_no_calls",
        finding=f"{stats.no_calls} of {total} runs made no call to the model",
        setting=(
            "make the agent reach the gateway: it must read the run's OPENAI_BASE_URL / "
            "ANTHROPIC_BASE_URL (or a config file written from ${openai_base_url}) and "
            "ask for ${model}; read a run's logs (trajectory.logs)"
        ),
        share=_share(stats.no_calls, total),
        threshold=NO_CALLS_SHARE,
    )


def _agent_errors(runs: list[art.Trajectory], stats: RunStats) -> Diagnosis | None:
    """``agent_errors``: runs whose agent exited with an error (not the time limit)."""
    total = len(runs)
    if not (stats.nonzero_exits and _share(stats.nonzero_exits, total) >= AGENT_ERROR_SHARE):
        return None
    failing = [
        t for t in runs if not t.metrics.get("timed_out") and _metric(t, "exit_code", 0) != 0
    ]
    codes = Counter(int(_metric(t, "exit_code", 0)) for t in failing)
    example = next((line for t in failing if (line := _stderr_line(t))), None)
    return Diagnosis(
        code="agent_errors",
        finding=(
            f"{stats.nonzero_exits} of {total} runs exited with an error ("
            + ", ".join(f"exit {code} x{n}" for code, n in codes.most_common())
            + ")"
            + (f", e.g. {example!r}" if example else "")
        ),
        setting=(
            "read a run's logs (trajectory.logs): a missing binary, a refused request, "
            "or a context too small for the agent's prompt "
            f"(first call: {stats.first_prompt_tokens:.0f} prompt tokens)"
        ),
        share=_share(stats.nonzero_exits, total),
        threshold=AGENT_ERROR_SHARE,
    )


def _timeouts(stats: RunStats, total: int) -> Diagnosis | None:
    """``agent_timeouts``: runs killed at the time limit."""
    if not (stats.timeouts and _share(stats.timeouts, total) >= TIMEOUT_SHARE):
        return None
    return Diagnosis(
        code="agent_timeouts",
        finding=(
            f"{stats.timeouts} of {total} runs were killed at the time limit "
            f"(mean run {stats.agent_s:.0f} s)"
        ),
        setting="raise Limits(timeout_s=...), cap the agent's answers, or give smaller tasks",
        share=_share(stats.timeouts, total),
        threshold=TIMEOUT_SHARE,
    )


def _spread(group: art.TrajectoryGroup) -> float:
    rewards = [t.reward for t in group.trajectories]
    return max(rewards) - min(rewards)


def flat_reason(
    groups: Sequence[art.TrajectoryGroup], agent: Sequence[Diagnosis] = ()
) -> str | None:
    """Why a step's groups give GRPO nothing to learn from, read from the records, with what
    to try; None when some group's rewards differ. ``agent``: the step's
    ``agent_diagnoses``, which say why better than the rewards do when they fired.

    Example:
        >>> zero = art.TrajectoryGroup([art.Trajectory(reward=0.0), art.Trajectory(reward=0.0)])
        >>> print(flat_reason([zero, zero]))
        all 2 groups scored 0 on every run: the agent solves none of these tasks; try more rollouts per group, a higher temperature, easier tasks, or a warm start
        >>> mixed = art.TrajectoryGroup([art.Trajectory(reward=0.0), art.Trajectory(reward=1.0)])
        >>> flat_reason([zero, mixed]) is None
        True
    """
    scored = [g for g in groups if g.trajectories]
    if not scored:
        errors = [e for g in groups for e in g.exceptions]
        example = f", e.g. {errors[0].type}: {errors[0].message[:200]}" if errors else ""
        return f"every run raised ({len(errors)} exceptions){example}: nothing to train on"
    if any(_spread(g) > EQUAL_WITHIN for g in scored):
        return None
    because = "; ".join(f"{d.finding} -> {d.setting}" for d in agent)
    values = sorted({round(t.reward, 9) for g in scored for t in g.trajectories})
    if len(values) == 1:
        head = f"all {len(scored)} groups scored {values[0]:g} on every run"
        if because:
            return f"{head}: {because}"
        if values[0] >= SOLVED_AT:
            return f"{head}: the agent solves every one of these tasks already; give harder tasks"
        return (
            f"{head}: the agent solves none of these tasks; try more rollouts per group, a "
            "higher temperature, easier tasks, or a warm start"
        )
    per_task = ", ".join(
        f"{g.trajectories[0].metadata.get('task', f'group {i}')} {g.trajectories[0].reward:g}"
        for i, g in enumerate(scored)
    )
    head = f"each of the {len(scored)} groups scored alike on all its runs ({per_task})"
    return f"{head}: " + (
        because
        or "each task is all-or-nothing for the agent at this group size; try more rollouts per "
        "group, or tasks it solves only some of the time"
    )
