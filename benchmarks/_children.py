"""Child processes a benchmark starts (``art-core serve``), never left behind.

Each child gets its own process group (stopping it stops what it forked) and, on Linux,
SIGTERM from the kernel when the benchmark dies (a crash, a CI timeout's SIGKILL), so a
server outlives its benchmark in no case. Spawn from the thread that stays alive for the
child's whole life (the main thread): Linux sends the signal when the spawning thread exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import subprocess
import threading
from collections.abc import Callable
from typing import IO, Any


def die_with_parent() -> None:  # runs in the child, before exec
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def spawn(
    command: list[str],
    *,
    stdout: int | IO[Any] | None,
    env: dict[str, str] | None = None,
    text: bool = False,
    before_exec: Callable[[], None] | None = None,
) -> subprocess.Popen[Any]:
    """``Popen(command)`` in a new session, SIGTERM'd when we die; ``before_exec`` runs in the
    child first (e.g. a resource limit). stderr goes where stdout goes."""

    def prepare() -> None:
        die_with_parent()
        if before_exec is not None:
            before_exec()

    return subprocess.Popen(
        command,
        stdout=stdout,
        stderr=subprocess.STDOUT if stdout is not subprocess.DEVNULL else subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        env=env,
        text=text,
        start_new_session=True,
        preexec_fn=prepare,
    )


def stop(process: subprocess.Popen[Any], grace_s: float = 30.0) -> None:
    """SIGTERM the child's process group, SIGKILL it after ``grace_s``; wait for the exit."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    with contextlib.suppress(ProcessLookupError):  # what it forked and left in its group
        os.killpg(process.pid, signal.SIGKILL)


# The line every server of this project prints once its socket is bound.
LISTENING = re.compile(r"listening on (http://\S+)")


def wait_for_url(
    process: subprocess.Popen[str],
    what: str,
    timeout_s: float,
    pattern: re.Pattern[str] = LISTENING,
) -> str:
    """The URL ``process`` prints (``pattern``'s first group) once it listens; on a timeout or
    an early exit the process is stopped and ``RuntimeError`` shows its last lines."""
    found: list[str] = []
    tail: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        with process.stdout as stdout:  # closed at the end, not left to the collector
            for line in stdout:
                tail[:] = [*tail[-19:], line.rstrip()]
                match = pattern.search(line)
                if match and not found:
                    found.append(match.group(1))
                    ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(timeout_s) or not found:
        stop(process, grace_s=5)
        raise RuntimeError(f"{what} did not start:\n" + "\n".join(tail))
    return found[0]
