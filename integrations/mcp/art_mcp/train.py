"""``train``: scenarios -> groups of rollouts on an MCP server -> rewards -> GRPO steps.

Each step takes ``groups_per_step`` scenarios (a seeded shuffle, so a resumed run continues
the same schedule), runs ``rollouts_per_group`` rollouts of each, scores them (the user's
``reward_fn``, or RULER when a judge is given) and calls ``model.train``. A validation pass
runs before the first step and after the last; the report compares them. The step counter is
the model's checkpoint step, so running ``train`` again resumes where it stopped.

For rewards that are rarely earned (``art_core.ScenarioSampler``): ``dynamic_sampling`` keeps
starting groups until ``groups_per_step`` have unequal rewards (at most
``max_rollouts_per_step`` rollouts), ``max_group_size`` grows an all-equal group before
giving up on it, and ``curriculum`` prefers scenarios solved about half the time. Every step
reports groups with a signal, all-equal groups, rollouts spent and the share of scenarios
never solved (in the progress output and ``history.jsonl``).

``warm_start`` first trains a fresh model by SFT on successful runs (``art_mcp.warm_start``:
a teacher's, or the best of the model's own groups); ``time_budget_s`` stops starting steps
once that much training time (warm start included) has passed, so runs with and without a
warm start can be compared at the same wall time.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from statistics import mean, pstdev
from typing import TYPE_CHECKING, Any, TextIO, TypedDict, Unpack

from tqdm.auto import tqdm

import art_core as art
from art_core.diagnoses import Diagnosis, RunDiagnoses
from art_core.epochs import items_for_step
from art_core.overrides import with_overrides
from art_core.rewards import DEFAULT_RUBRIC, ruler_score_group
from art_core.training.config import SFTConfig, TrainConfig
from art_mcp.report import ValSummary, before_after_table
from art_mcp.rollout import RewardFn, RolloutSettings, rollout
from art_mcp.scenarios import Scenario
from art_mcp.servers import ServerLike, parse_server
from art_mcp.warm_start import WarmStart, WarmStartReport
from art_mcp.warm_start import warm_start as run_warm_start

if TYPE_CHECKING:
    from art_core.training.config import TrainResult


@dataclass
class Judge:
    """An OpenAI-compatible RULER judge: model name, base URL (None = OpenAI), API key."""

    model: str
    base_url: str | None = None
    api_key: str | None = None
    rubric: str | None = None


@dataclass
class StepRecord:
    """One training step: the rewards of its rollouts and what training reported."""

    step: int
    reward: float
    reward_std: float
    rollouts: int
    failed: int
    rollout_s: float
    train_s: float
    metrics: dict[str, float] = field(default_factory=dict)
    groups_with_signal: int = 0
    groups_all_equal: int = 0
    rollouts_spent: int = 0
    never_solved: float = 0.0
    # Why the step's groups taught little or nothing (art_core.diagnoses), if a rule fired.
    diagnoses: list[Diagnosis] = field(default_factory=list)


@dataclass
class TrainReport:
    """What ``train`` did: per-step records and the validation passes before and after."""

    steps: list[StepRecord]
    before: ValSummary
    after: ValSummary
    wall_s: float
    judged_jointly: bool = False
    # Time from the first validation's end to the last step's end (warm start included).
    training_s: float = 0.0
    warm_start: WarmStartReport | None = None

    def diagnoses(self) -> RunDiagnoses:
        """The diagnoses of every step, with the run-level one (rewards flat over the steps)."""
        run = RunDiagnoses()
        for record in self.steps:
            trained = record.metrics.get("train/trained", 1.0) != 0.0
            run.add(record.step, reward=record.reward, trained=trained, diagnoses=record.diagnoses)
        return run

    def table(self) -> str:
        """The before/after table (RULER-judged jointly when a judge was used), then why the
        run learned little, when a diagnosis fired (each with the setting to change)."""
        title = "validation, before vs after" + (
            " (RULER: both judged in the same groups)" if self.judged_jointly else ""
        )
        table = before_after_table(self.before, self.after, title=title)
        why = self.diagnoses().table()
        return f"{table}\n\n{why}" if why else table


def scenarios_for_step(
    scenarios: Sequence[Scenario], step: int, groups_per_step: int, seed: int = 0
) -> list[Scenario]:
    """The scenarios of step ``step``: consecutive slices of a seeded shuffle per epoch.

    Example:
        >>> pool = [Scenario(task=f"task number {i}") for i in range(5)]
        >>> len(scenarios_for_step(pool, 3, 2)), scenarios_for_step(pool, 3, 2) == scenarios_for_step(pool, 3, 2)
        (2, True)
    """
    if not scenarios:
        raise ValueError("no scenarios to train on")
    return items_for_step(scenarios, step, groups_per_step, seed)


async def validate(
    model: art.TrainableModel,
    server: ServerLike,
    scenarios: Sequence[Scenario],
    *,
    reward_fn: RewardFn | None = None,
    rollouts_per_scenario: int = 1,
    settings: RolloutSettings | None = None,
    errlog: TextIO | None = None,
    max_exceptions: int | float = 0.5,
    desc: str | None = "validate",
) -> list[art.TrajectoryGroup]:
    """Run every validation scenario ``rollouts_per_scenario`` times; one group per scenario.

    Example:
        >>> groups = await validate(model, "python examples/mcp/shop_server.py", val,
        ...                         reward_fn=check_answer)  # needs a registered model: `model`, `val`, `check_answer`  # doctest: +SKIP
    """
    spec = parse_server(server)
    return await art.gather_trajectory_groups(
        (
            art.TrajectoryGroup(
                rollout(
                    model,
                    scenario,
                    spec,
                    reward_fn=reward_fn,
                    settings=settings,
                    errlog=errlog,
                    metadata={"split": "val"},
                )
                for _ in range(rollouts_per_scenario)
            )
            for scenario in scenarios
        ),
        pbar_desc=desc,
        max_exceptions=max_exceptions,
    )


@dataclass(frozen=True)
class MCPTrainSettings:
    """How ``train`` runs: every keyword of ``train`` but the model, server and scenarios.

    Pass one as ``train(model, server, scenarios, options)``, or the same names as keywords
    (``train(..., steps=20, reward_fn=...)``), or both: keywords then override the options'
    fields. Build variants with ``dataclasses.replace``. Unknown names raise ``TypeError``.

    Parameters:
        steps (``int``, default ``10``): train until this checkpoint step; ``train`` resumes
            from the model's step, and a step that trains nothing still counts.
        groups_per_step (``int``, default ``4``): scenarios (groups) per step.
        rollouts_per_group (``int``, default ``8``): runs of each scenario in a group (1: no
            group to compare, each scenario runs once).
        reward_fn (``RewardFn | None``, default ``None``): ``reward_fn(scenario, trajectory)``
            scores a run; this or ``judge`` is required.
        judge (``Judge | None``, default ``None``): score with RULER instead (a group the
            judge fails on is dropped); needs ``rollouts_per_group >= 2``.
        val_scenarios (``Sequence[Scenario] | None``, default ``None``): the validation
            scenarios; ``None``: the first 8 training scenarios.
        val_rollouts_per_scenario (``int``, default ``2``): runs of each validation scenario.
        settings (``RolloutSettings | None``, default ``None``): how each rollout runs (turns,
            tokens, temperature, tools); ``None``: ``RolloutSettings()``.
        val_settings (``RolloutSettings | None``, default ``None``): the validation runs'
            settings; ``None``: ``settings``.
        config (``art.TrainConfig | None``, default ``None``): the GRPO config; ``None``:
            ``TrainConfig(learning_rate=1e-4)``.
        max_exceptions (``int | float``, default ``0.25``): rollouts of a step that may raise
            (a count, or a fraction when < 1) before the step raises.
        seed (``int``, default ``0``): the seed of the scenario schedule (and a warm start).
        errlog (``TextIO | None``, default ``None``): where the MCP servers' stderr goes.
        on_step (``Callable[[StepRecord], None] | None``, default ``None``): called with each
            step's record.
        dynamic_sampling (``bool``, default ``False``): discard groups without signal and
            start others in their place (sparse rewards).
        max_rollouts_per_step (``int | None``, default ``None``): the rollouts a step may
            spend; ``None``: 4x a plain step with ``dynamic_sampling`` or ``max_group_size``,
            else a plain step (``groups_per_step * rollouts_per_group``).
        max_group_size (``int | None``, default ``None``): grow an all-equal group up to this
            many runs before giving up on it (adaptive group size).
        curriculum (``bool``, default ``False``): prefer scenarios solved about half the time.
        success_threshold (``float``, default ``1.0``): a run solved its scenario when its
            reward is at least this (the curriculum and the never-solved share).
        warm_start (``WarmStart | None``, default ``None``): SFT a fresh model on successful
            runs first (after the first validation; its checkpoint is a step); needs
            ``reward_fn``.
        time_budget_s (``float | None``, default ``None``): no step starts once this much time
            has passed since the first validation ended.

    Example:
        >>> fast = MCPTrainSettings(steps=2, rollouts_per_group=4)
        >>> dataclasses.replace(fast, steps=3).steps, fast.max_rollouts()
        (3, 16)
    """

    steps: int = 10
    groups_per_step: int = 4
    rollouts_per_group: int = 8
    reward_fn: RewardFn | None = None
    judge: Judge | None = None
    val_scenarios: Sequence[Scenario] | None = None
    val_rollouts_per_scenario: int = 2
    settings: RolloutSettings | None = None
    val_settings: RolloutSettings | None = None
    config: Any = None  # art.TrainConfig (imported lazily: it pulls in torch)
    max_exceptions: int | float = 0.25
    seed: int = 0
    errlog: TextIO | None = None
    on_step: Callable[[StepRecord], None] | None = None
    dynamic_sampling: bool = False
    max_rollouts_per_step: int | None = None
    max_group_size: int | None = None
    curriculum: bool = False
    success_threshold: float = 1.0
    warm_start: WarmStart | None = None
    time_budget_s: float | None = None

    def max_rollouts(self) -> int:
        """``max_rollouts_per_step``, its default resolved."""
        if self.max_rollouts_per_step is not None:
            return self.max_rollouts_per_step
        plain_step = self.groups_per_step * self.rollouts_per_group
        return 4 * plain_step if self.dynamic_sampling or self.max_group_size else plain_step

    def check(self) -> None:
        """Raise ``ValueError`` for settings ``train`` cannot run with."""
        if self.reward_fn is None and self.judge is None:
            raise ValueError("train needs a reward: pass reward_fn=... or judge=Judge(model=...)")
        if self.steps < 1 or self.groups_per_step < 1 or self.rollouts_per_group < 1:
            raise ValueError("steps, groups_per_step and rollouts_per_group must be >= 1")

    def check_sampling(self) -> None:
        """The checks of the group sizes, the rollout budget, the warm start and the time
        budget (after ``check`` and the scenarios')."""
        if self.judge is not None and self.rollouts_per_group < 2:
            raise ValueError("RULER compares runs: rollouts_per_group must be >= 2 with a judge")
        if self.max_group_size is not None and self.max_group_size < self.rollouts_per_group:
            raise ValueError(
                f"max_group_size ({self.max_group_size}) must be >= rollouts_per_group "
                f"({self.rollouts_per_group})"
            )
        plain_step = self.groups_per_step * self.rollouts_per_group
        if self.max_rollouts() < plain_step and not self.dynamic_sampling:
            raise ValueError(
                f"max_rollouts_per_step ({self.max_rollouts()}) must be >= groups_per_step x "
                f"rollouts_per_group ({plain_step}) without dynamic sampling"
            )
        if self.warm_start is not None and self.reward_fn is None:
            raise ValueError("a warm start picks runs by reward: it needs reward_fn, not a judge")
        if self.time_budget_s is not None and self.time_budget_s < 0:
            raise ValueError(f"time_budget_s must be >= 0, got {self.time_budget_s}")


class MCPTrainKwargs(TypedDict, total=False):
    """``train``'s keywords, typed: the fields of ``MCPTrainSettings`` (documented there)."""

    steps: int
    groups_per_step: int
    rollouts_per_group: int
    reward_fn: RewardFn | None
    judge: Judge | None
    val_scenarios: Sequence[Scenario] | None
    val_rollouts_per_scenario: int
    settings: RolloutSettings | None
    val_settings: RolloutSettings | None
    config: Any
    max_exceptions: int | float
    seed: int
    errlog: TextIO | None
    on_step: Callable[[StepRecord], None] | None
    dynamic_sampling: bool
    max_rollouts_per_step: int | None
    max_group_size: int | None
    curriculum: bool
    success_threshold: float
    warm_start: WarmStart | None
    time_budget_s: float | None


def train_settings(
    options: MCPTrainSettings | None = None, **kwargs: Unpack[MCPTrainKwargs]
) -> MCPTrainSettings:
    """``options`` (default: ``MCPTrainSettings()``) with ``kwargs`` overriding its fields;
    a name that is no field raises ``TypeError`` naming it.

    Example:
        >>> train_settings(steps=3).steps
        3
    """
    return with_overrides(options or MCPTrainSettings(), kwargs, caller="train()")


async def train(
    model: art.TrainableModel,
    server: ServerLike,
    scenarios: Sequence[Scenario],
    options: MCPTrainSettings | None = None,
    **kwargs: Unpack[MCPTrainKwargs],
) -> TrainReport:
    """Train ``model`` (registered) to solve ``scenarios`` with ``server``'s tools.

    ``options`` (an ``MCPTrainSettings``) and the keywords (its fields, which override it)
    say how; every option is documented there. Rewards come from ``reward_fn(scenario,
    trajectory)`` or, with ``judge``, from RULER (``art_core.rewards.ruler_score_group``).
    Resumes from the model's checkpoint step; returns the per-step records and the before /
    after validation summaries (RULER-scored in joint groups when a judge is used).

    A step whose groups all have equal rewards trains nothing (the checkpoint step stays) but
    counts towards ``steps``. Sparse rewards: ``dynamic_sampling``, ``max_group_size`` and
    ``curriculum``. ``warm_start`` (a fresh model only: at step 0) runs before the first
    step, after the first validation; its SFT checkpoint is a step, so ``steps`` counts it.
    Its SFT config defaults to the GRPO config's LoRA shape.

    Example:
        >>> report = await art_mcp.train(model, "python examples/mcp/shop_server.py", scenarios,
        ...                              steps=10, reward_fn=check_answer)  # needs a registered model: `model`, `scenarios`, `check_answer`  # doctest: +SKIP
        >>> print(report.table())  # needs a registered model  # doctest: +SKIP
    """
    chosen = train_settings(options, **kwargs)
    chosen.check()
    scenarios = list(scenarios)
    if not scenarios:
        raise ValueError("no scenarios to train on")
    chosen.check_sampling()
    return await _Training(model, parse_server(server), scenarios, chosen).run()


class _Training:
    """One ``train`` call: validation before and after, the warm start and the steps."""

    def __init__(
        self,
        model: art.TrainableModel,
        spec: Any,
        scenarios: list[Scenario],
        options: MCPTrainSettings,
    ) -> None:
        self.model = model
        self.spec = spec
        self.scenarios = scenarios
        self.o = options
        self.config = options.config or TrainConfig(learning_rate=1e-4)
        self.val = (
            list(options.val_scenarios) if options.val_scenarios is not None else scenarios[:8]
        )
        self.step = 0  # the step the rollouts being run train (their metadata)

    async def run(self) -> TrainReport:
        started = time.perf_counter()
        before_step, before_groups = await self.validate("validate (before)")
        training_started = time.perf_counter()
        warm_report = await self.warm_start()
        records = await self.steps(training_started)
        training_s = time.perf_counter() - training_started
        after_step, after_groups = await self.validate("validate (after)")
        joint = False
        if self.o.judge is not None:
            before_groups, after_groups = await _judge_jointly(
                before_groups, after_groups, self.o.judge
            )
            joint = True
        return TrainReport(
            steps=records,
            before=ValSummary.of(before_step, before_groups),
            after=ValSummary.of(after_step, after_groups),
            wall_s=time.perf_counter() - started,
            judged_jointly=joint,
            training_s=training_s,
            warm_start=warm_report,
        )

    async def validate(self, desc: str) -> tuple[int, list[art.TrajectoryGroup]]:
        """A validation pass (logged, unless RULER scores it later): its step and groups."""
        o = self.o
        step = await self.model.get_step()
        groups = await validate(
            self.model,
            self.spec,
            self.val,
            reward_fn=None if o.judge is not None else o.reward_fn,
            rollouts_per_scenario=o.val_rollouts_per_scenario,
            settings=o.val_settings or o.settings,
            errlog=o.errlog,
            desc=desc,
        )
        if o.judge is None:
            await self.model.log(groups, split="val")
        return step, groups

    async def warm_start(self) -> WarmStartReport | None:
        """The warm start's SFT, when asked for and the model is fresh."""
        o = self.o
        if o.warm_start is None or o.reward_fn is None:
            return None
        if await self.model.get_step() > 0:
            tqdm.write(
                f"warm start skipped: {self.model.name} is at step {await self.model.get_step()} "
                "(a warm start is for a fresh model)"
            )
            return None
        report = await run_warm_start(
            self.model,
            self.spec,
            self.scenarios,
            _with_lora_of(o.warm_start, self.config, o.seed),
            reward_fn=o.reward_fn,
            settings=o.settings,
            errlog=o.errlog,
        )
        tqdm.write(report.line())
        return report

    def rollout(self, scenario: Scenario) -> Any:
        """One training rollout of ``scenario`` (not yet awaited)."""
        o = self.o
        return rollout(
            self.model,
            scenario,
            self.spec,
            reward_fn=o.reward_fn if o.judge is None else None,
            settings=o.settings,
            errlog=o.errlog,
            metadata={"split": "train", "step": self.step},
        )

    async def steps(self, training_started: float) -> list[StepRecord]:
        """Run the steps from the model's step to ``steps`` (or the time budget)."""
        o = self.o
        records: list[StepRecord] = []
        first = await self.model.get_step()
        # Without the sparse-reward options this is the plain schedule (scenarios_for_step's
        # seeded shuffle, resumed at the model's step), with the same per-step report.
        sampler = art.ScenarioSampler(
            self.scenarios,
            self.rollout,
            group_size=o.rollouts_per_group if o.rollouts_per_group >= 2 else 2,
            max_group_size=o.max_group_size,
            dynamic_sampling=o.dynamic_sampling,
            curriculum=o.curriculum,
            success_threshold=o.success_threshold,
            key=lambda scenario: scenario.id,
            seed=o.seed,
            position=first * o.groups_per_step,
        )
        # With a time budget the step count is only a bound: no total (and no ETA) to show.
        bar = tqdm(
            total=o.steps if o.time_budget_s is None else None,
            initial=min(first, o.steps),
            desc="mcp train",
            unit="step",
        )
        try:
            step = first
            # A step that trains nothing (every group all-equal) leaves the checkpoint step
            # where it was: it still counts, so a reward nobody earns cannot keep this loop going.
            for _ in range(max(o.steps - first, 0)):
                if (
                    o.time_budget_s is not None
                    and time.perf_counter() - training_started >= o.time_budget_s
                ):
                    tqdm.write(
                        f"time budget of {o.time_budget_s / 60:.1f} min spent: no more steps"
                    )
                    break
                record, result = await self.train_step(step, sampler)
                records.append(record)
                bar.update(1)
                bar.set_postfix(reward=f"{record.reward:.3f}")
                tqdm.write(_step_line(record, result.nothing_trained, o.dynamic_sampling))
                if o.on_step is not None:
                    o.on_step(record)
                step = result.step
        finally:
            bar.close()
        return records

    async def gather(
        self, step: int, sampler: art.ScenarioSampler
    ) -> tuple[list[art.TrajectoryGroup], art.SamplingReport | None]:
        """A step's groups, and the sampler's report (None without groups to compare)."""
        o = self.o
        if o.rollouts_per_group >= 2:
            groups = await sampler.gather(
                o.groups_per_step,
                max_rollouts=o.max_rollouts(),
                pbar_desc=f"step {step} rollouts",
                max_exceptions=o.max_exceptions,
                after_each=_ruler(o.judge) if o.judge is not None else None,
            )
            return groups, sampler.last_report
        # one run per scenario: no group to compare, nothing to sample for
        groups = await art.gather_trajectory_groups(
            (
                art.TrajectoryGroup([self.rollout(scenario)])
                for scenario in scenarios_for_step(self.scenarios, step, o.groups_per_step, o.seed)
            ),
            pbar_desc=f"step {step} rollouts",
            max_exceptions=o.max_exceptions,
        )
        return groups, None

    async def train_step(
        self, step: int, sampler: art.ScenarioSampler
    ) -> tuple[StepRecord, TrainResult]:
        """Gather step ``step``'s groups and train on them: its record and what training
        returned."""
        self.step = step
        rollout_started = time.perf_counter()
        groups, sampled = await self.gather(step, sampler)
        rollout_s = time.perf_counter() - rollout_started
        if not any(g.trajectories for g in groups):
            raise RuntimeError(
                f"step {step}: no rollout to train on (all failed or their groups were dropped)"
            )
        train_started = time.perf_counter()
        result = await self.model.train(groups, config=self.config)
        rewards = [t.reward for g in groups for t in g.trajectories]
        record = StepRecord(
            step=step,
            reward=mean(rewards),
            reward_std=pstdev(rewards),
            rollouts=len(rewards),
            failed=sampled.exceptions if sampled else sum(len(g.exceptions) for g in groups),
            rollout_s=rollout_s,
            train_s=time.perf_counter() - train_started,
            metrics=dict(result.metrics),
            groups_with_signal=sampled.groups_with_signal if sampled else 0,
            groups_all_equal=sampled.groups_all_equal if sampled else len(groups),
            rollouts_spent=sampled.rollouts if sampled else len(rewards),
            never_solved=sampled.scenarios.never_solved_share
            if sampled and sampled.scenarios
            else 0.0,
            diagnoses=list(result.diagnoses),
        )
        return record, result


def _step_line(record: StepRecord, nothing_trained: str | None, discarded: bool) -> str:
    """The progress line of a step."""
    return (
        f"step {record.step}: reward {record.reward:.3f} ± {record.reward_std:.3f} over "
        f"{record.rollouts} runs ({record.failed} failed); groups with signal "
        f"{record.groups_with_signal}, all-equal {record.groups_all_equal}"
        f"{' (discarded)' if discarded else ''}, {record.rollouts_spent} "
        f"rollouts spent, {record.never_solved:.0%} of tried scenarios never solved; "
        f"rollouts {record.rollout_s:.1f} s, train {record.train_s:.1f} s"
        + (f"; trained nothing: {nothing_trained}" if nothing_trained else "")
        + (
            "; why: "
            + ", ".join(d.code for d in record.diagnoses)
            + "".join(f"\n    {d.line()}" for d in record.diagnoses)
            if record.diagnoses
            else ""
        )
    )


def _with_lora_of(warm: WarmStart, config: Any, seed: int) -> WarmStart:
    """``warm`` with an SFT config (default: ``SFTConfig()``) on the GRPO config's adapter
    shape and precision: both train the same LoRA."""
    shared = {
        "lora_rank": config.lora_rank,
        "lora_alpha": config.lora_alpha,
        "lora_dropout": config.lora_dropout,
        "lora_target_modules": config.lora_target_modules,
        "precision": config.precision,
    }
    base = warm.config if warm.config is not None else SFTConfig(seed=seed)
    return dataclasses.replace(warm, config=base.model_copy(update=shared), seed=seed)


def _ruler(judge: Judge) -> Callable[[art.TrajectoryGroup], Any]:
    async def score(group: art.TrajectoryGroup) -> art.TrajectoryGroup | None:
        if len(group.trajectories) < 2:
            return None  # nothing to compare: no learning signal either
        return await ruler_score_group(
            group,
            judge.model,
            judge_base_url=judge.base_url,
            judge_api_key=judge.api_key,
            rubric=judge.rubric or DEFAULT_RUBRIC,
            swallow_exceptions=True,
        )

    return score


async def _judge_jointly(
    before: list[art.TrajectoryGroup], after: list[art.TrajectoryGroup], judge: Judge
) -> tuple[list[art.TrajectoryGroup], list[art.TrajectoryGroup]]:
    """RULER scores are relative to a group: judge each scenario's before and after runs in
    one group, so the two columns of the table are comparable."""
    new_before, new_after = [], []
    for old, new in zip(before, after, strict=True):
        n = len(old.trajectories)
        joint = art.TrajectoryGroup([*old.trajectories, *new.trajectories])
        scored = await ruler_score_group(
            joint,
            judge.model,
            judge_base_url=judge.base_url,
            judge_api_key=judge.api_key,
            rubric=judge.rubric or DEFAULT_RUBRIC,
            swallow_exceptions=True,
        )
        if scored is None:
            continue
        new_before.append(art.TrajectoryGroup(scored.trajectories[:n], exceptions=old.exceptions))
        new_after.append(art.TrajectoryGroup(scored.trajectories[n:], exceptions=new.exceptions))
    return new_before, new_after
