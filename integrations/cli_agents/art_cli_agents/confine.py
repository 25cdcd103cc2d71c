"""The first process of a sandboxed run, inside its namespaces: it confines them, runs the
command, and counts what the command left behind.

The sandbox starts ``python -I .../art_cli_agents/confine.py [OPTIONS] -- COMMAND...`` as the
first process (PID 1) of new PID and mount namespaces, and usually a new network namespace
(``unshare [--net] --pid --mount-proc --fork --kill-child``). In order, while it still has
every privilege of those namespaces, it:

1. bounds the processes of the run (``--max-processes N``): where the kernel keeps a
   ``pid_max`` per PID namespace (Linux 6.14+), it sets this namespace's to ``N + 301``, so
   a fork fails once between N and N + 300 processes and threads are alive (once pids wrap
   around, the kernel skips the first 300 numbers: N are always left);
2. brings the network namespace's loopback up and listens on the gateway's address
   (``--gateway SOCKET HOST PORT``, see ``bridge``);
3. makes every mount read-only but the run's own folders (``--writable DIR``, repeated: its
   working folder, ``HOME`` and ``TMPDIR``, each bound at its own path, read-write, nosuid,
   nodev; or ``--writable-at DIR SEEN``: bound at the path ``SEEN`` in the run's own
   ``/tmp`` instead, the same for every run, and the command starts at its working
   folder's place there, with ``PWD`` saying so if it is set); ``/tmp`` and ``/dev/shm`` are
   fresh tmpfs of the run's own (bounded; gone with it), and the namespace's own ``/proc``
   stays writable but for what reaches the whole machine (``PROC_READ_ONLY``); device files
   (``/dev/null``, ``/dev/tty``, ptys) work on a read-only mount, and so does connecting to
   the gateway's socket (kept at its path);
4. takes away the privileges that could undo that: the capability bounding set keeps only
   what a Docker container gets by default, less ``CAP_MKNOD`` (no ``CAP_SYS_ADMIN``, so no
   mount, remount, ``setns`` or ``pid_max``), and ``no_new_privs`` stops setuid programs
   from getting them back;
5. forks the gateway's forwarder (confined as well), then the command, in a process group of
   its own, and reaps every orphan until the command ends. When it ends, or a SIGTERM comes
   (the sandbox's timeout), it counts the processes still alive in the namespace (the
   forwarder aside) and reports on ``--report-fd``; a SIGTERM is passed on to all of them.
   When this process exits, the kernel kills whatever is left in the namespace.

The report is JSON lines on the descriptor the sandbox passes: ``{"process_limit": N}``
(only when applied), ``{"alive": N}``, then ``{"exit": CODE}`` or ``{"signal": SIG}``; or
``{"error": TEXT}`` when setup failed (exit status 125, the command never ran). It runs as
a file, with ``python -I``: the run's working folder (the agent's, when the check runs) must
not be able to shadow a module it imports, and its package's ``__init__`` (art-core, half a
second) is not needed here.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import re
import signal
import stat
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import NoReturn

SETUP_FAILED = 125  # as `env` and container runtimes say "could not start"
# Numbers the kernel reserves at the start of a PID namespace once its pids wrap around.
RESERVED_PIDS = 300
# The first kernel whose pid_max belongs to the PID namespace (a write changes only its own;
# before, the one pid_max of the whole machine).
PID_MAX_PER_NAMESPACE = (6, 14)
SHM_OPTIONS = "size=64m,mode=1777"
# Entries of the host's /tmp a run does not see: runs' scratch folders (another run's files
# would be one read away: a group's runs must not see each other's work) and the fixed path.
HIDDEN_TMP_PREFIXES = ("art-cli-", "art-run")
TMP_OPTIONS = "size=1g,mode=1777"
# What stays read-only of the PID namespace's own /proc, which is otherwise left writable (an
# agent's own sandbox, Codex's bubblewrap, writes /proc/self/uid_map): what reaches the whole
# machine, as in a Docker container (kernel settings, SysRq, interrupts, buses, filesystems).
PROC_READ_ONLY = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs",
                  "/proc/acpi", "/proc/scsi")  # fmt: skip

# mount(2) flags and mount_setattr(2) attributes (linux/mount.h).
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x20, 0x1000, 0x4000, 0x40000
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 0x400, 0x800, 0x200000
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
# mount_setattr's number where every architecture shares the generic table (alpha, ia64
# and mips differ: there the per-mount remount below is used).
SYS_MOUNT_SETATTR = {"x86_64": 442, "aarch64": 442, "i686": 442, "armv7l": 442,
                     "riscv64": 442, "ppc64le": 442, "s390x": 442}  # fmt: skip
# Options of /proc/self/mountinfo that a remount must keep (a user namespace may not clear
# them on mounts it inherited).
KEPT_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
              "noatime": MS_NOATIME, "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME}  # fmt: skip

# prctl(2) options.
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4
# Docker's default capabilities, less CAP_MKNOD: CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL,
# SETGID, SETUID, SETPCAP, NET_BIND_SERVICE, NET_RAW, SYS_CHROOT, AUDIT_WRITE, SETFCAP.
KEPT_CAPABILITIES = frozenset({0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 29, 31})

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    _check(
        _libc.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def _mount_setattr(path: str, set_: int, clear: int, flags: int) -> None:
    number = SYS_MOUNT_SETATTR.get(platform.machine())
    if number is None:
        raise OSError(errno.ENOSYS, "mount_setattr")
    attr = _MountAttr(set_, clear, 0, 0)
    _check(
        _libc.syscall(
            ctypes.c_long(number),
            ctypes.c_int(AT_FDCWD),
            path.encode(),
            ctypes.c_uint(flags),
            ctypes.byref(attr),
            ctypes.c_size_t(ctypes.sizeof(attr)),
        ),
        f"mount_setattr {path}",
    )


def _mounts() -> list[tuple[str, set[str]]]:
    """Every mount point of this namespace with its per-mount options (``mountinfo``)."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        # Spaces and the like are escaped as \\ooo (octal).
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        found.append((point, set(fields[5].split(","))))
    return found


