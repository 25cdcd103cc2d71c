"""Running an untrusted command: its own folder, its own process group, bounded in time and
output, killed with every process it started, and (where the OS allows) no network but the
gateway.

Network isolation uses Linux namespaces through util-linux's ``unshare``: a new network
namespace (only a loopback, where ``bridge`` forwards the gateway's address to a Unix socket
served here), and a new PID namespace whose first process is the command, so that when it
ends, or ``unshare`` is killed (``--kill-child``), the kernel kills everything it started,
daemons included. As root ``unshare --net --pid`` is enough; otherwise an unprivileged user
namespace (``--user --map-root-user``) grants it where the kernel allows those. Where
neither works (not Linux, no ``unshare``, user namespaces off), or the gateway is not on this
machine's loopback, the command runs with the network open, in its own process group; the
result says which (``network``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from art_cli_agents.forwarding import CHUNK, pipe

logger = logging.getLogger(__name__)

Network = Literal["auto", "isolated", "open"]
# How long a command has to exit after SIGTERM before SIGKILL.
KILL_GRACE_S = 3.0


@dataclass(frozen=True)
class Limits:
    """Bounds of one agent run.

    ``timeout_s``: the agent's wall time (then it is killed with everything it started);
    ``check_timeout_s``: the check command's; ``max_output_bytes``: how much of the end of
    each of stdout and stderr is kept (the rest is read and dropped, so a chatty agent never
    blocks on a full pipe nor grows memory).
    """

    timeout_s: float = 600.0
    check_timeout_s: float = 120.0
    max_output_bytes: int = 256 * 1024

    def __post_init__(self) -> None:
        if not self.timeout_s > 0 or not self.check_timeout_s > 0:
            raise ValueError("timeouts must be positive")
        if self.max_output_bytes < 0:
            raise ValueError("max_output_bytes must be >= 0")


@dataclass(frozen=True)
class ProcessResult:
    """How a sandboxed command ended: exit status (None when killed by the timeout), the
    kept tail of its output, how much it wrote in all, and the network it had."""

    exit_code: int | None
    timed_out: bool
    seconds: float
    stdout: str
    stderr: str
    output_bytes: int
    network: Literal["isolated", "open"]


@functools.cache
def isolation_prefix() -> tuple[str, ...] | None:
    """The ``unshare`` command line that gives a command its own network and PID namespaces
    here, or None when this machine allows neither form (probed once per process)."""
    unshare = shutil.which("unshare")
    if unshare is None or not sys.platform.startswith("linux"):
        return None
    common = ("--net", "--pid", "--fork", "--kill-child")
    forms: list[tuple[str, ...]] = [(unshare, "--user", "--map-root-user", *common)]
    if os.geteuid() == 0:
        forms.insert(0, (unshare, *common))
    for form in forms:
        try:
            probe = subprocess.run([*form, "true"], capture_output=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return form
    return None


class _Tail:
    """The last ``limit`` bytes of a stream, and how many it carried in all."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.kept = bytearray()
        self.total = 0

    async def drain(self, stream: asyncio.StreamReader | None) -> None:
        if stream is None:
            return
        while chunk := await stream.read(CHUNK):
            self.total += len(chunk)
            self.kept += chunk
            if len(self.kept) > self.limit:
                del self.kept[: len(self.kept) - self.limit]

    def text(self) -> str:
        return self.kept.decode("utf-8", errors="replace")


async def _forward_to(host: str, port: int, path: Path) -> asyncio.AbstractServer:
    """A Unix socket at ``path`` whose connections are forwarded to ``host:port``."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    return await asyncio.start_unix_server(handle, path=str(path))


def _kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def run_sandboxed(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    limits: Limits,
    timeout_s: float,
    network: Network = "auto",
    gateway: tuple[str, int] | None = None,
    scratch: Path | None = None,
) -> ProcessResult:
    """Run ``argv`` in ``cwd`` with exactly ``env``; see the module. ``gateway``: the one
    address reachable from an isolated network (none when None); ``scratch``: where the
    Unix socket goes (``cwd``'s parent by default). ``network="isolated"`` fails (RuntimeError)
    where isolation is not possible; ``"auto"`` falls back to an open network.

    Example:
        >>> result = await run_sandboxed(["ls"], cwd=Path("."), env={}, limits=Limits(), timeout_s=5)  # doctest: +SKIP
    """
    prefix = isolation_prefix() if network != "open" else None
    loopback = gateway is None or gateway[0] in ("127.0.0.1", "localhost")
    if network == "isolated" and (prefix is None or not loopback):
        raise RuntimeError(
            "network isolation is not possible here: "
            + (
                "it needs util-linux's unshare with network and PID namespaces (as root, or "
                "with unprivileged user namespaces)"
                if prefix is None
                else f"the gateway at {gateway} is not on this machine's loopback"
            )
        )
    isolated = prefix is not None and loopback
    if network == "auto" and not isolated:
        logger.info("running %s with the network open (no isolation possible here)", argv[0])
    command = list(argv)
    server: asyncio.AbstractServer | None = None
    if isolated:
        assert prefix is not None
        if gateway is not None:
            socket_path = (scratch or cwd.parent) / "gateway.sock"
            server = await _forward_to("127.0.0.1", gateway[1], socket_path)
            bridge = [sys.executable, "-m", "art_cli_agents.bridge", str(socket_path)]
            command = [*prefix, *bridge, "127.0.0.1", str(gateway[1]), "--", *command]
        else:
            command = [*prefix, *command]
    started = time.perf_counter()
    stdout, stderr = _Tail(limits.max_output_bytes), _Tail(limits.max_output_bytes)
    process = await asyncio.create_subprocess_exec(
        *command,
        cwd=str(cwd),
        env=dict(env),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,  # its own process group: killed as one
    )
    readers = asyncio.gather(stdout.drain(process.stdout), stderr.drain(process.stderr))
    timed_out = False
    try:
        try:
            await asyncio.wait_for(process.wait(), timeout_s)
        except TimeoutError:
            timed_out = True
    finally:
        # Whatever ended the wait (exit, timeout, the rollout cancelled): nothing it started
        # outlives it.
        _kill_group(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(process.wait()), KILL_GRACE_S)
        except TimeoutError:
            _kill_group(process.pid, signal.SIGKILL)
            await process.wait()
        _kill_group(process.pid, signal.SIGKILL)  # stragglers of the group
        try:
            await asyncio.wait_for(readers, KILL_GRACE_S)
        except TimeoutError:
            # A process outside the group still holds the pipes: stop reading them.
            readers.cancel()
        if server is not None:
            server.close()
    return ProcessResult(
        exit_code=None if timed_out else process.returncode,
        timed_out=timed_out,
        seconds=time.perf_counter() - started,
        stdout=stdout.text(),
        stderr=stderr.text(),
        output_bytes=stdout.total + stderr.total,
        network="isolated" if isolated else "open",
    )
