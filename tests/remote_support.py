"""Helpers for the remote tests: ``art-core serve`` as a real process, and a cuttable proxy.

The server runs as ``python -m art_core.server.cli`` on port 0 (the OS picks a free port;
the server prints it), with its stderr in a log file for failure messages. It is forked
from this test process's fork server (``fork_support``: torch, transformers and art_core
imported once, about 2-5 s of every server's first model on 2 cores), in the environment,
affinity and file limit it would have had as a subprocess; where no fork server can run, it
is a subprocess.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from fork_support import ForkedChild, ForkServer, limit_open_files

import art_core as art

LISTENING = re.compile(r"listening on (http://\S+)")
TOKEN_LINE = re.compile(r"token (\S+) \(generated")

# This process's fork server for test servers: started at the first server, kept for the
# session (its imports are what it saves), started again if something killed it.
_FORK_SERVER: list[ForkServer] = []
_FORK_SERVER_LOCK = threading.Lock()
# How often a forked server's output file is read for new lines.
_TAIL_EVERY_S = 0.05


def _server_forks() -> ForkServer | None:
    """This process's fork server, or None where it cannot fork (a thread after its imports)."""
    with _FORK_SERVER_LOCK:
        if _FORK_SERVER and _FORK_SERVER[0].ready and not _FORK_SERVER[0].alive():
            _FORK_SERVER.clear()  # killed (a timed-out test's processes are): a new one
        if not _FORK_SERVER:
            script = Path(__file__).with_name("fork_support.py")
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # each line as the server prints it
            _FORK_SERVER.append(ForkServer([sys.executable, str(script)], env))
        return _FORK_SERVER[0] if _FORK_SERVER[0].ready else None


def close_server_forks() -> None:
    """Stop the fork server at the end of the session, unless a server it forked still runs
    (a test that did not stop its own: the session's reaper kills both and names them)."""
    with _FORK_SERVER_LOCK:
        if _FORK_SERVER and not _FORK_SERVER[0].running():
            _FORK_SERVER.pop().close()


def _tail(path: Path, child: ForkedChild, on_line: Any) -> None:
    """Call ``on_line`` with each line of ``path`` as the child writes it, to its end."""
    with open(path) as file:
        pending = ""
        while True:
            ended = child.poll() is not None  # before the read: nothing written after is lost
            chunk = file.read()
            pending += chunk
            *lines, pending = pending.split("\n")
            for line in lines:
                on_line(line)
            if ended and not chunk:
                if pending:
                    on_line(pending)
                return
            if not chunk:
                time.sleep(_TAIL_EVERY_S)


