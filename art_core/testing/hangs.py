"""A hung test fails fast, says where every thread stood, and leaves no process behind.

pytest-timeout's own ``signal`` method writes the other threads' stacks to the terminal, which
a pytest-xdist worker does not show; here the stacks go into the failure itself, so the report
of a timed-out test holds them wherever it ran. The test's own teardown still runs (the
failure is raised in the test, the worker is not killed), and the processes the test started
that are still running after it are killed with their children.

Example:
    >>> import threading
    >>> ready, stop = threading.Event(), threading.Event()
    >>> def waiter() -> None:
    ...     ready.set()
    ...     stop.wait()
    >>> thread = threading.Thread(target=waiter, name="the-waiter")
    >>> thread.start(); _ = ready.wait()
    >>> "the-waiter" in thread_stacks() and "stop.wait()" in thread_stacks()
    True
    >>> stop.set(); thread.join()
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from types import FrameType

import psutil

DEFAULT_TIMEOUT_S = 300.0
SLOW_TIMEOUT_S = 900.0


def thread_stacks() -> str:
    """Every thread's stack but the calling one's (its traceback shows it), named, as text."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        if ident == threading.get_ident():
            continue
        parts.append(f"--- {names.get(ident, '<unknown>')} ({ident}) ---")
        parts.append("".join(traceback.format_stack(frame)))
    return "\n".join(parts)


class Alarm:
    """A SIGALRM timer that fails the running test with every thread's stack."""

    def __init__(self) -> None:
        self.fired = False
        self._previous: object = None

    def start(self, timeout_s: float) -> None:
        def fire(signum: int, frame: FrameType | None) -> None:
            import pytest

            self.fired = True
            pytest.fail(
                f"Timeout: the test ran past {timeout_s:.0f} s (pytest-timeout; mark it "
                f"@pytest.mark.timeout(S) if it is meant to take longer). Every thread:\n"
                f"{thread_stacks()}",
                pytrace=True,
            )

        self._previous = signal.signal(signal.SIGALRM, fire)
        signal.setitimer(signal.ITIMER_REAL, timeout_s)

    def cancel(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        if self._previous is not None:
            signal.signal(signal.SIGALRM, self._previous)  # type: ignore[arg-type]
            self._previous = None


def descendants() -> set[int]:
    """The pids of this process's children, grandchildren and so on."""
    try:
        return {p.pid for p in psutil.Process(os.getpid()).children(recursive=True)}
    except psutil.Error:
        return set()


def reap(pids: set[int], grace_s: float = 5.0) -> list[str]:
    """Terminate the processes ``pids`` (and their own children), then kill what is left after
    ``grace_s``; returns a line for each process that was still running."""
    processes: list[psutil.Process] = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            processes += [process, *process.children(recursive=True)]
        except psutil.Error:
            continue
    reaped = []
    for process in processes:
        try:
            reaped.append(f"{process.pid} {' '.join(process.cmdline())[:200]}")
            process.terminate()
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(processes, timeout=grace_s)
    for process in alive:
        try:
            process.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(alive, timeout=grace_s)
    return reaped