def _remount(point: str, options: set[str], rdonly: bool, extra: int = 0) -> None:
    flags = MS_REMOUNT | MS_BIND | extra | (MS_RDONLY if rdonly else 0)
    flags |= sum(flag for name, flag in KEPT_FLAGS.items() if name in options)
    _mount(None, point, None, flags)


def _read_only_everywhere() -> None:
    try:
        _mount_setattr("/", MOUNT_ATTR_RDONLY, 0, AT_RECURSIVE)
    except OSError as exc:
        if exc.errno != errno.ENOSYS:
            raise
        # Before Linux 5.12: each mount in turn (one hidden under another is out of reach).
        for point, options in _mounts():
            try:
                _remount(point, options, rdonly=True)
            except FileNotFoundError:
                pass


def _writable(point: str) -> None:
    """The mount at ``point`` read-write, nosuid, nodev (it alone, not those under it)."""
    try:
        _mount_setattr(point, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, MOUNT_ATTR_RDONLY, 0)
    except OSError as exc:
        if exc.errno != errno.ENOSYS:
            raise
        options = dict(_mounts())[point]  # the last mount at a path is the one seen there
        _remount(point, options, rdonly=False, extra=MS_NOSUID | MS_NODEV)


def _check_seen_at(writable: Mapping[str, str], private_tmp: bool) -> None:
    """ValueError unless each folder bound at another path is bound in the run's own
    ``/tmp``, neither inside nor around another folder's mount (a mount point made there
    would be made in a folder of the machine)."""
    if len(set(writable.values())) != len(writable):
        raise ValueError(f"two of the run's folders would be bound at one path: {writable}")
    for folder, seen in writable.items():
        if seen == folder:
            continue
        if not os.path.isabs(seen) or os.path.normpath(seen) != seen:
            raise ValueError(f"{seen!r} is not an absolute, normal path")
        if not private_tmp or os.path.commonpath([seen, "/tmp"]) != "/tmp" or seen == "/tmp":
            raise ValueError(f"{folder} can be bound at {seen} only inside the run's own /tmp")
        for other in writable.values():
            if other != seen and os.path.commonpath([other, seen]) in (other, seen):
                raise ValueError(f"{seen} and {other}, two of the run's folders, are nested")


