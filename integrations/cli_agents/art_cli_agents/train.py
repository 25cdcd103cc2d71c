"""``train``: tasks -> groups of runs of a command-line agent -> checks -> GRPO steps.

Each step takes ``groups_per_step`` tasks (a seeded shuffle, epoch by epoch, so a resumed run
continues the same schedule), runs the agent ``rollouts_per_group`` times on each (each run in
its own copy of the task's folder, ``art_cli_agents.rollout``), scores each run with the
task's check and calls ``model.train``. A validation pass runs before the first step and
after the last; the report compares them. The step counter is the model's checkpoint step, so
running ``train`` again resumes where it stopped.

A step whose groups all scored alike within themselves trains nothing (GRPO learns from the
differences inside a group): its record says so and why, read from the runs (the rewards, and
the agent's exit statuses, time limits and calls: ``art_cli_agents.report``), beside the
diagnoses the backend returns (``art_core.diagnoses``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from statistics import mean, pstdev
from typing import Any, TextIO, TypedDict, Unpack

from tqdm.auto import tqdm

import art_core as art
from art_cli_agents.agents import CLIAgent
from art_cli_agents.report import (
    EQUAL_WITHIN,
    RunStats,
    ValSummary,
    agent_diagnoses,
    before_after_table,
    flat_reason,
)
from art_cli_agents.rollout import Task, rollout, run_sampling
from art_cli_agents.sandbox import Filesystem, Limits, Network
from art_cli_agents.tasks import task_name
from art_core.diagnoses import Diagnosis, RunDiagnoses
from art_core.epochs import items_for_step
from art_core.overrides import with_overrides

# Validation defaults to this many of the training tasks (the first ones).
DEFAULT_VAL_TASKS = 8
# The seed phase of validation runs (training step i is phase i + 1).
VALIDATION_PHASE = 0


@dataclass
class StepRecord:
    """One training step: its tasks, the rewards of its runs, what the agent did
    (``runs``), whether it trained and, when it did not, why."""

    step: int
    tasks: list[str]
    reward: float
    reward_std: float
    rollouts: int
    # Rollouts that raised (the agent's own failures are runs, in ``runs``).
    failed: int
    groups: int
    groups_with_signal: int
    rollout_s: float
    train_s: float
    trained: bool
    runs: RunStats = field(default_factory=RunStats)
    why_nothing_trained: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    # The agent-level rules (art_cli_agents.report) and the backend's (art_core.diagnoses).
    diagnoses: list[Diagnosis] = field(default_factory=list)

    @property
    def signal_share(self) -> float:
        """The share of groups whose rewards differed (the ones GRPO learns from)."""
        return self.groups_with_signal / self.groups if self.groups else 0.0

    def line(self) -> str:
        """One line for progress output (more when the step trained nothing).

        Example:
            >>> StepRecord(0, ["a", "b"], 0.5, 0.5, 8, 0, 2, 1, 3.0, 1.0, True).line()
            'step 0: reward 0.500 ± 0.500 over 8 runs (0 raised); 1 of 2 groups with unequal rewards; 0 agent errors, 0 timeouts, 0.0 calls per run, 0.0 s per run; rollouts 3.0 s, train 1.0 s'
        """
        runs = self.runs
        text = (
            f"step {self.step}: reward {self.reward:.3f} ± {self.reward_std:.3f} over "
            f"{self.rollouts} runs ({self.failed} raised); {self.groups_with_signal} of "
            f"{self.groups} groups with unequal rewards; {runs.nonzero_exits} agent errors, "
            f"{runs.timeouts} timeouts, {runs.calls:.1f} calls per run, {runs.agent_s:.1f} s "
            f"per run; rollouts {self.rollout_s:.1f} s, train {self.train_s:.1f} s"
        )
        if not self.trained:
            text += f"\n    trained nothing: {self.why_nothing_trained}"
        return text


@dataclass
class TrainReport:
    """What ``train`` did: per-step records and the validation passes before and after."""

    steps: list[StepRecord]
    before: ValSummary
    after: ValSummary
    wall_s: float
    # Time from the first validation's end to the last step's end.
    training_s: float = 0.0

    def diagnoses(self) -> RunDiagnoses:
        """The diagnoses of every step, with the run-level one (rewards flat over the steps)."""
        run = RunDiagnoses()
        for record in self.steps:
            run.add(
                record.step,
                reward=record.reward,
                trained=record.trained,
                diagnoses=record.diagnoses,
            )
        return run

    def table(self) -> str:
        """The before/after table, then each step that trained nothing with why, then the
        diagnoses that fired (each with the setting to change)."""
        parts = [before_after_table(self.before, self.after, title="validation, before vs after")]
        untrained = [r for r in self.steps if not r.trained]
        if untrained:
            parts.append(
                f"steps that trained nothing ({len(untrained)} of {len(self.steps)})\n"
                + "\n".join(f"  step {r.step}: {r.why_nothing_trained}" for r in untrained)
            )
        why = self.diagnoses().table()
        if why:
            parts.append(why)
        return "\n\n".join(parts)


def tasks_for_step(
    tasks: Sequence[Task], step: int, groups_per_step: int, seed: int = 0
) -> list[Task]:
    """The tasks of step ``step``: consecutive slices of a seeded shuffle, epoch by epoch (so
    every task comes once per epoch, and a resumed run continues the schedule).

    Example:
        >>> pool = [Task(f"task {i}") for i in range(5)]
        >>> [t.prompt for t in tasks_for_step(pool, 0, 5)] == sorted(t.prompt for t in pool)
        False
        >>> sorted(t.prompt for t in tasks_for_step(pool, 0, 5)) == [t.prompt for t in pool]
        True
        >>> tasks_for_step(pool, 3, 2) == tasks_for_step(pool, 3, 2)
        True
    """
    if not tasks:
        raise ValueError("no tasks to train on")
    return items_for_step(tasks, step, groups_per_step, seed)


def _note_failures(groups: Sequence[art.TrajectoryGroup], errlog: TextIO | None) -> None:
    """One line per run whose agent failed or timed out, and per rollout that raised."""
    if errlog is None:
        return
    for group in groups:
        name = group.metadata.get("task", "?")
        for t in group.trajectories:
            timed_out = bool(t.metrics.get("timed_out"))
            code = t.metrics.get("exit_code", 0)
            if timed_out or code != 0:
                stderr = next((e for e in t.logs if e.startswith("stderr (end):")), "")
                last = [line for line in stderr.splitlines()[1:] if line.strip()][-1:]
                status = "timed out" if timed_out else f"exit {code}"
                errlog.write(f"[{name}] agent {status}" + (f": {last[0]}" if last else "") + "\n")
        for exc in group.exceptions:
            errlog.write(f"[{name}] rollout raised {exc.type}: {exc.message}\n")
    errlog.flush()


async def _gather(
    model: art.TrainableModel,
    agent: CLIAgent,
    tasks: Sequence[Task],
    n: int,
    *,
    limits: Limits | None,
    network: Network,
    metadata: dict[str, Any],
    desc: str | None,
    max_exceptions: int | float,
    max_concurrent_groups: int | None,
    errlog: TextIO | None,
    filesystem: Filesystem,
    sampling: art.RolloutSampling | None,
    phase: int,
) -> list[art.TrajectoryGroup]:
    # rollout_group's groups, gathered together: the groups of a step run concurrently and
    # share one exception budget.
    groups = await art.gather_trajectory_groups(
        (
            art.TrajectoryGroup(
                (
                    rollout(
                        model,
                        agent,
                        task,
                        limits=limits,
                        network=network,
                        metadata=metadata,
                        filesystem=filesystem,
                        # Each run its own seed: by phase (a step, or validation), task, run.
                        sampling=run_sampling(sampling, phase, t, i),
                    )
                    for i in range(n)
                ),
                metadata={"task": task_name(task)},
            )
            for t, task in enumerate(tasks)
        ),
        pbar_desc=desc,
        max_exceptions=max_exceptions,
        max_concurrent_groups=max_concurrent_groups,
    )
    _note_failures(groups, errlog)
    return groups


async def validate(
    model: art.TrainableModel,
    agent: CLIAgent,
    tasks: Sequence[Task],
    *,
    rollouts_per_task: int = 1,
    limits: Limits | None = None,
    network: Network = "auto",
    errlog: TextIO | None = None,
    max_exceptions: int | float = 0.5,
    max_concurrent_groups: int | None = None,
    desc: str | None = "validate",
    filesystem: Filesystem = "auto",
    sampling: art.RolloutSampling | None = None,
) -> list[art.TrajectoryGroup]:
    """Run the agent ``rollouts_per_task`` times on every task; one group per task. With a
    ``sampling`` seed, every validation pass draws the same seeds (a run before training
    and its counterpart after differ by the adapter, not by luck).

    Example:
        >>> groups = await validate(model, cli.codex("codex"), load_tasks("tasks"))  # needs a registered model, the codex CLI and a `tasks` folder  # doctest: +SKIP
        >>> ValSummary.of(0, groups).mean_reward  # needs a registered model  # doctest: +SKIP
        0.25
    """
    return await _gather(
        model,
        agent,
        tasks,
        rollouts_per_task,
        limits=limits,
        network=network,
        metadata={"split": "val"},
        desc=desc,
        max_exceptions=max_exceptions,
        max_concurrent_groups=max_concurrent_groups,
        errlog=errlog,
        filesystem=filesystem,
        sampling=sampling,
        phase=VALIDATION_PHASE,
    )


@dataclass(frozen=True)
class CLITrainSettings:
    """How ``train`` runs: every keyword of ``train`` but the model, agent and tasks.

    Pass one as ``train(model, agent, tasks, options)``, or the same names as keywords
    (``train(..., steps=20)``), or both: keywords then override the options' fields. Build
    variants with ``dataclasses.replace``. Unknown names raise ``TypeError``.

    Parameters:
        val_tasks (``Sequence[Task] | None``, default ``None``): the validation tasks;
            ``None``: the first 8 training tasks.
        steps (``int``, default ``10``): the step to stop at; training resumes from the
            model's checkpoint step, and a step that trains nothing still counts.
        groups_per_step (``int``, default ``4``): tasks (groups) per step.
        rollouts_per_group (``int``, default ``4``): runs of each task in a group (>= 2:
            GRPO learns from the differences between them).
        val_rollouts_per_task (``int``, default ``2``): runs of each validation task, before
            the first step and after the last.
        config (``art.TrainConfig | None``, default ``None``): the GRPO config; ``None``:
            ``TrainConfig(learning_rate=1e-4)``.
        limits (``Limits | None``, default ``None``): every run's limits
            (``art_cli_agents.rollout``).
        network (``Network``, default ``"auto"``): every run's network access.
        seed (``int``, default ``0``): the seed of the task schedule.
        errlog (``TextIO | None``, default ``None``): a line per run whose agent failed or
            timed out, and per rollout that raised.
        time_budget_s (``float | None``, default ``None``): no step starts once this much
            time has passed since the first validation ended.
        on_step (``Callable[[StepRecord], None] | None``, default ``None``): called with each
            step's record.
        max_exceptions (``int | float``, default ``0.25``): rollouts of a step that may raise
            (a count, or a fraction when < 1) before the step raises ``TooManyExceptions``;
            an agent that exits with an error is a run (scored by its check), not one of them.
        max_concurrent_groups (``int | None``, default ``None``): groups whose runs go at
            once (``None``: all of a step).
        filesystem (``Filesystem``, default ``"auto"``): every run's filesystem.
        sampling (``art.RolloutSampling | None``, default ``None``): every run's sampling,
            with a seed of its own for each run when it has one (validation passes repeat
            theirs: see ``validate``).

    Example:
        >>> CLITrainSettings(steps=3).rollouts_per_group
        4
    """

    val_tasks: Sequence[Task] | None = None
    steps: int = 10
    groups_per_step: int = 4
    rollouts_per_group: int = 4
    val_rollouts_per_task: int = 2
    config: art.TrainConfig | None = None
    limits: Limits | None = None
    network: Network = "auto"
    seed: int = 0
    errlog: TextIO | None = None
    time_budget_s: float | None = None
    on_step: Callable[[StepRecord], None] | None = None
    max_exceptions: int | float = 0.25
    max_concurrent_groups: int | None = None
    filesystem: Filesystem = "auto"
    sampling: art.RolloutSampling | None = None

    def check(self) -> None:
        """Raise ``ValueError`` for settings ``train`` cannot run with."""
        if self.steps < 1 or self.groups_per_step < 1 or self.val_rollouts_per_task < 1:
            raise ValueError("steps, groups_per_step and val_rollouts_per_task must be >= 1")
        if self.rollouts_per_group < 2:
            raise ValueError(
                "rollouts_per_group must be >= 2: GRPO learns from the differences between the "
                "runs of one task"
            )
        if self.time_budget_s is not None and self.time_budget_s < 0:
            raise ValueError(f"time_budget_s must be >= 0, got {self.time_budget_s}")


class CLITrainKwargs(TypedDict, total=False):
    """``train``'s keywords, typed: the fields of ``CLITrainSettings`` (documented there)."""

    val_tasks: Sequence[Task] | None
    steps: int
    groups_per_step: int
    rollouts_per_group: int
    val_rollouts_per_task: int
    config: art.TrainConfig | None
    limits: Limits | None
    network: Network
    seed: int
    errlog: TextIO | None
    time_budget_s: float | None
    on_step: Callable[[StepRecord], None] | None
    max_exceptions: int | float
    max_concurrent_groups: int | None
    filesystem: Filesystem
    sampling: art.RolloutSampling | None


