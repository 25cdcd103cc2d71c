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

from art_core.sampling.groups import AfterEach, TooManyExceptions
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
        ...     next_job, groups_with_signal=4, max_rollouts=256)  # needs a registered model: `next_job` starts its rollouts  # doctest: +SKIP
        >>> print(report.summary())  # needs a registered model  # doctest: +SKIP
    """
    _check_limits(
        groups_with_signal=groups_with_signal,
        max_rollouts=max_rollouts,
        max_group_size=max_group_size,
        growth=growth,
        max_concurrent_groups=max_concurrent_groups,
    )
    sampler = _SignalSampler(
        next_job,
        groups_with_signal=groups_with_signal,
        max_rollouts=max_rollouts,
        max_group_size=max_group_size,
        growth=growth,
        keep_all_equal=keep_all_equal,
        after_each=after_each,
        max_exceptions=max_exceptions,
        max_concurrent_groups=max_concurrent_groups,
        pbar_desc=pbar_desc,
        on_group=on_group,
    )
    await sampler.sample()
    return sampler.result()


def _check_limits(
    *,
    groups_with_signal: int,
    max_rollouts: int,
    max_group_size: int | None,
    growth: int,
    max_concurrent_groups: int | None,
) -> None:
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


_Finished = tuple[GroupJob, TrajectoryGroup, TrajectoryGroup | None]


class _SignalSampler:
    """The state of one ``gather_groups_with_signal`` call: the rollout budget, the groups in
    flight, kept and all-equal, the report and the progress bar."""

    def __init__(
        self,
        next_job: NextJob,
        *,
        groups_with_signal: int,
        max_rollouts: int,
        max_group_size: int | None,
        growth: int,
        keep_all_equal: bool,
        after_each: AfterEach | None,
        max_exceptions: int | float,
        max_concurrent_groups: int | None,
        pbar_desc: str | None,
        on_group: OnGroup | None,
    ) -> None:
        self.next_job = next_job
        self.groups_with_signal = groups_with_signal
        self.max_rollouts = max_rollouts
        self.max_group_size = max_group_size
        self.growth = growth
        self.keep_all_equal = keep_all_equal
        self.after_each = after_each
        self.max_exceptions = max_exceptions
        self.on_group = on_group
        self.report = SamplingReport(
            groups_wanted=groups_with_signal, discards_all_equal=not keep_all_equal
        )
        self.slots = min(groups_with_signal, max_concurrent_groups or groups_with_signal)
        self.launched = 0  # rollouts reserved so far (the budget), growth included
        self.over_budget = False
        self.exhausted = False
        self.started = 0
        self.kept: list[tuple[int, TrajectoryGroup]] = []
        self.all_equal: list[tuple[int, TrajectoryGroup]] = []
        self.running: dict[asyncio.Future[_Finished], int] = {}
        self.bar = tqdm(total=0, desc=pbar_desc, disable=pbar_desc is None, unit="rollout")
        self.sampled = {"sum": 0.0, "count": 0}  # rewards as sampled (progress bar)
        self.scored = {"sum": 0.0, "count": 0}  # rewards as scored, groups not dropped (report)

    async def sample(self) -> None:
        """Start groups and collect them until enough have a signal or none can start."""
        try:
            while True:
                self.start_groups()
                if not self.running:
                    break
                done, _ = await asyncio.wait(self.running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    order = self.running.pop(task)
                    self.file_group(order, *task.result())
        except BaseException:
            for task in self.running:
                task.cancel()
            raise
        finally:
            self.bar.close()

    def start_groups(self) -> None:
        """Start jobs from ``next_job`` while a slot is free and the budget allows."""
        while (
            not self.exhausted
            and not self.over_budget
            and len(self.kept) + len(self.running) < self.groups_with_signal
            and len(self.running) < self.slots
        ):
            job = self.next_job(self.max_rollouts - self.launched)
            if job is None:
                self.exhausted = True
            elif job == OVER_BUDGET:
                self.over_budget = True
            else:
                assert isinstance(job, GroupJob)
                if job.group.pending > self.max_rollouts - self.launched:
                    job.group.cancel_pending()  # none of it runs
                    self.over_budget = True
                    return
                self.reserve(job.group.pending)
                self.running[asyncio.ensure_future(self.run(job))] = self.started
                self.started += 1

    def file_group(
        self, order: int, job: GroupJob, raw: TrajectoryGroup, scored: TrajectoryGroup | None
    ) -> None:
        """Count a finished group and keep it (signal), set it aside (all equal) or drop it."""
        report = self.report
        if scored is None:
            report.groups_dropped += 1
            return
        if self.on_group is not None:
            self.on_group(job, scored)
        self.scored["sum"] += sum(t.reward for t in scored.trajectories)
        self.scored["count"] += len(scored.trajectories)
        if scored.has_signal:
            report.groups_with_signal += 1
            self.kept.append((order, scored))
            return
        report.groups_all_equal += 1
        report.rollouts_all_equal += _size(raw)
        if self.keep_all_equal:
            self.kept.append((order, scored))
        elif len(self.all_equal) < self.groups_with_signal:
            self.all_equal.append((order, scored))

    def result(self) -> tuple[list[TrajectoryGroup], SamplingReport]:
        """The groups kept (in start order; the all-equal ones when none had a signal) and
        the report with its mean reward and stop reason."""
        report = self.report
        if self.scored["count"]:
            report.reward = self.scored["sum"] / self.scored["count"]
        if len(self.kept) >= self.groups_with_signal:
            report.stop_reason = "enough_groups"
        elif self.over_budget:
            report.stop_reason = "max_rollouts"
        else:
            report.stop_reason = "no_more_groups"
        chosen = self.kept or self.all_equal
        return [group for _, group in sorted(chosen, key=lambda item: item[0])], report

    def count(self, group: TrajectoryGroup) -> None:
        """Add a group's rollouts to the report and the progress bar; raise
        ``TooManyExceptions`` past ``max_exceptions``."""
        report, bar, sampled = self.report, self.bar, self.sampled
        report.rollouts += _size(group)
        report.exceptions += len(group.exceptions)
        sampled["sum"] += sum(t.reward for t in group.trajectories)
        sampled["count"] += len(group.trajectories)
        bar.total = max(bar.total, bar.n + _size(group))
        bar.update(_size(group))
        bar.set_postfix(
            signal=report.groups_with_signal,
            all_equal=report.groups_all_equal,
            reward=f"{sampled['sum'] / sampled['count']:.3f}" if sampled["count"] else "-",
            exceptions=report.exceptions,
            refresh=False,
        )
        max_exceptions = self.max_exceptions
        limit = (
            max_exceptions
            if max_exceptions >= 1 or max_exceptions == 0
            else max_exceptions * self.launched
        )
        if report.exceptions > limit:
            last = group.exceptions[-1] if group.exceptions else None
            raise TooManyExceptions(
                f"{report.exceptions} rollouts raised (max_exceptions={max_exceptions}); "
                f"last: {last.type + ': ' + last.message if last else 'n/a'}"
            )

    def reserve(self, wanted: int) -> int:
        """Take up to ``wanted`` rollouts from the budget; returns how many were granted."""
        granted = min(wanted, self.max_rollouts - self.launched)
        if granted < wanted:
            self.over_budget = True
        self.launched += max(granted, 0)
        self.bar.total = self.launched
        self.bar.refresh()
        return max(granted, 0)

    async def score(self, group: TrajectoryGroup, may_grow: bool) -> TrajectoryGroup | None:
        if self.after_each is None:
            return group
        # A group that may grow is scored on a copy: the next round scores the whole group
        # afresh from the rollouts' own rewards (RULER rewrites them in place).
        result = self.after_each(group.model_copy(deep=True) if may_grow else group)
        if inspect.isawaitable(result):
            result = await result
        return result

    def may_grow(self, job: GroupJob, raw: TrajectoryGroup) -> bool:
        return (
            job.more is not None
            and self.max_group_size is not None
            and _size(raw) < self.max_group_size
        )

    async def run(self, job: GroupJob) -> _Finished:
        """Run a job's group, score it, and grow it while it is all equal and may grow."""
        tracing.gathering()  # the rollouts are traced once after_each has run
        raw = await job.group.run()
        self.count(raw)
        scored = await self.score(raw, self.may_grow(job, raw))
        grown = False
        while scored is not None and not scored.has_signal and self.may_grow(job, raw):
            assert job.more is not None and self.max_group_size is not None
            extra = self.reserve(min(self.growth, self.max_group_size - _size(raw)))
            if extra == 0:
                break
            more = await TrajectoryGroup(job.more(extra)).run()
            raw.trajectories.extend(more.trajectories)
            raw.exceptions.extend(more.exceptions)
            self.report.rollouts_added += extra
            grown = True
            self.count(more)
            scored = await self.score(raw, self.may_grow(job, raw))
        self.report.groups_grown += grown
        tracing.group_finished(raw, scored)
        return job, raw, scored
