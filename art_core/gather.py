"""``gather_trajectory_groups``: run groups of rollouts concurrently, with a progress bar."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Iterable
from typing import Any, Literal

from tqdm.auto import tqdm

from art_core.sampling.groups import AfterEach, TooManyExceptions
from art_core.sampling.loop import OVER_BUDGET, GroupJob, gather_groups_with_signal
from art_core.tracing import hooks as tracing
from art_core.trajectories import Trajectory, TrajectoryGroup

__all__ = [
    "AfterEach",
    "TooManyExceptions",
    "exception_limit",
    "gather_trajectories",
    "gather_trajectory_groups",
    "run_group",
]


async def gather_trajectory_groups(
    groups: Iterable[Awaitable[TrajectoryGroup] | TrajectoryGroup],
    *,
    pbar_desc: str | None = "gather",
    max_exceptions: int | float = 0,
    after_each: AfterEach | None = None,
    max_concurrent_groups: int | None = None,
    groups_with_signal: int | None = None,
    max_rollouts: int | None = None,
) -> list[TrajectoryGroup]:
    """Run every group's rollouts at once; return the groups in input order.

    Rollouts that raise are kept in their group's ``exceptions``; once more than
    ``max_exceptions`` rollouts have raised (a count, or a fraction of all rollouts when < 1)
    this raises ``TooManyExceptions``. ``after_each`` runs on each finished group (e.g. RULER
    scoring); returning None drops the group.

    Dynamic sampling (for sparse rewards): with ``groups_with_signal=N`` and
    ``max_rollouts=M``, ``groups`` is read lazily (it may be an endless generator of
    ``TrajectoryGroup``) and groups are started until ``N`` have unequal rewards; all-equal
    groups are discarded and the call never runs more than ``M`` rollouts. The groups returned
    carry the counts (``sampling_*``) in their ``metrics``, which ``model.train`` writes to
    ``history.jsonl``; if none had a signal, up to ``N`` all-equal groups are returned so the
    step is still recorded. ``art_core.ScenarioSampler`` adds adaptive group size and a
    curriculum on top.

    Example:
        >>> groups = await gather_trajectory_groups(
        ...     (TrajectoryGroup(rollout(model, s) for _ in range(4)) for s in scenarios),
        ...     after_each=lambda g: ruler_score_group(g, "judge", swallow_exceptions=True),
        ... )  # needs a registered model: `model`, `rollout`; and a judge  # doctest: +SKIP
        >>> groups = await gather_trajectory_groups(
        ...     (TrajectoryGroup(rollout(model, s) for _ in range(8)) for s in cycle(scenarios)),
        ...     groups_with_signal=4, max_rollouts=256,
        ... )  # needs a registered model: `model`, `rollout`  # doctest: +SKIP
    """
    if groups_with_signal is not None or max_rollouts is not None:
        return await _gather_with_signal(
            groups,
            groups_with_signal=groups_with_signal,
            max_rollouts=max_rollouts,
            pbar_desc=pbar_desc,
            max_exceptions=max_exceptions,
            after_each=after_each,
            max_concurrent_groups=max_concurrent_groups,
        )
    return await _gather_at_once(
        groups,
        pbar_desc=pbar_desc,
        max_exceptions=max_exceptions,
        after_each=after_each,
        max_concurrent_groups=max_concurrent_groups,
    )


async def _gather_at_once(
    groups: Iterable[Awaitable[TrajectoryGroup] | TrajectoryGroup],
    *,
    pbar_desc: str | None,
    max_exceptions: int | float,
    after_each: AfterEach | None,
    max_concurrent_groups: int | None,
) -> list[TrajectoryGroup]:
    """``gather_trajectory_groups`` without dynamic sampling: every group started at once
    (at most ``max_concurrent_groups`` running), in input order."""
    pending = list(groups)
    total = sum(g.pending if isinstance(g, TrajectoryGroup) else 1 for g in pending)
    limit = exception_limit(max_exceptions, total)
    bar = tqdm(total=total, desc=pbar_desc, disable=pbar_desc is None, unit="rollout")
    stats = {"exceptions": 0, "reward_sum": 0.0, "done": 0, "completion_tokens": 0}
    semaphore = asyncio.Semaphore(max_concurrent_groups) if max_concurrent_groups else None

    async def one(group: Awaitable[TrajectoryGroup] | TrajectoryGroup) -> TrajectoryGroup | None:
        tracing.gathering()  # this task's rollouts are traced once after_each has run
        if semaphore is not None:
            async with semaphore:
                finished = await run_group(group)
        else:
            finished = await run_group(group)
        stats["exceptions"] += len(finished.exceptions)
        for trajectory in finished.trajectories:
            stats["done"] += 1
            stats["reward_sum"] += trajectory.reward
            stats["completion_tokens"] += trajectory.num_completion_tokens
        bar.update(len(finished.trajectories) + len(finished.exceptions))
        bar.set_postfix(_postfix(stats), refresh=False)
        if stats["exceptions"] > limit:
            last = finished.exceptions[-1] if finished.exceptions else None
            raise TooManyExceptions(
                f"{stats['exceptions']} rollouts raised (max_exceptions={max_exceptions}); "
                f"last: {last.type + ': ' + last.message if last else 'n/a'}"
            )
        if after_each is None:
            tracing.group_finished(finished, finished)
            return finished
        result = after_each(finished)
        if inspect.isawaitable(result):
            result = await result
        tracing.group_finished(finished, result)
        return result

    tasks = [asyncio.ensure_future(one(g)) for g in pending]
    try:
        results = await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        raise
    finally:
        bar.close()
    return [g for g in results if g is not None]


def exception_limit(max_exceptions: int | float, total: int) -> float:
    """How many rollouts may raise: ``max_exceptions`` itself, or, when it is a fraction
    (0 < x < 1), that share of ``total``.

    Example:
        >>> exception_limit(3, 100), exception_limit(0.05, 100)
        (3, 5.0)
    """
    if max_exceptions < 0:
        raise ValueError(f"max_exceptions must be >= 0, got {max_exceptions!r}")
    return max_exceptions if max_exceptions >= 1 or max_exceptions == 0 else max_exceptions * total


async def gather_trajectories(
    trajectories: Iterable[Awaitable[Trajectory] | Awaitable[Iterable[Trajectory]]],
    *,
    pbar_desc: str | None = "gather",
    pbar_total_completion_tokens: bool = True,
    max_exceptions: int | float = 0,
) -> list[Any]:
    """Run rollouts concurrently; return their results in input order (ART's spelling).

    A rollout may return one ``Trajectory`` or several (an iterable, e.g. both players of a
    game). With ``max_exceptions`` (a count, or a fraction of the rollouts when < 1) a rollout
    that raises leaves its exception in its place in the list; one more than allowed raises
    ``TooManyExceptions``. ``pbar_total_completion_tokens`` is accepted for ART code; the bar
    always shows the tokens recorded.

    Example:
        >>> trajectories = await gather_trajectories(rollout(model, s) for s in scenarios)
        ... # needs a registered model: `model`, `rollout`  # doctest: +SKIP
    """
    del pbar_total_completion_tokens  # ART's progress-bar option; the bar always counts tokens
    pending = list(trajectories)
    limit = exception_limit(max_exceptions, len(pending))
    bar = tqdm(total=len(pending), desc=pbar_desc, disable=pbar_desc is None, unit="rollout")
    stats = {"exceptions": 0, "reward_sum": 0.0, "done": 0, "completion_tokens": 0}

    async def one(awaitable: Awaitable[Any]) -> Any:
        try:
            result = await awaitable
        except Exception as exc:
            stats["exceptions"] += 1
            bar.update(1)
            if stats["exceptions"] > limit:
                raise TooManyExceptions(
                    f"{stats['exceptions']} rollouts raised (max_exceptions={max_exceptions}); "
                    f"last: {type(exc).__name__}: {exc}"
                ) from exc
            return exc
        if isinstance(result, Trajectory):
            found = [result]
        elif isinstance(result, Iterable) and not isinstance(result, str | bytes | dict):
            result = list(result)
            found = result
        else:
            found = []
        if not found or not all(isinstance(t, Trajectory) for t in found):
            raise TypeError(
                f"a rollout returned {type(result).__name__}, not a Trajectory or trajectories"
            )
        for trajectory in found:
            stats["done"] += 1
            stats["reward_sum"] += trajectory.reward
            stats["completion_tokens"] += trajectory.num_completion_tokens
        bar.update(1)
        bar.set_postfix(_postfix(stats), refresh=False)
        return result

    tasks = [asyncio.ensure_future(one(t)) for t in pending]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        raise
    finally:
        bar.close()


async def run_group(group: Awaitable[TrajectoryGroup] | TrajectoryGroup) -> TrajectoryGroup:
    """Run one group's pending rollouts (or await an awaitable of a group)."""
    result: Any = await group if not isinstance(group, TrajectoryGroup) else await group.run()
    if isinstance(result, TrajectoryGroup):
        return result
    if isinstance(result, Trajectory):
        return TrajectoryGroup([result])
    raise TypeError(f"a group awaited to {type(result).__name__}, not a TrajectoryGroup")


def _postfix(stats: dict[str, Any]) -> dict[str, Any]:
    done = stats["done"]
    return {
        "reward": f"{stats['reward_sum'] / done:.3f}" if done else "-",
        "tokens": stats["completion_tokens"],
        "exceptions": stats["exceptions"],
    }


async def _gather_with_signal(
    groups: Iterable[Awaitable[TrajectoryGroup] | TrajectoryGroup],
    *,
    groups_with_signal: int | None,
    max_rollouts: int | None,
    pbar_desc: str | None,
    max_exceptions: int | float,
    after_each: AfterEach | None,
    max_concurrent_groups: int | None,
) -> list[TrajectoryGroup]:
    for name, value in (("groups_with_signal", groups_with_signal), ("max_rollouts", max_rollouts)):
        if value is None:
            raise ValueError(
                "dynamic sampling needs both groups_with_signal (how many groups to keep) and "
                f"max_rollouts (the most rollouts to spend): {name} is missing"
            )
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    assert groups_with_signal is not None and max_rollouts is not None
    source = iter(groups)
    end = object()

    def next_job(rollouts_left: int) -> GroupJob | Literal["over_budget"] | None:
        item = next(source, end)
        if item is end:
            return None
        if not isinstance(item, TrajectoryGroup):
            close = getattr(item, "close", None)
            if close is not None:
                close()
            raise TypeError(
                "with groups_with_signal, pass TrajectoryGroup objects (their size must be "
                f"known to respect max_rollouts), got {type(item).__name__}"
            )
        if item.pending > rollouts_left:
            item.cancel_pending()
            return OVER_BUDGET
        return GroupJob(item)

    try:
        kept, report = await gather_groups_with_signal(
            next_job,
            groups_with_signal=groups_with_signal,
            max_rollouts=max_rollouts,
            after_each=after_each,
            max_exceptions=max_exceptions,
            max_concurrent_groups=max_concurrent_groups,
            pbar_desc=pbar_desc,
        )
    finally:
        if isinstance(groups, list | tuple):
            # Groups built up front that never ran: close their rollouts (no "never awaited").
            for item in source:
                if isinstance(item, TrajectoryGroup):
                    item.cancel_pending()
    for group in kept:
        group.metrics.update(report.metrics())
    if pbar_desc is not None:
        tqdm.write(f"{pbar_desc}: {report.summary()}")
    return kept