def train_settings(
    options: CLITrainSettings | None = None, **kwargs: Unpack[CLITrainKwargs]
) -> CLITrainSettings:
    """``options`` (default: ``CLITrainSettings()``) with ``kwargs`` overriding its fields;
    a name that is no field raises ``TypeError`` naming it.

    Example:
        >>> train_settings(steps=3).steps
        3
    """
    return with_overrides(options or CLITrainSettings(), kwargs, caller="train()")


async def train(
    model: art.TrainableModel,
    agent: CLIAgent,
    tasks: Sequence[Task],
    options: CLITrainSettings | None = None,
    **kwargs: Unpack[CLITrainKwargs],
) -> TrainReport:
    """Train ``model`` (registered) so that ``agent`` solves ``tasks`` (see the module).

    ``options`` (a ``CLITrainSettings``) and the keywords (its fields, which override it)
    say how; every option is documented there. Validation runs before the first step and
    after the last. ``steps`` is the step to stop at: training resumes from the model's
    checkpoint step. A step that trains nothing (every group scored alike) leaves the
    checkpoint step where it was but still counts, so a reward nobody earns cannot keep the
    loop going.

    Example:
        >>> report = await cli.train(model, cli.codex("codex"), cli.load_tasks("tasks"),
        ...                          steps=10)  # needs a registered model, the codex CLI and a `tasks` folder  # doctest: +SKIP
        >>> print(report.table())  # needs a registered model  # doctest: +SKIP
    """
    chosen = train_settings(options, **kwargs)
    chosen.check()
    tasks = list(tasks)
    if not tasks:
        raise ValueError("no tasks to train on")
    val = list(chosen.val_tasks) if chosen.val_tasks is not None else tasks[:DEFAULT_VAL_TASKS]
    if not val:
        raise ValueError("no validation tasks")
    return await _Training(model, agent, tasks, val, chosen).run()


