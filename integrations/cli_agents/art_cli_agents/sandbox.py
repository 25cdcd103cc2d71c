"""Running an untrusted command: its own folder, its own process group, bounded in time,
output and (where the kernel allows) number of processes, killed with every process it
started, and (where the OS allows) no network but the gateway and no writes but in its
scratch folder.

Isolation uses Linux namespaces through util-linux's ``unshare``: a new PID namespace, a new
mount namespace and (unless the network is left open) a new network namespace, whose first
process is ``confine`` (see there). It makes every mount read-only but the run's scratch
folder, bounds the processes, drops the privileges that could undo either, brings up the
gateway's forwarder (``bridge``: only a loopback exists in the network namespace, where the
gateway's address is forwarded to a Unix socket served here), then runs the command and
reaps its orphans. When the command ends, or ``unshare`` is killed (``--kill-child``), the
kernel kills everything the run started, daemons included. As root ``unshare`` is enough;
otherwise an unprivileged user namespace (``--user --map-root-user``) grants it where the
kernel allows those. Where neither works (not Linux, no ``unshare``, user namespaces off),
the command runs with the network and the filesystem open, in its own process group; where
the gateway is not on this machine's loopback, with the network open. The result says which
(``network``, ``filesystem``).

Isolated, a run's folders can be shown at other paths (``seen_at``), the same for every run
(``RUN_ROOT``, in the run's own ``/tmp``): agents name their working folder and ``HOME`` in
their prompts, and identical prompts across a group of runs let the inference engine's prefix
cache share them. Each run has its own mount namespace, so runs at the same paths never meet.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from art_cli_agents.forwarding import CHUNK, pipe

# A preload meant for the command alone (art_cli_agents.clock's libfaketime): the launcher,
# a Python program, runs without it and sets it for the command (confine.py spells it too).
PRELOAD_VARIABLE = "ART_SANDBOX_LD_PRELOAD"

logger = logging.getLogger(__name__)

Network = Literal["auto", "isolated", "open"]
Filesystem = Literal["auto", "isolated", "open"]
# How long a command has to exit after SIGTERM before SIGKILL.
KILL_GRACE_S = 3.0
# The launcher inside the namespaces, run as a file (see confine's module).
CONFINE = Path(__file__).resolve().with_name("confine.py")
# Where an isolated run sees its folders (rollout: RUN_ROOT/work, /home, /tmp), whichever run
# it is: in the run's own /tmp (a tmpfs of its mount namespace), never made on the machine.
RUN_ROOT = Path("/tmp/art-run")


@dataclass(frozen=True)
class Limits:
    """Bounds of one agent run.

    ``timeout_s``: the agent's wall time (then it is killed with everything it started);
    ``check_timeout_s``: the check command's; ``max_output_bytes``: how much of the end of
    each of stdout and stderr is kept (the rest is read and dropped, so a chatty agent never
    blocks on a full pipe nor grows memory); ``max_processes``: processes and threads alive
    at once, where the kernel bounds them per PID namespace (Linux 6.14+, isolated runs): a
    fork fails beyond a number between it and it + 300 (None: no bound); ``max_calls``: the
    gateway answers at most this many model calls of the run and refuses a later one
    unsampled (``art.capture(max_calls=...)``); the run is stopped (killed like a timed-out
    one, but not counted as timed out) as soon as it asks for that call (it has acted on its
    last answer: the tools it asked for ran), or ``settle_s`` seconds after its last allowed
    call was answered if it neither asks again nor ends: a bound in turns for agents that
    have none of their own (Codex CLI), so that how far a run gets does not depend on the
    machine's speed (None: no bound).
    """

    timeout_s: float = 600.0
    check_timeout_s: float = 120.0
    max_output_bytes: int = 256 * 1024
    max_processes: int | None = 4096
    max_calls: int | None = None
    settle_s: float = 10.0

    def __post_init__(self) -> None:
        if not self.timeout_s > 0 or not self.check_timeout_s > 0:
            raise ValueError("timeouts must be positive")
        if self.max_calls is not None and self.max_calls < 1:
            raise ValueError("max_calls must be >= 1 (or None)")
        if not self.settle_s >= 0:
            raise ValueError("settle_s must be >= 0")
        if self.max_output_bytes < 0:
            raise ValueError("max_output_bytes must be >= 0")
        if self.max_processes is not None and self.max_processes < 1:
            raise ValueError("max_processes must be >= 1 (or None)")


@dataclass(frozen=True)
class ProcessResult:
    """How a sandboxed command ended: exit status (None when killed by the timeout or
    stopped; minus the signal when a signal ended it), the kept tail of its output, how much
    it wrote in all, the network and filesystem it had, how many of its processes were still
    alive when it ended or its time ran out (all killed; itself included when it timed out;
    only those left in its process group where it was not isolated), the bound on its
    processes and threads (None: none), and whether the caller stopped it (``stop``)."""

    exit_code: int | None
    timed_out: bool
    seconds: float
    stdout: str
    stderr: str
    output_bytes: int
    network: Literal["isolated", "open"]
    filesystem: Literal["isolated", "open"] = "open"
    processes_killed: int = 0
    process_limit: int | None = None
    stopped: bool = False


@functools.cache
def isolation_prefix() -> tuple[str, ...] | None:
    """The ``unshare`` command line that gives a command its own network, PID and mount
    namespaces here, or None when this machine allows none of its forms (probed once per
    process)."""
    unshare = shutil.which("unshare")
    if unshare is None or not sys.platform.startswith("linux"):
        return None
    common = ("--net", "--pid", "--mount-proc", "--fork", "--kill-child")
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


@functools.cache
def filesystem_isolation() -> bool:
    """Whether a command can run here with every mount read-only but its scratch folder
    (``isolation_prefix`` works and ``confine`` can remount; probed once per process)."""
    prefix = isolation_prefix()
    if prefix is None:
        return False
    with tempfile.TemporaryDirectory(prefix="art-cli-probe-") as folder:
        launcher = _launcher(
            [folder],
            seen_at={folder: str(RUN_ROOT / "probe")},  # as a run's folders are
            gateway=None,
            max_processes=None,
            report_fd=None,
        )
        try:
            probe = subprocess.run(
                [*prefix, *launcher, "true"],
                cwd=folder,  # as a run's: inside its writable folder
                capture_output=True,
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        if probe.returncode != 0:
            logger.info("no filesystem isolation here: %s", probe.stderr.decode(errors="replace"))
        return probe.returncode == 0


def isolates_filesystem(filesystem: Filesystem) -> bool:
    """Whether a run with ``filesystem`` gets an isolated one here (then its folders can be
    seen at other paths: ``run_sandboxed``'s ``seen_at``); RuntimeError for ``"isolated"``
    where that is not possible."""
    isolated = filesystem != "open" and filesystem_isolation()
    if filesystem == "isolated" and not isolated:
        raise RuntimeError(
            "filesystem isolation is not possible here: it needs util-linux's unshare with "
            "PID and mount namespaces (as root, or with unprivileged user namespaces) and "
            "permission to remount read-only in them"
        )
    return isolated


def _launcher(
    writable: Sequence[str],
    *,
    seen_at: Mapping[str, str] | None = None,
    readable: Sequence[str] = (),
    gateway: tuple[str, str, int] | None,
    max_processes: int | None,
    report_fd: int | None,
) -> list[str]:
    command = [sys.executable, "-I", str(CONFINE)]
    if report_fd is not None:
        command += ["--report-fd", str(report_fd)]
    for folder in writable:
        if seen_at and folder in seen_at:
            command += ["--writable-at", folder, seen_at[folder]]
        else:
            command += ["--writable", folder]
    for path in readable:
        command += ["--readable", path]
    if gateway is not None:
        command += ["--gateway", gateway[0], gateway[1], str(gateway[2])]
    if max_processes is not None:
        command += ["--max-processes", str(max_processes)]
    return [*command, "--"]


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


def _alive_in_group(pgid: int) -> int:
    """How many live processes (not zombies) are in process group ``pgid``."""
    count = 0
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        count += int(fields[2]) == pgid and fields[0] not in ("Z", "X")
    return count


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


async def _exited(pidfd: int) -> None:
    """Wait until the process of ``pidfd`` has exited."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(pidfd, readable)
    try:
        await done
    finally:
        loop.remove_reader(pidfd)


async def _exit_of(process: asyncio.subprocess.Process) -> int:
    """The process's exit status, as soon as it has exited: ``process.wait()`` also waits
    until its pipes are closed, which a detached child that kept them may never do."""
    # asyncio sets returncode when its child watcher reaps the process; no event tells it but
    # wait(), which waits for the pipes too.
    while process.returncode is None:  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    return process.returncode


def _read_report(fd: int) -> dict[str, Any]:
    """The launcher's JSON lines, merged (what it managed to write before it ended)."""
    data = b""
    with contextlib.suppress(BlockingIOError, OSError):
        while chunk := os.read(fd, 65536):
            data += chunk
    report: dict[str, Any] = {}
    for line in data.decode(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            report.update(json.loads(line))
    return report


def _command_environment(env: Mapping[str, str], *, launched: bool) -> dict[str, str]:
    """``env`` as the process started gets it. A preload meant for the command
    (``PRELOAD_VARIABLE``) stays under its own name for the launcher, which sets it
    for the command alone; without a launcher it is the command's ``LD_PRELOAD`` now."""
    env = dict(env)
    if not launched and PRELOAD_VARIABLE in env:
        env["LD_PRELOAD"] = env.pop(PRELOAD_VARIABLE)
    return env


def _writable_folders(folders: Sequence[Path], cwd: Path) -> list[str]:
    """``folders`` as absolute paths without links; ValueError unless one holds ``cwd``."""
    resolved = [os.path.realpath(folder) for folder in folders]
    here = os.path.realpath(cwd)
    if not any(os.path.commonpath([folder, here]) == folder for folder in resolved):
        raise ValueError(f"cwd {cwd} is not inside a writable folder ({resolved})")
    return resolved


def _moved_folders(seen_at: Mapping[Path, Path], folders: Sequence[str]) -> dict[str, str]:
    """``seen_at`` by the folders' absolute paths without links; ValueError unless each is
    one of ``folders``."""
    moved = {os.path.realpath(folder): str(seen) for folder, seen in seen_at.items()}
    if not set(moved) <= set(folders):
        raise ValueError(f"seen_at names folders that are not writable: {sorted(moved)}")
    return moved


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
    filesystem: Filesystem = "auto",
    writable: Sequence[Path] | None = None,
    seen_at: Mapping[Path, Path] | None = None,
    readable: Sequence[Path] = (),
    stop: asyncio.Event | None = None,
) -> ProcessResult:
    """Run ``argv`` in ``cwd`` with exactly ``env``; see the module. ``gateway``: the one
    address reachable from an isolated network (none when None); ``scratch``: where the
    gateway's Unix socket goes (``cwd``'s parent by default); ``writable``: the folders an
    isolated filesystem leaves writable (one must hold ``cwd``; ``[scratch]`` by default, else
    ``[cwd]``); ``seen_at``: where the command sees some of them instead of at their own
    paths (folder -> an absolute path in ``/tmp``, e.g. under ``RUN_ROOT``; the command
    starts at ``cwd``'s place there), only with an isolated filesystem (RuntimeError
    otherwise: ask ``isolates_filesystem`` first, and give ``env`` and ``argv`` the paths
    the command will see); ``readable``: folders or files outside those that the command
    reads, kept visible (read-only, at their own paths) where an isolated filesystem's
    private ``/tmp`` would hide them. ``network`` or ``filesystem`` ``"isolated"`` fails
    (RuntimeError) where that isolation is not possible; ``"auto"`` falls back to open.
    RuntimeError too when the sandbox could not confine the run (the command never ran).
    ``stop``: once set, the command is ended as on a timeout (``stopped`` in the result).

    Example:
        >>> result = await run_sandboxed(["ls"], cwd=Path("."), env={}, limits=Limits(), timeout_s=5)
        >>> result.exit_code, result.timed_out
        (0, False)
    """
    prefix, net_isolated, fs_isolated = _isolation(
        argv, network=network, filesystem=filesystem, gateway=gateway, seen_at=seen_at
    )
    folders = _writable_folders(writable or [scratch or cwd], cwd) if fs_isolated else []
    isolated = net_isolated or fs_isolated
    launch = await _launch(
        argv,
        prefix if isolated else None,
        net_isolated=net_isolated,
        gateway=gateway,
        socket_folder=scratch or cwd.parent,
        folders=folders,
        seen_at=_moved_folders(seen_at or {}, folders),
        readable=[str(path) for path in readable] if fs_isolated else [],
        max_processes=limits.max_processes,
    )
    started = time.perf_counter()
    stdout, stderr = _Tail(limits.max_output_bytes), _Tail(limits.max_output_bytes)
    process = await _start(launch, cwd, _command_environment(env, launched=isolated))
    readers = asyncio.gather(stdout.drain(process.stdout), stderr.drain(process.stderr))
    try:
        ended = await _ended(process, timeout_s, stop)
    finally:
        killed_in_group = await _end_process(process, isolated=isolated, readers=readers)
        if launch.server is not None:
            launch.server.close()
        report: dict[str, Any] = {}
        if isolated:
            report = _read_report(launch.report_read)
            os.close(launch.report_read)
    if "error" in report:
        raise RuntimeError(f"the sandbox could not confine {argv[0]!r}: {report['error']}")
    limit = report.get("process_limit")
    return ProcessResult(
        exit_code=None if ended != "exited" else _exit_code(process.returncode, report),
        timed_out=ended == "timed out",
        seconds=time.perf_counter() - started,
        stdout=stdout.text(),
        stderr=stderr.text(),
        output_bytes=stdout.total + stderr.total,
        network="isolated" if net_isolated else "open",
        filesystem="isolated" if fs_isolated else "open",
        processes_killed=int(report.get("alive", 0)) if isolated else killed_in_group,
        process_limit=None if limit is None else int(limit),
        stopped=ended == "stopped",
    )


def _isolation(
    argv: Sequence[str],
    *,
    network: Network,
    filesystem: Filesystem,
    gateway: tuple[str, int] | None,
    seen_at: Mapping[Path, Path] | None,
) -> tuple[tuple[str, ...] | None, bool, bool]:
    """The ``unshare`` prefix (None where namespaces are not possible or not wanted) and
    whether the network and the filesystem are isolated; RuntimeError where an isolation
    asked for (or ``seen_at``, which needs the filesystem's) is not possible."""
    wants_namespaces = network != "open" or filesystem != "open"
    prefix = isolation_prefix() if wants_namespaces else None
    loopback = gateway is None or gateway[0] in ("127.0.0.1", "localhost")
    if network == "isolated" and (prefix is None or not loopback):
        raise RuntimeError(
            "network isolation is not possible here: "
            + (
                "it needs util-linux's unshare with network, PID and mount namespaces (as "
                "root, or with unprivileged user namespaces)"
                if prefix is None
                else f"the gateway at {gateway} is not on this machine's loopback"
            )
        )
    fs_isolated = isolates_filesystem(filesystem)
    if seen_at and not fs_isolated:
        raise RuntimeError(
            f"{argv[0]!r}'s folders can be seen at other paths only with an isolated filesystem"
        )
    net_isolated = network != "open" and prefix is not None and loopback
    if network == "auto" and not net_isolated:
        logger.info("running %s with the network open (no isolation possible here)", argv[0])
    if filesystem == "auto" and not fs_isolated:
        logger.info("running %s with the filesystem open (no isolation possible here)", argv[0])
    return prefix, net_isolated, fs_isolated


@dataclass
class _Launch:
    """The command line to start, and for a confined run the gateway relay's server and the
    pipe the launcher reports on."""

    command: list[str]
    server: asyncio.AbstractServer | None = None
    report_read: int = -1
    report_write: int = -1


async def _launch(
    argv: Sequence[str],
    prefix: tuple[str, ...] | None,
    *,
    net_isolated: bool,
    gateway: tuple[str, int] | None,
    socket_folder: Path,
    folders: list[str],
    seen_at: dict[str, str],
    readable: list[str],
    max_processes: int | None,
) -> _Launch:
    """``argv`` as it is (no ``prefix``: nothing isolated), or behind ``unshare`` and the
    launcher; with an isolated network, the gateway relayed through a Unix socket in
    ``socket_folder``."""
    if prefix is None:
        return _Launch(list(argv))
    unshare = [arg for arg in prefix if net_isolated or arg != "--net"]
    relay: tuple[str, str, int] | None = None
    server = None
    if net_isolated and gateway is not None:
        socket_path = socket_folder / "gateway.sock"
        server = await _forward_to("127.0.0.1", gateway[1], socket_path)
        relay = (str(socket_path), "127.0.0.1", gateway[1])
    report_read, report_write = os.pipe()
    os.set_blocking(report_read, False)
    launcher = _launcher(
        folders,
        seen_at=seen_at,
        readable=readable,
        gateway=relay,
        max_processes=max_processes,
        report_fd=report_write,
    )
    return _Launch([*unshare, *launcher, *argv], server, report_read, report_write)


async def _start(launch: _Launch, cwd: Path, env: dict[str, str]) -> asyncio.subprocess.Process:
    """Start the launch's command in its own process group (the launcher, when confined,
    with the report pipe's write end, which is closed here once it has its copy)."""
    confined = launch.report_write >= 0
    try:
        return await asyncio.create_subprocess_exec(
            *launch.command,
            cwd=str(cwd),
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its own process group: killed as one
            pass_fds=(launch.report_write,) if confined else (),
        )
    except BaseException:
        if launch.server is not None:
            launch.server.close()
        if confined:
            os.close(launch.report_read)
        raise
    finally:
        if confined:
            os.close(launch.report_write)  # the launcher's copy is the only writer


async def _ended(
    process: asyncio.subprocess.Process, timeout_s: float, stop: asyncio.Event | None
) -> Literal["exited", "timed out", "stopped"]:
    """Wait for the process to exit, ``timeout_s`` to pass or ``stop`` to be set: which came
    first."""
    exit_task = asyncio.ensure_future(_exit_of(process))
    waits: set[asyncio.Future[Any]] = {exit_task}
    stop_task = asyncio.ensure_future(stop.wait()) if stop is not None else None
    if stop_task is not None:
        waits.add(stop_task)
    try:
        done, _ = await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()
    if exit_task in done:
        return "exited"
    return "stopped" if stop_task is not None and stop_task in done else "timed out"


async def _end_process(
    process: asyncio.subprocess.Process, *, isolated: bool, readers: asyncio.Future[Any]
) -> int:
    """Kill what the run started and stop reading its output; returns the processes of its
    group still alive before the kill (0 when isolated: the launcher counts those)."""
    # Whatever ended the wait (exit, timeout, the rollout cancelled): nothing it started
    # outlives it. Isolated, the launcher counts and passes the SIGTERM on to the whole
    # namespace; else what is left of the group is counted here.
    killed_in_group = 0
    pidfd = -1
    for launcher_pid in _children(process.pid) if isolated else []:
        with contextlib.suppress(OSError):
            pidfd = os.pidfd_open(launcher_pid)
    if not isolated:
        killed_in_group = _alive_in_group(process.pid)
    _kill_group(process.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(_exit_of(process), KILL_GRACE_S)
    except TimeoutError:
        _kill_group(process.pid, signal.SIGKILL)
        await _exit_of(process)
    _kill_group(process.pid, signal.SIGKILL)  # stragglers of the group
    if pidfd >= 0:
        # Killed with unshare, the namespace's first process dies a moment later, and
        # the kernel kills the rest before it has exited: wait for that.
        try:
            await asyncio.wait_for(_exited(pidfd), KILL_GRACE_S)
        except TimeoutError:
            logger.warning("a sandboxed run's namespace outlived its kill by %.0f s", KILL_GRACE_S)
        os.close(pidfd)
    try:
        await asyncio.wait_for(readers, KILL_GRACE_S)
    except TimeoutError:
        # A process outside the group still holds the pipes: stop reading them.
        readers.cancel()
    return killed_in_group


def _exit_code(returncode: int | None, report: dict[str, Any]) -> int | None:
    """The command's exit code: the launcher's report of it when confined (a signal as
    its negative number), else the process's own."""
    if "signal" in report:
        return -int(report["signal"])
    if "exit" in report:
        return int(report["exit"])
    return returncode
