"""Child processes a benchmark starts: servers (``art-core serve``), never left behind, and
configurations measured each in a fresh process (``in_fresh_process``).

Each server child gets its own process group (stopping it stops what it forked) and, on Linux,
SIGTERM from the kernel when the benchmark dies (a crash, a CI timeout's SIGKILL), so a
server outlives its benchmark in no case. Spawn from the thread that stays alive for the
child's whole life (the main thread): Linux sends the signal when the spawning thread exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import re
import signal
import subprocess
import threading
import traceback
from collections.abc import Callable, Sequence
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


def _fresh_process_main(
    function: Callable[..., Any], args: tuple[Any, ...], environment: dict[str, str], out: Any
) -> None:
    """The child of ``in_fresh_process``: its environment set, ``function``'s result (or its
    traceback) sent on ``out``."""
    os.environ.update(environment)
    os.dup2(2, 1)  # anything a library prints goes to stderr, not into the parent's table
    try:
        out.send(("ok", function(*args)))
    except BaseException:
        out.send(("error", traceback.format_exc()))
    finally:
        out.close()


def in_fresh_process(
    function: Callable[..., Any],
    *args: Any,
    preload: Sequence[str],
    environment: dict[str, str] | None = None,
    timeout_s: float = 1800.0,
) -> Any:
    """``function(*args)`` in a process of its own; its (picklable) result, or RuntimeError
    with the child's traceback.

    The process is a fork of multiprocessing's fork server, which has imported ``preload``
    and run nothing else: each configuration gets a fresh allocator, thread pool, compile
    state and memory high-water mark without paying the imports again (torch, transformers and
    peft are 4-7 s of CPU a process on 2 cores, most of a small configuration's time). A
    setting read when a module is imported (OpenMP's wait policy when torch loads) needs a
    process started from scratch instead. ``environment`` is set in the child before
    ``function`` runs; the child's stdout goes to stderr.
    """
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(preload))
    receive, send = context.Pipe(duplex=False)
    process = context.Process(
        target=_fresh_process_main, args=(function, args, dict(environment or {}), send)
    )
    process.start()
    send.close()
    name = getattr(function, "__name__", "the child")
    try:
        if not receive.poll(timeout_s):
            raise RuntimeError(f"{name} gave no result in {timeout_s:.0f} s")
        status, value = receive.recv()
    except EOFError:
        status, value = "error", "its process ended without a result"
    finally:
        if process.is_alive():
            process.join(30)
        if process.is_alive():
            process.kill()
        process.join()
    if status != "ok":
        raise RuntimeError(f"{name} failed (exit code {process.exitcode}):\n{value}")
    return value