class _Training:
    """One ``train`` call: validation before and after, and the steps."""

    def __init__(
        self,
        model: art.TrainableModel,
        agent: CLIAgent,
        tasks: list[Task],
        val: list[Task],
        options: CLITrainSettings,
    ) -> None:
        self.model = model
        self.agent = agent
        self.tasks = tasks
        self.val = val
        self.o = options
        self.config = options.config or art.TrainConfig(learning_rate=1e-4)

    async def run(self) -> TrainReport:
        started = time.perf_counter()
        before = await self.validate("validate (before)")
        training_started = time.perf_counter()
        records = await self.steps(training_started)
        training_s = time.perf_counter() - training_started
        after = await self.validate("validate (after)")
        return TrainReport(
            steps=records,
            before=before,
            after=after,
            wall_s=time.perf_counter() - started,
            training_s=training_s,
        )

    async def validate(self, desc: str) -> ValSummary:
        """A validation pass, logged: its summary."""
        o = self.o
        step = await self.model.get_step()
        groups = await validate(
            self.model,
            self.agent,
            self.val,
            rollouts_per_task=o.val_rollouts_per_task,
            limits=o.limits,
            network=o.network,
            errlog=o.errlog,
            max_concurrent_groups=o.max_concurrent_groups,
            desc=desc,
            filesystem=o.filesystem,
            sampling=o.sampling,
        )
        await self.model.log(groups, split="val")
        return ValSummary.of(step, groups)

    async def steps(self, training_started: float) -> list[StepRecord]:
        """Run the steps from the model's step to ``steps`` (or the time budget)."""
        o = self.o
        records: list[StepRecord] = []
        first = await self.model.get_step()
        step = first
        bar = tqdm(
            total=o.steps if o.time_budget_s is None else None,
            initial=min(first, o.steps),
            desc="cli train",
            unit="step",
        )
        try:
            # The schedule's position counts steps run, trained or not: a step that trained
            # nothing leaves the checkpoint step, and must not pick the same tasks again.
            for index in range(first, max(o.steps, first)):
                if (
                    o.time_budget_s is not None
                    and time.perf_counter() - training_started >= o.time_budget_s
                ):
                    tqdm.write(
                        f"time budget of {o.time_budget_s / 60:.1f} min spent: no more steps"
                    )
                    break
                record, new_step = await self.train_step(index, step)
                records.append(record)
                bar.update(1)
                bar.set_postfix(reward=f"{record.reward:.3f}")
                tqdm.write(record.line())
                if o.on_step is not None:
                    o.on_step(record)
                step = new_step
        finally:
            bar.close()
        return records

    async def train_step(self, index: int, step: int) -> tuple[StepRecord, int]:
        """Run the groups of the ``index``-th step (checkpoint step ``step``) and train on
        them: its record and the checkpoint step after it."""
        o = self.o
        chosen = tasks_for_step(self.tasks, index, o.groups_per_step, o.seed)
        rollout_started = time.perf_counter()
        groups = await _gather(
            self.model,
            self.agent,
            chosen,
            o.rollouts_per_group,
            limits=o.limits,
            network=o.network,
            metadata={"split": "train", "step": step},
            desc=f"step {step} rollouts",
            max_exceptions=o.max_exceptions,
            max_concurrent_groups=o.max_concurrent_groups,
            errlog=o.errlog,
            filesystem=o.filesystem,
            sampling=o.sampling,
            phase=index + 1,
        )
        rollout_s = time.perf_counter() - rollout_started
        runs = [t for g in groups for t in g.trajectories]
        agent_found = agent_diagnoses(groups)
        train_started = time.perf_counter()
        if runs:
            result = await self.model.train(groups, config=self.config)
            trained, trainer_reason = result.nothing_trained is None, result.nothing_trained
            metrics, backend_found = dict(result.metrics), list(result.diagnoses)
            new_step = result.step
        else:  # every rollout raised, within the budget: nothing to hand the trainer
            trained, trainer_reason, metrics, backend_found = False, None, {}, []
            new_step = step
        rewards = [t.reward for t in runs]
        record = StepRecord(
            step=step,
            tasks=[task_name(task) for task in chosen],
            reward=mean(rewards) if rewards else 0.0,
            reward_std=pstdev(rewards) if rewards else 0.0,
            rollouts=len(rewards),
            failed=sum(len(g.exceptions) for g in groups),
            groups=len(groups),
            groups_with_signal=_groups_with_signal(groups),
            rollout_s=rollout_s,
            train_s=time.perf_counter() - train_started,
            trained=trained,
            runs=RunStats.of(runs),
            # The runs say why better than the trainer (which only sees equal rewards);
            # its own reason covers the rest (e.g. runs whose calls it cannot match).
            why_nothing_trained=None
            if trained
            else flat_reason(groups, agent_found) or trainer_reason,
            metrics=metrics,
            diagnoses=[*agent_found, *backend_found],
        )
        return record, new_step


def _groups_with_signal(groups: Sequence[art.TrajectoryGroup]) -> int:
    """The groups whose rewards differ by more than ``EQUAL_WITHIN``."""
    return sum(
        1
        for g in groups
        if g.trajectories
        and max(t.reward for t in g.trajectories) - min(t.reward for t in g.trajectories)
        > EQUAL_WITHIN
    )
