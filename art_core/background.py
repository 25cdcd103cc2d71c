"""A background thread that runs export work off the caller's event loop (tracing's exporters
and metrics' loggers; below both ``tracing/`` and ``metrics/``).

Rollouts hand their finished record to ``Worker.submit`` (a non-blocking put on a bounded
queue) and go on; building span trees and talking to exporters happens here. When the
queue is full the work is dropped and counted, never waited for.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

logger = logging.getLogger("art_core.tracing")

Task = Callable[[], None]


def call_with_timeout(fn: Task, timeout_s: float, name: str) -> bool:
    """Run ``fn`` on a daemon thread; True when it returned within ``timeout_s``.

    For SDK calls with no timeout of their own (a flush that retries a down host for a
    long time): the caller waits at most ``timeout_s``, and a hung call cannot keep the
    process alive at exit.

    Example:
        >>> call_with_timeout(lambda: None, 1.0, name="noop")
        True
    """
    done = threading.Event()

    def run() -> None:
        try:
            fn()
        finally:
            done.set()

    threading.Thread(target=run, name=name, daemon=True).start()
    return done.wait(timeout_s)


class Worker:
    """One daemon thread draining a bounded queue of tasks; a failing task is logged.

    Example:
        >>> worker = Worker(max_queue_size=8)
        >>> done = []
        >>> worker.submit(lambda: done.append(1))
        True
        >>> worker.flush(timeout_s=5.0), done
        (True, [1])
        >>> worker.close(timeout_s=1.0)
    """

    def __init__(self, max_queue_size: int, name: str = "art-tracing") -> None:
        self._queue: queue.Queue[Task | None] = queue.Queue(maxsize=max_queue_size)
        self._name = name
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._closed = False
        self.submitted = 0
        self.dropped = 0
        self.failed = 0
        self.busy_s = 0.0  # wall time spent running tasks (a bound on the CPU taken)

    def _ensure_started(self) -> None:
        if self._thread is not None:
            return
        with self._start_lock:
            if self._thread is None:
                thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                thread.start()
                self._thread = thread

    def submit(self, task: Task) -> bool:
        """Queue ``task``; False (and counted in ``dropped``) when closed or full."""
        if self._closed:
            self.dropped += 1
            return False
        self._ensure_started()
        try:
            self._queue.put_nowait(task)
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                logger.warning(
                    "tracing queue full: %d rollouts/steps dropped so far (exporters too slow?)",
                    self.dropped,
                )
            return False
        self.submitted += 1
        return True

    def _loop(self) -> None:
        while True:
            task = self._queue.get()
            try:
                if task is None:
                    return
                started = time.perf_counter()
                try:
                    task()
                except Exception:
                    self.failed += 1
                    logger.exception("tracing: an export task failed (the rollout is unaffected)")
                finally:
                    self.busy_s += time.perf_counter() - started
            finally:
                self._queue.task_done()

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until everything submitted so far has run; False on timeout."""
        if self._thread is None:
            return True
        done = threading.Event()
        try:
            self._queue.put(done.set, timeout=timeout_s)
        except queue.Full:
            return False
        return done.wait(timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        """Run what is queued (up to ``timeout_s``), then stop the thread."""
        self._closed = True
        if self._thread is None:
            return
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            return  # a daemon thread: it dies with the process
        self._thread.join(timeout_s)
