"""One warmed-up process that forks a child per request: each README block, each benchmark
smoke and each ``art-core serve`` of the remote tests runs in a process of its own, without
paying the heavy imports again.

The server (``zygote``) imports ``PREIMPORT`` (torch, transformers, art_core's engine, trainer
and server: about 5 s of every process's start on 2 cores, most of the time of a small block
or smoke run, and of a test server's first model), says ``ready``, then for each request line
``{"id", "cwd", "out", "err"?, "env"?, ...}`` on stdin forks a child in a session of its own
and prints ``started ID PID``; when a child ends it prints ``exited PID STATUS`` (a negative
status: killed by that signal, as ``subprocess`` says it). Children run side by side.
Importing them starts no thread, so the fork is clean (the server refuses to fork, and says
so, when a thread runs after the imports); the child exits the normal way (atexit handlers
run), so a hang at exit still fails its request.

Run as a script (``python tests/fork_support.py``) it serves programs: a request's ``argv``
is run as ``python ARGV...`` would run it (``runpy``, ``__name__ == "__main__"``), or its
``module`` with ``argv`` as ``python -m MODULE ARGV...`` would; ``environ`` (the whole
environment) or ``env`` (values, or None to unset) is applied first, then ``cores`` (the CPU
affinity) and ``max_open_files``.
"""

from __future__ import annotations

import importlib
import json
import os
import queue
import resource
import runpy
import select
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

PREIMPORT = (
    "torch",
    "transformers.masking_utils",
    "transformers.modeling_layers",
    "art_core.backends.local",
    "art_core.engines.transformers_engine",
    "art_core.training.trainer",
    "art_core.server.cli",
)
# How often the server looks for children that ended while no request comes in.
_REAP_EVERY_S = 0.05


def zygote(run: Callable[[dict[str, Any]], None], preimport: tuple[str, ...] = PREIMPORT) -> None:
    """Serve requests on stdin: fork, run ``run(request)`` in the child; report each child's
    start and end (see the module's docstring)."""
    for name in preimport:
        importlib.import_module(name)
    if threading.active_count() != 1:
        print(f"not forking: {threading.active_count()} threads after the imports", flush=True)
        return
    print("ready", flush=True)
    pending = b""
    children = 0
    open_stdin = True
    while open_stdin or children:
        # One thread, no signal handler: requests and ended children are polled in turn.
        readable = select.select([0], [], [], _REAP_EVERY_S if children else None)[0]
        while children:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children -= 1
            print(f"exited {pid} {os.waitstatus_to_exitcode(wait_status)}", flush=True)
        if not readable or not open_stdin:
            continue
        data = os.read(0, 1 << 16)
        open_stdin = bool(data)
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                _child(run, request)  # never returns
            children += 1
            print(f"started {request['id']} {pid}", flush=True)


def _child(run: Callable[[dict[str, Any]], None], request: dict[str, Any]) -> None:
    """In the forked child: the request's session, folder, environment, limits and output,
    then ``run(request)``; exits through the interpreter with its status."""
    os.setsid()
    os.chdir(request["cwd"])
    if "environ" in request:
        os.environ.clear()
        os.environ.update(request["environ"])
    for key, value in request.get("env", {}).items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    if request.get("cores"):
        os.sched_setaffinity(0, request["cores"])
    if request.get("max_open_files") is not None:
        limit_open_files(request["max_open_files"])
    out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    err = (
        os.open(request["err"], os.O_WRONLY | os.O_CREAT | os.O_APPEND) if "err" in request else out
    )
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # not the server's request pipe
    os.dup2(out, 1)
    os.dup2(err, 2)
    status = 1
    try:
        run(request)
        status = 0
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 1
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    raise SystemExit(status)


def limit_open_files(limit: int) -> None:
    """This process's soft limit of open files (RLIMIT_NOFILE), its hard limit kept."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))


def run_script(request: dict[str, Any]) -> None:
    """Run ``request["argv"]`` as ``python ARGV...`` would (its folder first on
    ``sys.path``), or with ``request["module"]`` as ``python -m MODULE ARGV...`` would."""
    argv = [str(a) for a in request["argv"]]
    if "module" in request:
        sys.argv = [request["module"], *argv]
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        return
    sys.argv = argv
    sys.path.insert(0, str(Path(argv[0]).resolve().parent))
    runpy.run_path(argv[0], run_name="__main__")


class ForkedChild:
    """A child of the fork server, as much of ``subprocess.Popen`` as the tests use:
    ``pid``, ``returncode``, ``poll()`` and ``wait(timeout)``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._ended = threading.Event()

    def _end(self, status: int) -> None:
        self.returncode = status
        self._ended.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"forked child {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode


class ForkServer:
    """The pytest side of ``zygote``: started with ``argv`` (a script that calls ``zygote``)
    and ``env``; ``start`` a request (children run side by side), or ``run`` one to its end.
    ``ready`` is False when the server could not fork."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self._lock = threading.Lock()
        self._ids = 0
        self._starting: dict[int, queue.Queue[ForkedChild | None]] = {}
        self._running: dict[int, ForkedChild] = {}  # by pid
        self._first: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        try:
            self.ready = self._first.get(timeout=120) == "ready"
        except queue.Empty:
            self.ready = False

    def _read(self) -> None:
        assert self.process.stdout is not None
        with self.process.stdout as stdout:  # closed at the end, not left to the collector
            for line in stdout:
                word, *rest = line.split() or [""]
                if word == "started":
                    child = ForkedChild(int(rest[1]))
                    with self._lock:
                        self._running[child.pid] = child
                        self._starting.pop(int(rest[0])).put(child)
                elif word == "exited":
                    with self._lock:
                        ended = self._running.pop(int(rest[0]), None)
                    if ended is not None:
                        ended._end(int(rest[1]))
                else:
                    self._first.put(line.strip())
        self._first.put("")  # the server is gone: nothing waits for "ready" forever,
        with self._lock:  # nor for a child it can no longer report
            for child in self._running.values():
                child._end(-9)
            for starting in self._starting.values():
                starting.put(None)
            self._running.clear()
            self._starting.clear()

    def alive(self) -> bool:
        return self.ready and self.process.poll() is None

    def running(self) -> int:
        """How many of its children run now."""
        with self._lock:
            return len(self._running)

    def start(self, request: dict[str, Any]) -> ForkedChild:
        """Fork a child for ``request``; its handle once it runs."""
        assert self.process.stdin is not None
        starting: queue.Queue[ForkedChild | None] = queue.Queue()
        with self._lock:
            self._ids += 1
            self._starting[self._ids] = starting
            self.process.stdin.write(json.dumps({**request, "id": self._ids}) + "\n")
            self.process.stdin.flush()
        child = starting.get(timeout=60)
        if child is None:
            raise RuntimeError("the fork server ended before it started the request")
        return child

    def run(self, request: dict[str, Any], timeout_s: float) -> int:
        """Run ``request`` in a forked child; its exit status. Past ``timeout_s`` the child's
        process group is killed (what it started too), a line saying so is added to its
        ``out`` file, and the status is -9."""
        child = self.start(request)
        try:
            return child.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            with open(request["out"], "a") as out:
                out.write(f"\n(killed after {timeout_s:.0f} s)")
            try:
                return child.wait(60)
            except subprocess.TimeoutExpired:
                return -9

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


if __name__ == "__main__":
    zygote(run_script)