def seen_path(path: str, writable: Mapping[str, str]) -> str:
    """Where the command sees ``path`` once ``writable`` (folder -> where it is bound) is
    bound: under the innermost folder holding it, at that folder's place; else unchanged.

    Example:
        >>> seen_path("/tmp/x/work/src", {"/tmp/x/work": "/tmp/art-run/work"})
        '/tmp/art-run/work/src'
    """
    holders = [f for f in writable if os.path.commonpath([f, path]) == f]
    if not holders:
        return path
    folder = max(holders, key=len)
    return os.path.normpath(os.path.join(writable[folder], os.path.relpath(path, folder)))


def _show_host_tmp(fd: int, entries: Sequence[str]) -> None:
    """Bind each of ``entries`` of the host's ``/tmp`` (held open as ``fd``) at its place in
    the private one, read-only as its source now is; a link is copied as a link. An entry
    gone meanwhile, or one that cannot be bound, is left out."""
    for name in entries:
        source, target = f"/proc/self/fd/{fd}/{name}", f"/tmp/{name}"
        try:
            mode = os.lstat(source).st_mode
            if stat.S_ISLNK(mode):
                os.symlink(os.readlink(source), target)
                continue
            if stat.S_ISDIR(mode):
                os.mkdir(target)
            else:
                os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o600))
            _mount(source, target, None, MS_BIND | MS_REC)
        except OSError:
            continue


def confine_filesystem(
    writable: Mapping[str, str],
    *,
    own_proc: bool,
    private_tmp: bool,
    kept: Sequence[str] = (),
    readable: Sequence[str] = (),
) -> None:
    """Make every mount of this (new, private) mount namespace read-only except the folders
    of ``writable`` (absolute, without links; read-write, nosuid, nodev), each bound at the
    path it maps to (its own, or one in the private ``/tmp``), and give ``/dev/shm`` a
    private tmpfs. ``own_proc``: ``/proc`` is this PID namespace's own, and stays writable
    but for ``PROC_READ_ONLY``. ``private_tmp``: ``/tmp`` is a private tmpfs too, where the
    folders of ``writable`` under it are bound, and the files ``kept`` (the gateway's
    socket) too, at their own paths, read-only. ``readable``: folders or files the command
    reads besides its own (a task's check files) that the private ``/tmp`` would hide: bound
    at their own paths, read-only."""
    _check_seen_at(writable, private_tmp)
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here reaches the host
    # The host's /tmp, to show again (read-only) under the private one: programs, virtual
    # environments and checkouts live there too (a CI clone in /tmp: the agent's own binary).
    host_tmp, host_entries = -1, []
    if private_tmp and os.path.isdir("/tmp"):
        host_tmp = os.open("/tmp", os.O_PATH | os.O_DIRECTORY)
        host_entries = [e for e in os.listdir("/tmp") if not e.startswith(HIDDEN_TMP_PREFIXES)]
    # The folders and files, held open: a tmpfs over /tmp would hide them. Outer mount points
    # first: an inner one is bound inside the outer one's mount.
    order = sorted(writable, key=lambda folder: writable[folder])
    held = {folder: os.open(folder, os.O_PATH | os.O_DIRECTORY) for folder in order}
    held_files = {path: os.open(path, os.O_PATH) for path in [*kept, *readable]}
    if own_proc:
        for path in PROC_READ_ONLY:  # mounts of their own, to stay read-only under /proc
            if os.path.exists(path):
                _mount(path, path, None, MS_BIND | MS_REC)
    _read_only_everywhere()
    if own_proc:
        _writable("/proc")
    # POSIX shared memory and semaphores (Python's multiprocessing, Chromium) need /dev/shm;
    # agents write /tmp whatever TMPDIR says (Codex's own sandbox makes /tmp/.git). Fresh
    # ones: the host's are not shared, and these go with the namespace.
    if os.path.isdir("/dev/shm"):
        _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, SHM_OPTIONS)
    if private_tmp and os.path.isdir("/tmp"):
        _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, TMP_OPTIONS)
        _show_host_tmp(host_tmp, host_entries)
        os.close(host_tmp)
    for folder, fd in held.items():
        point = writable[folder]
        os.makedirs(point, exist_ok=True)  # its mount point, in the new /tmp
        _mount(f"/proc/self/fd/{fd}", point, None, MS_BIND | MS_REC)
        _writable(point)
        os.close(fd)
    for path, fd in held_files.items():
        if not os.path.exists(path):  # hidden by the new /tmp: a mount point, then the path
            if os.path.isdir(f"/proc/self/fd/{fd}"):
                os.makedirs(path, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
            # Read-only, as its source (made so above), with whatever is mounted under it.
            _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        os.close(fd)


def drop_privileges() -> None:
    """Keep only ``KEPT_CAPABILITIES`` in the bounding set (what the command can ever have,
    even as root), clear the ambient set, and set ``no_new_privs``."""
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for cap in range(last + 1):
        if cap not in KEPT_CAPABILITIES:
            _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap}")
    # Older kernels have no ambient set: nothing to clear.
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def pid_max_is_per_namespace() -> bool:
    """Whether this kernel keeps ``pid_max`` per PID namespace (a write anywhere else would
    change the whole machine's)."""
    match = re.match(r"(\d+)\.(\d+)", platform.release())
    return match is not None and (int(match[1]), int(match[2])) >= PID_MAX_PER_NAMESPACE


