"""One warmed-up process that forks a child per request: each README block and each benchmark
smoke runs in a process of its own, without paying the heavy imports again.

The server (``zygote``) imports ``PREIMPORT`` (torch, transformers, art_core's engine and
trainer: about 5 s of every process's start on 2 cores, most of the time of a small block or
smoke run), says ``ready``, then for each request line ``{"cwd", "out", "err"?, ...}`` on
stdin forks a child in a session of its own, prints the child's pid, then its exit status.
Importing them starts no thread, so the fork is clean (the server refuses to fork, and says
so, when a thread runs after the imports); the child exits the normal way (atexit handlers
run), so a hang at exit still fails its request.

Run as a script (``python tests/fork_support.py``) it serves scripts: a request's ``argv``
is run as ``python ARGV...`` would run it (``runpy``, ``__name__ == "__main__"``), with
``env`` (values, or None to unset) applied first.
"""

from __future__ import annotations

import importlib
import json
import os
import queue
import runpy
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
)


def zygote(run: Callable[[dict[str, Any]], None]) -> None:
    """Serve requests on stdin: fork, run ``run(request)`` in the child, report its status."""
    for name in PREIMPORT:
        importlib.import_module(name)
    if threading.active_count() != 1:
        print(f"not forking: {threading.active_count()} threads after the imports", flush=True)
        return
    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:  # the child: run the request, then exit through the interpreter
            os.setsid()
            os.chdir(request["cwd"])
            for key, value in request.get("env", {}).items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            err = (
                os.open(request["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                if "err" in request
                else out
            )
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
        print(pid, flush=True)
        _, wait_status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(wait_status), flush=True)


def run_script(request: dict[str, Any]) -> None:
    """Run ``request["argv"]`` as ``python ARGV...`` would: its folder first on ``sys.path``."""
    argv = [str(a) for a in request["argv"]]
    sys.argv = argv
    sys.path.insert(0, str(Path(argv[0]).resolve().parent))
    runpy.run_path(argv[0], run_name="__main__")


class ForkServer:
    """The pytest side of ``zygote``: started with ``argv`` (a script that calls ``zygote``)
    and ``env``; one request at a time. ``ready`` is False when the server could not fork."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.ready = self._line(120) == "ready"

    def _read(self) -> None:
        assert self.process.stdout is not None
        with self.process.stdout as stdout:  # closed at the end, not left to the collector
            for line in stdout:
                self.lines.put(line.strip())

    def _line(self, timeout: float) -> str:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return ""

    def run(self, request: dict[str, Any], timeout_s: float) -> int:
        """Run ``request`` in a forked child; its exit status. Past ``timeout_s`` the child's
        process group is killed (what it started too), a line saying so is added to its
        ``out`` file, and the status is -9."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        pid = int(self._line(60))
        status = self._line(timeout_s)
        if not status:
            os.killpg(pid, signal.SIGKILL)
            status = self._line(60)
            with open(request["out"], "a") as out:
                out.write(f"\n(killed after {timeout_s:.0f} s)")
        return int(status or -9)

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)


if __name__ == "__main__":
    zygote(run_script)