class ServerProcess:
    """``art-core serve`` in a subprocess.

    Example:
        >>> server = ServerProcess(tmp_path / "art", token="t").start()  # doctest: +SKIP
        >>> server.url  # doctest: +SKIP
        'http://127.0.0.1:40123'
    """

    def __init__(
        self,
        path: Path,
        *,
        token: str | None = "test-token",
        port: int = 0,
        args: list[str] | None = None,
        max_open_files: int | None = None,
    ) -> None:
        self.path = Path(path)
        # RLIMIT_NOFILE of the server process (e.g. 1024, a common default), None: inherited.
        self.max_open_files = max_open_files
        self.token = token
        self.port = port
        self.args = list(args or [])
        self.url = ""
        self.stdout_lines: list[str] = []
        self.process: subprocess.Popen[str] | ForkedChild | None = None
        self.log = self.path.parent / f"{self.path.name}-server.log"

    def start(self, timeout: float = 120.0) -> ServerProcess:
        command = [sys.executable, "-m", "art_core.server.cli", "--path", str(self.path)]
        command += ["--host", "127.0.0.1", "--port", str(self.port), *self.args]
        env = dict(os.environ)
        env.pop("ART_CORE_TOKEN", None)
        if self.token is not None:
            env["ART_CORE_TOKEN"] = self.token  # not on the command line
        self.path.parent.mkdir(parents=True, exist_ok=True)
        ready = threading.Event()

        def on_line(line: str) -> None:
            self.stdout_lines.append(line.rstrip("\n"))
            found = LISTENING.search(line)
            if found:
                self.url = found.group(1)
                ready.set()

        forks = _server_forks()
        if forks is not None:
            out = self.path.parent / f"{self.path.name}-server.out"
            out.write_text("")
            child = forks.start(
                {
                    "module": "art_core.server.cli",
                    "argv": command[3:],
                    "cwd": os.getcwd(),
                    "environ": env,
                    "cores": sorted(os.sched_getaffinity(0)),
                    "max_open_files": self.max_open_files,
                    "out": str(out),
                    "err": str(self.log),
                }
            )
            self.process = child

            def tail() -> None:
                _tail(out, child, on_line)
                ready.set()

            threading.Thread(target=tail, daemon=True).start()
        else:
            self._start_subprocess(command, env, on_line, ready)
        if not ready.wait(timeout) or not self.url:
            self.kill()
            raise RuntimeError(f"the server did not start: {self.describe()}")
        self.port = int(self.url.rsplit(":", 1)[1])  # a restart reuses the port
        return self

    def _start_subprocess(
        self, command: list[str], env: dict[str, str], on_line: Any, ready: threading.Event
    ) -> None:
        limit = self.max_open_files

        def set_limits() -> None:
            if limit is not None:
                limit_open_files(limit)

        with open(self.log, "a") as log:  # the child holds its own copy of the file
            process = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=env,
                bufsize=1,
                preexec_fn=set_limits if limit is not None else None,
            )
        self.process = process

        def read() -> None:
            # Drains stdout for the whole life of the process (a full pipe would block it).
            assert process.stdout is not None
            with process.stdout as stdout:  # closed at the end, not left to the collector
                for line in stdout:
                    on_line(line)
            ready.set()

        threading.Thread(target=read, daemon=True).start()

    def describe(self) -> str:
        log = self.log.read_text()[-3000:] if self.log.exists() else ""
        return f"stdout: {self.stdout_lines}\nstderr tail:\n{log}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def kill(self) -> None:
        """SIGKILL: no cleanup at all, as in a crash or an OOM kill."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(30)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, then wait for a clean exit (training in progress is finished first)."""
        assert self.process is not None
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()  # never leave a server behind
            raise

    def backend(self, **kwargs: object) -> art.RemoteBackend:
        return art.RemoteBackend(self.url, token=self.token, **kwargs)  # type: ignore[arg-type]


class CuttableProxy:
    """A TCP proxy whose open connections can be cut at once, like a network drop.

    Example:
        >>> proxy = await CuttableProxy("127.0.0.1", 7999).start()  # doctest: +SKIP
        >>> proxy.cut()  # doctest: +SKIP
    """

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.connections = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self.url = ""

    async def start(self) -> CuttableProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers -= {writer, up_writer}

    def cut(self) -> int:
        """Abort every open connection (both sides); new ones are still accepted."""
        writers, self._writers = list(self._writers), set()
        for writer in writers:
            writer.transport.abort()
        return len(writers)

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


async def rollout(
    model: art.TrainableModel, i: int, *, max_tokens: int = 6, turns: int = 1
) -> art.Trajectory:
    """A captured rollout: ``turns`` chat completions carrying the marker ``task {i}``."""
    async with art.capture(model, metadata={"i": i}) as run:
        client = run.openai_client(max_retries=8)
        messages: list[Any] = [{"role": "user", "content": f"task {i}: count"}]
        for turn in range(turns):
            response = await client.chat.completions.create(
                model=run.model_name, messages=messages, max_tokens=max_tokens, temperature=1.0
            )
            messages.append(
                {"role": "assistant", "content": response.choices[0].message.content or ""}
            )
            messages.append({"role": "user", "content": f"task {i}: turn {turn + 1}"})
    return run.trajectory(reward=float(i % 3))


async def groups_of(
    model: art.TrainableModel, n_groups: int = 1, size: int = 4
) -> list[art.TrajectoryGroup]:
    return await art.gather_trajectory_groups(
        (
            art.TrajectoryGroup(rollout(model, g * size + i) for i in range(size))
            for g in range(n_groups)
        ),
        pbar_desc=None,
    )
