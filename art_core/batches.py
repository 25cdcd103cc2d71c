"""``trajectory_group_batches``: groups in batches as they finish, while later ones still run.

ART's streaming form of ``gather_trajectory_groups``: a training loop takes a batch as soon as
``batch_size`` groups have finished, while up to ``max_concurrent_batches`` batches' worth of
groups keep running.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Iterable, Iterator
from typing import Any

from tqdm.auto import tqdm

from art_core.gather import TooManyExceptions, exception_limit, run_group
from art_core.trajectories import TrajectoryGroup


def _close(group: Awaitable[TrajectoryGroup] | TrajectoryGroup) -> None:
    """Drop a group that will never run (no "coroutine was never awaited" warnings)."""
    if isinstance(group, TrajectoryGroup):
        group.cancel_pending()
        return
    close = getattr(group, "close", None) or getattr(group, "cancel", None)
    if close is not None:
        close()


async def trajectory_group_batches(
    groups: Iterable[Awaitable[TrajectoryGroup] | TrajectoryGroup],
    *,
    batch_size: int,
    max_batch_exceptions: int | float = 0,
    max_concurrent_batches: int = 4,
    skip_batches: int = 0,
    pbar_desc: str | None = "batches",
    pbar_total_completion_tokens: bool = True,
) -> AsyncIterator[list[TrajectoryGroup]]:
    """Yield lists of ``batch_size`` finished groups in the order they finish (the last
    batch may be smaller).

    At most ``batch_size * max_concurrent_batches`` groups run at once. ``skip_batches``
    drops the first ``batch_size * skip_batches`` groups without running them (resuming a
    run). A batch whose rollouts raised more than ``max_batch_exceptions`` times (a count, or
    a fraction of the batch's rollouts when < 1) raises ``TooManyExceptions``. Leaving the
    loop early cancels the groups still running.

    Example:
        >>> async for batch in trajectory_group_batches(
        ...     (TrajectoryGroup(rollout(model, s) for _ in range(8)) for s in scenarios),
        ...     batch_size=4,
        ... ):
        ...     await model.train(batch)  # needs a registered model: `model`, `rollout`, `scenarios`  # doctest: +SKIP
    """
    del pbar_total_completion_tokens  # ART's progress-bar option; the bar counts groups
    _check_options(batch_size, max_concurrent_batches, skip_batches, max_batch_exceptions)
    source = iter(groups)
    if not _skip(source, batch_size * skip_batches):
        return

    running: set[asyncio.Task[TrajectoryGroup]] = set()
    batch: list[TrajectoryGroup] = []
    bar: Any = None
    exhausted = False
    try:
        while True:
            while not exhausted and len(running) < batch_size * max_concurrent_batches:
                group = next(source, None)
                if group is None:
                    exhausted = True
                else:
                    running.add(asyncio.ensure_future(run_group(group)))
            if not running:
                break
            if bar is None:
                bar = tqdm(
                    total=batch_size, desc=pbar_desc, disable=pbar_desc is None, unit="group"
                )
            done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                batch.append(task.result())
            bar.update(len(done))
            while len(batch) >= batch_size:
                ready, batch = batch[:batch_size], batch[batch_size:]
                _check_exceptions(ready, max_batch_exceptions)
                bar.close()
                bar = None
                yield ready
        if batch:  # the last, smaller batch (the source may end only after its groups did)
            _check_exceptions(batch, max_batch_exceptions)
            yield batch
    finally:
        for task in running:
            task.cancel()
        if bar is not None:
            bar.close()
        if isinstance(groups, list | tuple):
            for group in source:  # built up front and never started
                _close(group)


def _check_options(
    batch_size: int,
    max_concurrent_batches: int,
    skip_batches: int,
    max_batch_exceptions: int | float,
) -> None:
    for name, value in (
        ("batch_size", batch_size),
        ("max_concurrent_batches", max_concurrent_batches),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if isinstance(skip_batches, bool) or not isinstance(skip_batches, int) or skip_batches < 0:
        raise ValueError(f"skip_batches must be an int >= 0, got {skip_batches!r}")
    exception_limit(max_batch_exceptions, 1)  # validates it


def _skip(source: Iterator[Awaitable[TrajectoryGroup] | TrajectoryGroup], n: int) -> bool:
    """Drop the next ``n`` groups of ``source`` unrun; False when it ran out first."""
    for _ in range(n):
        skipped = next(source, None)
        if skipped is None:
            return False
        _close(skipped)
    return True


def _check_exceptions(batch: list[TrajectoryGroup], max_batch_exceptions: int | float) -> None:
    raised = sum(len(group.exceptions) for group in batch)
    total = raised + sum(len(group.trajectories) for group in batch)
    if raised > exception_limit(max_batch_exceptions, total):
        last = next(e for group in reversed(batch) for e in reversed(group.exceptions))
        raise TooManyExceptions(
            f"{raised} rollouts of a batch raised (max_batch_exceptions={max_batch_exceptions}); "
            f"last: {last.type}: {last.message}"
        )
