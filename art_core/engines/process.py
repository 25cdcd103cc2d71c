"""An engine server run as a child process: started, waited for, and stopped with every
process it forked.

Used for vLLM's server (``VLLMEngine``) and for engine workers (``WorkerEngine``). The child
gets its own process group (so stopping it stops its children too) and, on Linux, SIGTERM
when our process dies, so it never outlives us. Its output goes to a log file whose tail
errors quote.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
from pathlib import Path

import httpx

from art_core.clients import shared_ssl_context
from art_core.engines.base import EngineError


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now.

    Example:
        >>> 0 < free_port() < 65536
        True
    """
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: the server gets SIGTERM if our process dies, so it never outlives us."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class ServerProcess:
    """One child process serving HTTP at ``url``, logging to ``log_path``.

    Example:
        >>> server = ServerProcess(["python", "-m", "http.server", "8000"], Path("s.log"),
        ...                        url="http://127.0.0.1:8000")  # starts a server: on port 8000  # doctest: +SKIP
        >>> await server.start(); await server.wait_ready("/", within_s=30)  # starts a server  # doctest: +SKIP
    """

    def __init__(
        self,
        command: list[str],
        log_path: Path,
        *,
        url: str,
        env: dict[str, str] | None = None,
        label: str = "server",
    ) -> None:
        self.command = command
        self.log_path = Path(log_path)
        self.url = url
        self.env = env
        self.label = label
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    async def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.process = await asyncio.to_thread(self._spawn)

    def _spawn(self) -> subprocess.Popen[bytes]:
        with open(self.log_path, "ab") as log:
            return subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,  # its own group: stop() reaches what it forked
                preexec_fn=_die_with_parent,
            )

    async def wait_ready(self, health_path: str = "/health", *, within_s: float) -> None:
        """Poll ``health_path`` until it answers 200; ``EngineError`` with the log's tail if
        the process exits first or ``within_s`` seconds pass (the process is then stopped)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        async with httpx.AsyncClient(base_url=self.url, verify=shared_ssl_context()) as client:
            while loop.time() < deadline:
                if self.process is None or self.process.poll() is not None:
                    code = self.process.returncode if self.process is not None else None
                    raise EngineError(
                        f"the {self.label} exited with code {code}:\n{self.log_tail()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(health_path, timeout=2)).status_code == 200:
                        return
                await asyncio.sleep(0.2)
        await self.stop()
        raise EngineError(
            f"the {self.label} was not ready after {within_s:.0f} s:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL the process group at once (what a crash looks like; tests use it)."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)

    async def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM the process group, SIGKILL after ``grace_s``; wait for the exit."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                await asyncio.to_thread(process.wait, grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
        await asyncio.to_thread(process.wait)
