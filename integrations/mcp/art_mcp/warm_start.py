"""Warm start: a few good runs of the task, learned by SFT before GRPO starts.

A small model that never calls the right tool gives GRPO nothing to compare; a few hundred
(or a few dozen) successful runs first make GRPO start from a policy that sometimes succeeds.
The runs come from one of two places:

- a **teacher** (any OpenAI-compatible model, ``art.teacher_trajectories``): the same rollout
  on the same MCP server, with the teacher's answers, re-rendered in the student's template;
- the **model itself** (rejection sampling, ``art.best_trajectories``): groups of its own
  runs, keeping the best run of each group that reaches ``min_reward``; these were recorded
  by its gateway, so SFT trains on the very tokens it sampled.

Either way, training scenarios only (never the validation ones), and at most
``max_rollouts`` runs are spent looking for ``traces`` successes.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import art_core as art
from art_mcp.rollout import RewardFn, RolloutSettings, rollout
from art_mcp.scenarios import Scenario
from art_mcp.servers import ServerLike, parse_server


@dataclass
class WarmStart:
    """How to warm-start: ``traces`` successful runs (reward >= ``min_reward``), from
    ``teacher`` when given (else from the model itself, ``rollouts_per_scenario`` runs a
    group), at most ``max_rollouts`` runs (default ``8 * traces``), then ``model.train_sft``
    with ``config`` (its LoRA shape must match the GRPO config's).

    Example:
        >>> WarmStart(traces=16).budget
        128
    """

    traces: int
    teacher: art.Model | None = None
    rollouts_per_scenario: int = 4
    min_reward: float = 1.0
    max_rollouts: int | None = None
    config: Any = None  # art.SFTConfig (imported lazily: it pulls in torch)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.traces < 1:
            raise ValueError(f"a warm start needs at least 1 trace, got {self.traces}")
        if self.rollouts_per_scenario < 1:
            raise ValueError("rollouts_per_scenario must be >= 1")
        if self.max_rollouts is not None and self.max_rollouts < 1:
            raise ValueError("max_rollouts must be >= 1")

    @property
    def budget(self) -> int:
        """The most runs spent looking for traces."""
        return self.max_rollouts if self.max_rollouts is not None else 8 * self.traces


@dataclass
class WarmStartReport:
    """What the warm start did: traces found, runs spent, where from, SFT time and result."""

    source: str
    traces: int
    rollouts: int
    collect_s: float
    sft_s: float
    step: int | None
    metrics: dict[str, float] = field(default_factory=dict)

    def line(self) -> str:
        """One line for the progress output and the closing note."""
        if self.step is None:
            return (
                f"warm start: no run of {self.source} reached the reward threshold in "
                f"{self.rollouts} runs ({self.collect_s:.0f} s); nothing to learn from, GRPO "
                "starts from the base model"
            )
        return (
            f"warm start: {self.traces} traces from {self.source} ({self.rollouts} runs, "
            f"{self.collect_s:.0f} s), SFT {self.sft_s:.0f} s -> step {self.step}, loss "
            f"{self.metrics.get('sft/first_epoch_loss', float('nan')):.3f} -> "
            f"{self.metrics.get('sft/last_epoch_loss', float('nan')):.3f}"
        )


async def warm_start(
    model: art.TrainableModel,
    server: ServerLike,
    scenarios: Sequence[Scenario],
    warm: WarmStart,
    *,
    reward_fn: RewardFn,
    settings: RolloutSettings | None = None,
    errlog: TextIO | None = None,
) -> WarmStartReport:
    """Collect ``warm.traces`` successful runs of ``scenarios`` and SFT ``model`` on them.

    Rollouts run in rounds of (up to) one group per missing trace, over a seeded shuffle of
    the scenarios, until enough runs reached ``warm.min_reward`` or ``warm.budget`` runs
    were spent. With no success at all, nothing is trained (the report says so).

    Example:
        >>> report = await warm_start(model, "python examples/mcp/shop_server.py", scenarios,
        ...                           WarmStart(traces=16), reward_fn=art_mcp.answer_reward)  # needs a registered model: `model`, `scenarios`  # doctest: +SKIP
        >>> print(report.line())  # needs a registered model  # doctest: +SKIP
    """
    if not scenarios:
        raise ValueError("no scenarios to warm-start on")
    spec = parse_server(server)
    order = list(scenarios)
    random.Random(warm.seed).shuffle(order)
    source = f"teacher {warm.teacher.get_inference_name()}" if warm.teacher else "the model itself"
    traces: list[art.Trajectory] = []
    spent = 0
    position = 0
    started = time.perf_counter()

    async def run(agent: art.TrainableModel, scenario: Scenario) -> art.Trajectory:
        return await rollout(
            agent,
            scenario,
            spec,
            reward_fn=reward_fn,
            settings=settings,
            errlog=errlog,
            metadata={"split": "warm_start"},
        )

    while len(traces) < warm.traces and spent + warm.rollouts_per_scenario <= warm.budget:
        groups_left = (warm.budget - spent) // warm.rollouts_per_scenario
        count = min(warm.traces - len(traces), groups_left)
        chosen = [order[(position + i) % len(order)] for i in range(count)]
        position += count
        spent += count * warm.rollouts_per_scenario
        traces += await _successful_runs(run, model, warm, chosen, have=len(traces))
    collected = time.perf_counter() - started
    traces = traces[: warm.traces]
    if not traces:
        return WarmStartReport(source, 0, spent, collected, 0.0, None)
    sft_started = time.perf_counter()
    result = await model.train_sft(traces, config=warm.config)
    return WarmStartReport(
        source=source,
        traces=len(traces),
        rollouts=spent,
        collect_s=collected,
        sft_s=time.perf_counter() - sft_started,
        step=result.step,
        metrics=dict(result.metrics),
    )


async def _successful_runs(
    run: Callable[[art.TrainableModel, Scenario], Awaitable[art.Trajectory]],
    model: art.TrainableModel,
    warm: WarmStart,
    chosen: list[Scenario],
    *,
    have: int,
) -> list[art.Trajectory]:
    """One round's successful runs of ``chosen``: the teacher's, else the model's best of
    each group (``have``: the traces collected so far, for the progress bar)."""
    desc = f"warm start ({have}/{warm.traces} traces)"
    if warm.teacher is not None:
        return await art.teacher_trajectories(
            run,
            warm.teacher,
            chosen,
            rollouts_per_scenario=warm.rollouts_per_scenario,
            min_reward=warm.min_reward,
            max_exceptions=0.5,
            pbar_desc=desc,
        )
    groups = await art.gather_trajectory_groups(
        (
            art.TrajectoryGroup(run(model, scenario) for _ in range(warm.rollouts_per_scenario))
            for scenario in chosen
        ),
        pbar_desc=desc,
        max_exceptions=0.5,
    )
    return art.best_trajectories(groups, min_reward=warm.min_reward)
