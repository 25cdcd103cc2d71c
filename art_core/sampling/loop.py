"""The dynamic-sampling loop: run groups until enough of them carry a learning signal.

A group whose rewards are all equal teaches GRPO nothing (the trainer skips it). With sparse
rewards that is most groups, so instead of a fixed batch this loop keeps starting groups until
``groups_with_signal`` of them have unequal rewards (DAPO's dynamic sampling), never running
more than ``max_rollouts`` rollouts. A group that came back all-equal may first be grown by
more rollouts of its scenario, up to ``max_group_size`` (adaptive group size): one success in
16 runs is a signal that 8 runs would have missed.

At most ``groups_with_signal`` groups are in flight or kept at any time, so the call never
starts a group it could not use: with dense rewards it costs exactly a plain batch.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from tqdm.auto import tqdm

from art_core.gather import AfterEach, TooManyExceptions
from art_core.sampling.report import SamplingReport
from art_core.tracing import hooks as tracing
from art_core.trajectories import Trajectory, TrajectoryGroup

OVER_BUDGET: Literal["over_budget"] = "over_budget"


@dataclass
class GroupJob:
    """One group to sample: its first rollouts, and (optionally) how to add more rollouts of
    the same scenario (``more(n)`` returns ``n`` new rollouts, not yet awaited)."""

    group: TrajectoryGroup
    more: Callable[[int], Iterable[Awaitable[Trajectory] | BaseException]] | None = None
    key: str | None = None


# ``next_job(rollouts_left)``: the next group to start, None when there is none, or
# OVER_BUDGET when it would need more rollouts than are left.
NextJob = Callable[[int], GroupJob | Literal["over_budget"] | None]
OnGroup = Callable[[GroupJob, TrajectoryGroup], None]


def _size(group: TrajectoryGroup) -> int:
    return len(group.trajectories) + len(group.exceptions)


async def gather_groups_with_signal(
    next_job: NextJob,
    *,
    groups_with_signal: int,
    max_rollouts: int,
    max_group_size: int | None = None,
    growth: int = 1,
    keep_all_equal: bool = False,
    after_each: AfterEach | None = None,
    max_exceptions: int | float = 0,
    max_concurrent_groups: int | None = None,
    pbar_desc: str | None = "gather",
    on_group: OnGroup | None = None,
) -> tuple[list[TrajectoryGroup], SamplingReport]:
    """Run groups from ``next_job`` until ``groups_with_signal`` have unequal rewards.

    Returns the groups kept (in start order) and a report. All-equal groups are grown by
    ``growth`` rollouts at a time while ``job.more`` exists and the group is smaller than
    ``max_group_size``, then discarded (kept instead with ``keep_all_equal``: a plain batch
    with the same bookkeeping). When no group had a signal, up to ``groups_with_signal`` of
    the all-equal groups are returned so that ``model.train`` still records the step (it
    trains on nothing and counts them in ``train/groups_skipped``). ``after_each`` scores a
    group before its signal is checked (again after each growth, on the whole group).
    ``on_group`` sees every finished group that was not dropped (e.g. to update a history).

    Example:
        >>> groups, report = await gather_groups_with_signal(
        ...     next_job, groups_with_signal=4, max_rollouts=256)  # doctest: +SKIP
        >>> print(report.summary())  # doctest: +SKIP
    """
    if groups_with_signal < 1:
        raise ValueError(f"groups_with_signal must be >= 1, got {groups_with_signal}")
    if max_rollouts < 1:
        raise ValueError(f"max_rollouts must be >= 1, got {max_rollouts}")
    if max_group_size is not None and max_group_size < 2:
        raise ValueError(f"max_group_size must be >= 2, got {max_group_size}")
    if growth < 1:
        raise ValueError(f"growth must be >= 1, got {growth}")
    if max_concurrent_groups is not None and max_concurrent_groups < 1:
        raise ValueError(f"max_concurrent_groups must be >= 1, got {max_concurrent_groups}")

    report = SamplingReport(groups_wanted=groups_with_signal, discards_all_equal=not keep_all_equal)
    slots = min(groups_with_signal, max_concurrent_groups or groups_with_signal)
    launched = 0  # rollouts reserved so far (the budget), growth included
    over_budget = False
    kept: list[tuple[int, TrajectoryGroup]] = []
    all_equal: list[tuple[int, TrajectoryGroup]] = []
    bar = tqdm(total=0, desc=pbar_desc, disable=pbar_desc is None, unit="rollout")
    reward = {"sum": 0.0, "count": 0}  # as sampled (progress bar)
    rewards = {"sum": 0.0, "count": 0}  # as scored, groups not dropped (report)

    def count(group: TrajectoryGroup) -> None:
        report.rollouts += _size(group)
        report.exceptions += len(group.exceptions)
        reward["sum"] += sum(t.reward for t in group.trajectories)
        reward["count"] += len(group.trajectories)
        bar.total = max(bar.total, bar.n + _size(group))
        bar.update(_size(group))
        bar.set_postfix(
            signal=report.groups_with_signal,
            all_equal=report.groups_all_equal,
            reward=f"{reward['sum'] / reward['count']:.3f}" if reward["count"] else "-",
            exceptions=report.exceptions,
            refresh=False,
        )
        limit = (
            max_exceptions
            if max_exceptions >= 1 or max_exceptions == 0
            else max_exceptions * launched
        )
        if report.exceptions > limit:
            last = group.exceptions[-1] if group.exceptions else None
            raise TooManyExceptions(
                f"{report.exceptions} rollouts raised (max_exceptions={max_exceptions}); "
                f"last: {last.type + ': ' + last.message if last else 'n/a'}"
            )

    def reserve(wanted: int) -> int:
        nonlocal launched, over_budget
        granted = min(wanted, max_rollouts - launched)
        if granted < wanted:
            over_budget = True
        launched += max(granted, 0)
        bar.total = launched
        bar.refresh()
        return max(granted, 0)

    async def score(group: TrajectoryGroup, may_grow: bool) -> TrajectoryGroup | None:
        if after_each is None:
            return group
        # A group that may grow is scored on a copy: the next round scores the whole group
        # afresh from the rollouts' own rewards (RULER rewrites them in place).
        result = after_each(group.model_copy(deep=True) if may_grow else group)
        if inspect.isawaitable(result):
            result = await result
        return result

    async def run(job: GroupJob) -> tuple[GroupJob, TrajectoryGroup, TrajectoryGroup | None]:
        tracing.gathering()  # the rollouts are traced once after_each has run
        raw = await job.group.run()
        count(raw)

        def may_grow() -> bool:
            return (
                job.more is not None and max_group_size is not None and _size(raw) < max_group_size
            )

        scored = await score(raw, may_grow())
        grown = False
        while scored is not None and not scored.has_signal and may_grow():
            assert job.more is not None and max_group_size is not None
            extra = reserve(min(growth, max_group_size - _size(raw)))
            if extra == 0:
                break
            more = await TrajectoryGroup(job.more(extra)).run()
            raw.trajectories.extend(more.trajectories)
            raw.exceptions.extend(more.exceptions)
            report.rollouts_added += extra
            grown = True
            count(more)
            scored = await score(raw, may_grow())
        report.groups_grown += grown
        tracing.group_finished(raw, scored)
        return job, raw, scored

    running: dict[
        asyncio.Future[tuple[GroupJob, TrajectoryGroup, TrajectoryGroup | None]], int
    ] = {}
    started = 0
    exhausted = False
    try:
        while True:
            while (
                not exhausted
                and not over_budget
                and len(kept) + len(running) < groups_with_signal
                and len(running) < slots
            ):
                job = next_job(max_rollouts - launched)
                if job is None:
                    exhausted = True
                elif job == OVER_BUDGET:
                    over_budget = True
                else:
                    assert isinstance(job, GroupJob)
                    if job.group.pending > max_rollouts - launched:
                        job.group.cancel_pending()  # none of it runs
                        over_budget = True
                        break
                    reserve(job.group.pending)
                    running[asyncio.ensure_future(run(job))] = started
                    started += 1
            if not running:
                break
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                order = running.pop(task)
                job, raw, scored = task.result()
                if scored is None:
                    report.groups_dropped += 1
                    continue
                if on_group is not None:
                    on_group(job, scored)
                rewards["sum"] += sum(t.reward for t in scored.trajectories)
                rewards["count"] += len(scored.trajectories)
                if scored.has_signal:
                    report.groups_with_signal += 1
                    kept.append((order, scored))
                    continue
                report.groups_all_equal += 1
                report.rollouts_all_equal += _size(raw)
                if keep_all_equal:
                    kept.append((order, scored))
                elif len(all_equal) < groups_with_signal:
                    all_equal.append((order, scored))
    except BaseException:
        for task in running:
            task.cancel()
        raise
    finally:
        bar.close()

    if rewards["count"]:
        report.reward = rewards["sum"] / rewards["count"]
    if len(kept) >= groups_with_signal:
        report.stop_reason = "enough_groups"
    elif over_budget:
        report.stop_reason = "max_rollouts"
    else:
        report.stop_reason = "no_more_groups"
    chosen = kept or all_equal
    return [group for _, group in sorted(chosen, key=lambda item: item[0])], report
