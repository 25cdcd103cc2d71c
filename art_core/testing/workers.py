"""Tests side by side under pytest-xdist: each worker on its own share of the cores, and the
tests that need the whole machine (or much of its memory) never beside another.

Why affinity and not only a thread count: torch's OpenMP threads meet at a barrier after
every parallel region, so two workers with two threads each on two cores wait for each other
at every region (measured 3-16x slower, ``art_core.cpu``). A worker pinned to its own cores
sees them as its whole budget (``cpu_budget`` reads the affinity mask), and so does every
server, rank or script it starts: nothing it runs can oversubscribe the other worker's cores.

Two markers decide what may run beside what:

- ``whole_machine``: the test needs every core this run may use (the CPU-count behaviour of
  the pipeline, a benchmark measuring both cores). It waits until no other test runs, holds
  the others off while it runs, and runs with the full affinity mask.
- ``memory_heavy``: the test holds gigabytes (the real 0.5B model, a training run on it). Two
  such tests never overlap; other tests still run beside them.

The locks are ``flock`` files in a folder of this test run (xdist's ``testrunuid``), so
they are released by the kernel when a worker dies. Without xdist everything here is a no-op.

Example:
    >>> share_of_cores([0, 1], workers=2, index=1)
    [1]
    >>> share_of_cores([0, 1, 2, 3], workers=2, index=0)
    [0, 1]
    >>> share_of_cores([0, 1], workers=3, index=2)  # more workers than cores: they share
    [0]
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

WHOLE_MACHINE_MARKER = (
    "whole_machine: needs every core of this run; under xdist it runs alone, with all cores"
)
MEMORY_HEAVY_MARKER = "memory_heavy: holds gigabytes; under xdist two never overlap"


def share_of_cores(cores: list[int], workers: int, index: int) -> list[int]:
    """The cores worker ``index`` of ``workers`` is pinned to: an equal, disjoint share of
    ``cores`` (the leftover cores go to the first workers), or one shared core when there are
    more workers than cores."""
    if workers <= 0 or not 0 <= index < workers:
        raise ValueError(f"worker {index} of {workers}: out of range")
    if workers >= len(cores):
        return [cores[index % len(cores)]]
    per, extra = divmod(len(cores), workers)
    start = index * per + min(index, extra)
    return cores[start : start + per + (1 if index < extra else 0)]


def _thread_ids() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:  # no /proc: the calling thread only
        return [0]


class CoreShare:
    """Worker ``index`` of ``workers``'s cores: pinned at start, widened to the whole machine
    for a ``whole_machine`` test, pinned again after it."""

    def __init__(self, index: int, workers: int) -> None:
        self.all_cores = sorted(os.sched_getaffinity(0))
        self.own = share_of_cores(self.all_cores, workers=workers, index=index)

    def pin(self, cores: list[int]) -> None:
        # Every thread of the process: the mask is per thread on Linux, and a thread started
        # before (a session's engine, a pool) would keep the old one; new threads inherit it.
        for thread_id in _thread_ids():
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                os.sched_setaffinity(thread_id, cores)
        # Processes this worker starts read it before importing torch (OpenMP's pool size).
        os.environ["OMP_NUM_THREADS"] = str(len(cores))
        try:
            import torch
        except ImportError:  # a suite without torch: the affinity mask is enough
            return
        torch.set_num_threads(len(cores))

    @contextlib.contextmanager
    def whole_machine(self) -> Iterator[None]:
        self.pin(self.all_cores)
        try:
            yield
        finally:
            self.pin(self.own)


class RunLocks:
    """The ``flock`` files shared by the workers of one test run.

    ``gate`` is a readers-writer lock: every test holds it shared, a ``whole_machine`` test
    exclusively. ``turnstile`` stops a stream of shared holders from starving a waiting
    exclusive one: a test takes and drops it before taking the gate shared, and the exclusive
    test holds it while it waits for the gate.
    """

    def __init__(self, run_id: str) -> None:
        self.folder = Path(tempfile.gettempdir()) / f"art-core-pytest-{run_id}"
        self.folder.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def _flock(self, name: str, mode: int) -> Iterator[None]:
        with (self.folder / name).open("a") as handle:
            fcntl.flock(handle, mode)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def beside_others(self) -> Iterator[None]:
        with self._flock("turnstile", fcntl.LOCK_EX):
            pass
        with self._flock("gate", fcntl.LOCK_SH):
            yield

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        with self._flock("turnstile", fcntl.LOCK_EX), self._flock("gate", fcntl.LOCK_EX):
            yield

    @contextlib.contextmanager
    def memory(self) -> Iterator[None]:
        with self._flock("memory", fcntl.LOCK_EX):
            yield
