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

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from statistics import mean, pstdev
from typing import Any, TextIO

from tqdm.auto import tqdm

import art_core as art
from art_core.diagnoses import Diagnosis, RunDiagnoses
from art_core.epochs import items_for_step
from art_mcp.report import ValSummary, before_after_table
from art_mcp.rollout import RewardFn, RolloutSettings, rollout
from art_mcp.scenarios import Scenario
from art_mcp.servers import ServerLike, parse_server
from art_mcp.warm_start import WarmStart, WarmStartReport
from art_mcp.warm_start import warm_start as run_warm_start


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
        ...                         reward_fn=check_answer)  # doctest: +SKIP
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


async def train(
    model: art.TrainableModel,
    server: ServerLike,
    scenarios: Sequence[Scenario],
    *,
    steps: int = 10,
    groups_per_step: int = 4,
    rollouts_per_group: int = 8,
    reward_fn: RewardFn | None = None,
    judge: Judge | None = None,
    val_scenarios: Sequence[Scenario] | None = None,
    val_rollouts_per_scenario: int = 2,
    settings: RolloutSettings | None = None,
    val_settings: RolloutSettings | None = None,
    config: Any = None,
    max_exceptions: int | float = 0.25,
    seed: int = 0,
    errlog: TextIO | None = None,
    on_step: Callable[[StepRecord], None] | None = None,
    dynamic_sampling: bool = False,
    max_rollouts_per_step: int | None = None,
    max_group_size: int | None = None,
    curriculum: bool = False,
    success_threshold: float = 1.0,
    warm_start: WarmStart | None = None,
    time_budget_s: float | None = None,
) -> TrainReport:
    """Train ``model`` (registered) to solve ``scenarios`` with ``server``'s tools.

    Rewards come from ``reward_fn(scenario, trajectory)`` or, with ``judge``, from RULER
    (``art_core.rewards.ruler_score_group``; a group the judge fails on is dropped). Up to
    ``max_exceptions`` rollouts of a step (a count, or a fraction when < 1) may fail (e.g. the
    server crashed) before the step raises. ``val_scenarios`` default to the first 8 training
    scenarios. ``config`` is an ``art.TrainConfig`` (default: ``learning_rate=1e-4``).
    Resumes from the model's checkpoint step; returns the per-step records and the before /
    after validation summaries (RULER-scored in joint groups when a judge is used).

    A step whose groups all have equal rewards trains nothing (the checkpoint step stays) but
    counts towards ``steps``. Sparse rewards: ``dynamic_sampling`` (groups without signal are discarded and replaced,
    up to ``max_rollouts_per_step`` rollouts a step, default 4x a plain step),
    ``max_group_size`` (adaptive group size) and ``curriculum``; a run solved a scenario when
    its reward >= ``success_threshold`` (for the curriculum and the never-solved share).

    ``warm_start`` (a fresh model only: at step 0) runs before the first step, after the
    first validation; its SFT checkpoint is a step, so ``steps`` counts it. Its SFT config
    defaults to the GRPO config's LoRA shape. ``time_budget_s``: no step starts once that
    much time has passed since the first validation ended.

    Example:
        >>> report = await art_mcp.train(model, "python examples/mcp/shop_server.py", scenarios,
        ...                              steps=10, reward_fn=check_answer)  # doctest: +SKIP
        >>> print(report.table())  # doctest: +SKIP
    """
    from art_core.training.config import TrainConfig

    if reward_fn is None and judge is None:
        raise ValueError("train needs a reward: pass reward_fn=... or judge=Judge(model=...)")
    if steps < 1 or groups_per_step < 1 or rollouts_per_group < 1:
        raise ValueError("steps, groups_per_step and rollouts_per_group must be >= 1")
    scenarios = list(scenarios)
    if not scenarios:
        raise ValueError("no scenarios to train on")
    if judge is not None and rollouts_per_group < 2:
        raise ValueError("RULER compares runs: rollouts_per_group must be >= 2 with a judge")
    if max_group_size is not None and max_group_size < rollouts_per_group:
        raise ValueError(
            f"max_group_size ({max_group_size}) must be >= rollouts_per_group ({rollouts_per_group})"
        )
    plain_step = groups_per_step * rollouts_per_group
    if max_rollouts_per_step is None:
        max_rollouts_per_step = 4 * plain_step if dynamic_sampling or max_group_size else plain_step
    if max_rollouts_per_step < plain_step and not dynamic_sampling:
        raise ValueError(
            f"max_rollouts_per_step ({max_rollouts_per_step}) must be >= groups_per_step x "
            f"rollouts_per_group ({plain_step}) without dynamic sampling"
        )
    if warm_start is not None and reward_fn is None:
        raise ValueError("a warm start picks runs by reward: it needs reward_fn, not a judge")
    if time_budget_s is not None and time_budget_s < 0:
        raise ValueError(f"time_budget_s must be >= 0, got {time_budget_s}")
    config = config or TrainConfig(learning_rate=1e-4)
    spec = parse_server(server)
    val = list(val_scenarios) if val_scenarios is not None else scenarios[:8]
    val_reward = None if judge is not None else reward_fn
    started = time.perf_counter()

    async def run_val(desc: str) -> tuple[int, list[art.TrajectoryGroup]]:
        step = await model.get_step()
        groups = await validate(
            model,
            spec,
            val,
            reward_fn=val_reward,
            rollouts_per_scenario=val_rollouts_per_scenario,
            settings=val_settings or settings,
            errlog=errlog,
            desc=desc,
        )
        if judge is None:
            await model.log(groups, split="val")
        return step, groups

    before_step, before_groups = await run_val("validate (before)")
    training_started = time.perf_counter()
    warm_report = None
    if warm_start is not None and reward_fn is not None:
        if await model.get_step() > 0:
            tqdm.write(
                f"warm start skipped: {model.name} is at step {await model.get_step()} "
                "(a warm start is for a fresh model)"
            )
        else:
            warm_report = await run_warm_start(
                model,
                spec,
                scenarios,
                _with_lora_of(warm_start, config, seed),
                reward_fn=reward_fn,
                settings=settings,
                errlog=errlog,
            )
            tqdm.write(warm_report.line())
    records: list[StepRecord] = []
    first = await model.get_step()
    current = {"step": first}

    def train_rollout(scenario: Scenario) -> Any:
        return rollout(
            model,
            scenario,
            spec,
            reward_fn=reward_fn if judge is None else None,
            settings=settings,
            errlog=errlog,
            metadata={"split": "train", "step": current["step"]},
        )

    # Without the sparse-reward options this is the plain schedule (scenarios_for_step's
    # seeded shuffle, resumed at the model's step), with the same per-step report.
    sampler = art.ScenarioSampler(
        scenarios,
        train_rollout,
        group_size=rollouts_per_group if rollouts_per_group >= 2 else 2,
        max_group_size=max_group_size,
        dynamic_sampling=dynamic_sampling,
        curriculum=curriculum,
        success_threshold=success_threshold,
        key=lambda scenario: scenario.id,
        seed=seed,
        position=first * groups_per_step,
    )
    # With a time budget the step count is only a bound: no total (and no ETA) to show.
    bar = tqdm(
        total=steps if time_budget_s is None else None,
        initial=min(first, steps),
        desc="mcp train",
        unit="step",
    )
    try:
        step = first
        # A step that trains nothing (every group all-equal) leaves the checkpoint step where
        # it was: it still counts, so a reward nobody earns cannot keep this loop going.
        for _ in range(max(steps - first, 0)):
            if (
                time_budget_s is not None
                and time.perf_counter() - training_started >= time_budget_s
            ):
                tqdm.write(f"time budget of {time_budget_s / 60:.1f} min spent: no more steps")
                break
            current["step"] = step
            rollout_started = time.perf_counter()
            if rollouts_per_group >= 2:
                groups = await sampler.gather(
                    groups_per_step,
                    max_rollouts=max_rollouts_per_step,
                    pbar_desc=f"step {step} rollouts",
                    max_exceptions=max_exceptions,
                    after_each=_ruler(judge) if judge is not None else None,
                )
            else:  # one run per scenario: no group to compare, nothing to sample for
                groups = await art.gather_trajectory_groups(
                    (
                        art.TrajectoryGroup([train_rollout(scenario)])
                        for scenario in scenarios_for_step(scenarios, step, groups_per_step, seed)
                    ),
                    pbar_desc=f"step {step} rollouts",
                    max_exceptions=max_exceptions,
                )
            rollout_s = time.perf_counter() - rollout_started
            sampled = sampler.last_report if rollouts_per_group >= 2 else None
            if not any(g.trajectories for g in groups):
                raise RuntimeError(
                    f"step {step}: no rollout to train on (all failed or their groups were dropped)"
                )
            train_started = time.perf_counter()
            result = await model.train(groups, config=config)
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
            records.append(record)
            bar.update(1)
            bar.set_postfix(reward=f"{record.reward:.3f}")
            tqdm.write(
                f"step {step}: reward {record.reward:.3f} ± {record.reward_std:.3f} over "
                f"{record.rollouts} runs ({record.failed} failed); groups with signal "
                f"{record.groups_with_signal}, all-equal {record.groups_all_equal}"
                f"{' (discarded)' if dynamic_sampling else ''}, {record.rollouts_spent} "
                f"rollouts spent, {record.never_solved:.0%} of tried scenarios never solved; "
                f"rollouts {rollout_s:.1f} s, train {record.train_s:.1f} s"
                + (f"; trained nothing: {result.nothing_trained}" if result.nothing_trained else "")
                + (
                    "; why: "
                    + ", ".join(d.code for d in record.diagnoses)
                    + "".join(f"\n    {d.line()}" for d in record.diagnoses)
                    if record.diagnoses
                    else ""
                )
            )
            if on_step is not None:
                on_step(record)
            step = result.step
    finally:
        bar.close()
    training_s = time.perf_counter() - training_started
    after_step, after_groups = await run_val("validate (after)")
    joint = False
    if judge is not None:
        before_groups, after_groups = await _judge_jointly(before_groups, after_groups, judge)
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


def _with_lora_of(warm: WarmStart, config: Any, seed: int) -> WarmStart:
    """``warm`` with an SFT config (default: ``SFTConfig()``) on the GRPO config's adapter
    shape and precision: both train the same LoRA."""
    import dataclasses

    from art_core.training.config import SFTConfig

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
    from art_core.rewards import DEFAULT_RUBRIC, ruler_score_group

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
    from art_core.rewards import DEFAULT_RUBRIC, ruler_score_group

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