def bound_processes(limit: int) -> int | None:
    """Bound this PID namespace's processes and threads (see the module); the pid_max set, or
    None where the kernel cannot do it for this namespace alone."""
    if os.getpid() != 1 or not pid_max_is_per_namespace():
        return None
    pid_max = limit + RESERVED_PIDS + 1
    Path("/proc/sys/kernel/pid_max").write_text(str(pid_max))
    return pid_max


def alive(exclude: set[int]) -> int:
    """How many processes of this PID namespace (its own ``/proc``) are alive, but
    ``exclude``; zombies are dead."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in exclude:
            continue
        try:
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        count += state not in ("Z", "X")
    return count


class _Reporter:
    def __init__(self, fd: int | None) -> None:
        self.fd = fd

    def __call__(self, **fields: object) -> None:
        if self.fd is not None:
            try:  # one short write: atomic on a pipe
                os.write(self.fd, (json.dumps(fields) + "\n").encode())
            except OSError:
                pass


def _parse(args: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    if "--" not in args:
        raise SystemExit(
            "usage: python -I confine.py [--report-fd FD] [--writable DIR]... "
            "[--writable-at DIR SEEN]... [--readable PATH]... [--gateway SOCKET HOST PORT] "
            "[--max-processes N] "
            "-- COMMAND..."
        )
    split = args.index("--")
    options, command = args[:split], args[split + 1 :]
    arity = {"--report-fd": 1, "--writable": 1, "--writable-at": 2, "--readable": 1,
             "--gateway": 3, "--max-processes": 1}  # fmt: skip
    repeated = ("--writable", "--writable-at", "--readable")
    parsed: dict[str, list[str]] = {}
    i = 0
    while i < len(options):
        name = options[i]
        if name not in arity or i + arity[name] >= len(options):
            raise SystemExit(f"confine: bad option {name!r}")
        # --writable(-at) and --readable may repeat: its values accumulate; the others' last one counts.
        values = options[i + 1 : i + 1 + arity[name]]
        parsed[name] = parsed.get(name, []) + values if name in repeated else values
        i += 1 + arity[name]
    if not command:
        raise SystemExit("confine: no command")
    return parsed, command


def main(argv: list[str] | None = None) -> None:
    """Confine this namespace, run the command, report (see the module)."""
    options, command = _parse(sys.argv[1:] if argv is None else argv)
    report_fd = int(options["--report-fd"][0]) if "--report-fd" in options else None
    report = _Reporter(report_fd)
    own_fds = () if report_fd is None else (report_fd,)
    forwarder = 0
    try:
        if os.getpid() != 1:
            raise RuntimeError("not the first process of a new PID namespace")
        if "--max-processes" in options:
            pid_max = bound_processes(int(options["--max-processes"][0]))
            if pid_max is not None:
                report(process_limit=pid_max - 1)
        listener = None
        if "--gateway" in options:
            from art_cli_agents import bridge  # asyncio: only when there is a gateway

            unix_path, host, port = options["--gateway"]
            unix_path = os.path.realpath(unix_path)
            bridge.loopback_up()
            listener = bridge.listen(host, int(port))
        if "--writable" in options or "--writable-at" in options:
            _confine_to_writable(options, kept=[unix_path] if listener is not None else [])
        drop_privileges()
        if listener is not None:
            forwarder = bridge.start_forwarder(listener, unix_path, close_fds=own_fds)
    except (OSError, RuntimeError, ValueError) as exc:
        report(error=str(exc))
        print(f"art_cli_agents sandbox: could not confine the run: {exc}", file=sys.stderr)
        os._exit(SETUP_FAILED)

    ended = False

    def end(sig: int, frame: FrameType | None) -> None:
        # The sandbox's SIGTERM (its timeout, or the rollout cancelled): count, then pass it
        # on to every process of the namespace (kill(-1) from its first process spares only
        # itself), the command's detached descendants included.
        nonlocal ended
        if not ended:
            ended = True
            report(alive=alive({1, forwarder}))
        try:
            os.kill(-1, sig)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, end)
    child = os.fork()
    if child == 0:
        _exec_command(command, own_fds)
    while True:
        # PID 1 inherits every orphan of the namespace: reap them until the command ends.
        pid, status = os.waitpid(-1, 0)
        if pid == child:
            break
    if not ended:
        ended = True
        report(alive=alive({1, forwarder}))
    # Exiting, as PID 1: the kernel kills whatever else is still in the namespace.
    os._exit(_reported_exit(status, report))


def _confine_to_writable(options: Mapping[str, Sequence[str]], *, kept: list[str]) -> None:
    """Leave only the ``--writable`` (and ``--writable-at``) folders writable, then return
    to the working folder on its writable mount."""
    writable = {os.path.realpath(f): os.path.realpath(f) for f in options.get("--writable", [])}
    pairs = options.get("--writable-at", [])
    for folder, seen in zip(pairs[::2], pairs[1::2], strict=True):
        writable[os.path.realpath(folder)] = seen
    here = os.getcwd()  # its path: once a tmpfs covers /tmp, it may be unreachable
    confine_filesystem(
        writable,
        # unshare --mount-proc mounted /proc for this PID namespace (its first
        # process); a /tmp of its own unless /tmp is one of the run's folders.
        own_proc=True,
        private_tmp=not any(os.path.commonpath([f, "/tmp"]) == f for f in writable),
        kept=kept,
        readable=[os.path.realpath(path) for path in options.get("--readable", [])],
    )
    # The working folder was looked up on the mount now read-only (or hidden); by its
    # path again, it is found on the writable one bound over it (at its own path, or
    # where its folder is seen).
    seen = seen_path(here, writable)
    os.chdir(seen)
    if seen != here and "PWD" in os.environ:
        os.environ["PWD"] = seen


def _exec_command(command: list[str], own_fds: tuple[int, ...]) -> NoReturn:
    """In the forked child: become the command (exit 127 when it cannot start)."""
    try:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        # Its own process group: the sandbox's signal to the launcher's group reaches it
        # once, passed on from here, not twice.
        os.setpgid(0, 0)
        for fd in own_fds:
            os.close(fd)
        # A preload meant for the command (art_cli_agents.clock's libfaketime) reaches it
        # alone: this launcher ran without it.
        preload = os.environ.pop("ART_SANDBOX_LD_PRELOAD", None)
        if preload:
            os.environ["LD_PRELOAD"] = preload
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"art_cli_agents sandbox: cannot run {command[0]!r}: {exc}", file=sys.stderr)
    os._exit(127)


def _reported_exit(status: int, report: _Reporter) -> int:
    """Report how the command ended (its signal, or its exit code); the launcher's own exit
    code for it (128 + the signal when killed, as a shell says)."""
    if os.WIFSIGNALED(status):
        report(signal=os.WTERMSIG(status))
        return 128 + os.WTERMSIG(status)
    code = os.waitstatus_to_exitcode(status)
    report(exit=code)
    return code


if __name__ == "__main__":
    if "art_cli_agents" not in sys.modules:
        # Run as a file: this folder as the package, without its __init__ (see the module).
        import types

        package = types.ModuleType("art_cli_agents")
        package.__path__ = [str(Path(__file__).resolve().parent)]
        sys.modules["art_cli_agents"] = package
    main()
