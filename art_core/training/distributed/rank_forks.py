"""Rank processes forked from one warmed-up process, instead of one fresh interpreter each.

A rank spends most of its start importing torch, transformers and peft (about 3 s of CPU
each, against a fraction of a second to load a small model). ``RankForks`` starts one
process (``python -m art_core.training.distributed.rank_forks FD``) that imports what a rank
runs and starts no thread, then forks a rank per request: the N ranks of a world cost one
start. Each rank is still a process of its
own that shares nothing with the others or with the backend; it runs ``rank.serve`` on the two
pipes the coordinator made for it.

The launcher and the coordinator talk over a ``SOCK_SEQPACKET`` pair (one message per
packet, JSON): a request carries the rank's environment and log file, and its two pipe ends
as file descriptors (``SCM_RIGHTS``); the launcher answers ``{"started": ID, "pid": PID}``,
and ``{"exited": PID, "returncode": N}`` when a rank ends (negative: killed by that signal,
as ``subprocess`` says it), for every rank it forked. Closing the pair ends the launcher
(its ranks see their pipes close and end too).

The environment the libraries read when they load (OpenMP's and MKL's thread counts and
wait policy) is the launcher's, given at its start: the ranks of one world share it. What
differs per rank (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``) is read later, when the rank
joins its process group. No CUDA context exists before the fork: the launcher never
touches a device.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import socket
import subprocess
import sys
import threading
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from art_core.memory import freeze_heap
from art_core.training.distributed.rank import serve

# What a rank imports when it loads its model (``training.loading`` imports them there, not
# at its top): the launcher imports them once, before it forks.
PREIMPORT = ("transformers.modeling_utils", "peft")
# Seconds the launcher gets to import and say it is ready; and a fork to be answered.
READY_TIMEOUT_S = 300.0
FORK_TIMEOUT_S = 60.0
# How often the launcher looks for ranks that ended while no request comes in.
_REAP_EVERY_S = 0.05
# How long ``poll`` waits for the launcher's report of a rank it sees has ended.
_REPORT_WAIT_S = 10.0
# The largest message either side sends (a rank's environment is the bulk of it).
_MAX_MESSAGE = 1 << 20


class ForkedRank:
    """One rank forked by the launcher, as much of ``subprocess.Popen`` as the coordinator
    uses: ``pid``, ``poll()``, ``wait(timeout)``, ``kill()``.

    Example:
        >>> rank = ForkedRank(os.getpid())  # a process that is running
        >>> rank.poll() is None
        True
        >>> rank._end(-9); rank.wait(0)
        -9
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._ended = threading.Event()

    def _end(self, returncode: int) -> None:
        if self.returncode is None:
            self.returncode = returncode
        self._ended.set()

    def poll(self) -> int | None:
        """The rank's exit status, None while it runs. A rank that has ended (gone, or a
        zombie its launcher has yet to reap) is waited for until the launcher reports it, so
        that a caller who saw it die (a killed rank) never reads it as running."""
        if self.returncode is None and not _running(self.pid):
            self._ended.wait(_REPORT_WAIT_S)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"rank process {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, 9)
            except ProcessLookupError:
                pass  # ended already; its exit is on the way


def _running(pid: int) -> bool:
    """Whether process ``pid`` runs (not gone, not a zombie), from ``/proc`` where there is
    one, else from whether it can be signalled (a zombie then counts as running).

    Example:
        >>> _running(os.getpid())
        True
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            # "PID (COMM) STATE ...": COMM may hold spaces and parentheses, STATE follows the last ")".
            return stat.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except FileNotFoundError:
        return False
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RankForks:
    """The coordinator's side of the launcher: ``start`` it with the ranks' shared
    environment, ``fork`` a rank, ``close`` it. Thread-safe.

    Example:
        >>> forks = RankForks(env=dict(os.environ), log=Path("logs/train-ranks.log"))  # too slow for a docstring: a process that imports torch  # doctest: +SKIP
        >>> rank = forks.fork({"RANK": "0"}, Path("logs/train-rank0.log"), request_read, reply_write)  # too slow for a docstring: forks a rank  # doctest: +SKIP
    """

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = log
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with open(log, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", __name__, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        theirs.close()
        self._socket = ours
        self._lock = threading.Lock()
        self._ids = 0
        self._starting: dict[int, ForkedRank | None] = {}
        self._started = threading.Condition(self._lock)
        self._ranks: dict[int, ForkedRank] = {}  # by pid, until they end
        self._ready = threading.Event()
        self._gone = False
        self._reader = threading.Thread(target=self._read, name="art-rank-forks", daemon=True)
        self._reader.start()
        if not self._ready.wait(READY_TIMEOUT_S) or self._gone:
            self.close()
            raise RuntimeError(f"the rank launcher did not start; its log: {log}{self._tail()}")

    def _tail(self) -> str:
        try:
            text = self.log.read_text(errors="replace")[-2000:].strip()
        except OSError:
            return ""
        return f"\n{text}" if text else ""

    def _read(self) -> None:
        try:
            while True:
                data = self._socket.recv(_MAX_MESSAGE)
                if not data:
                    break
                message = json.loads(data)
                with self._lock:
                    if "ready" in message:
                        self._ready.set()
                    elif "started" in message:
                        rank = ForkedRank(int(message["pid"]))
                        self._ranks[rank.pid] = rank
                        self._starting[int(message["started"])] = rank
                        self._started.notify_all()
                    elif "exited" in message:
                        ended = self._ranks.pop(int(message["exited"]), None)
                        if ended is not None:
                            ended._end(int(message["returncode"]))
        except (OSError, ValueError):
            pass
        finally:
            # The launcher is gone: nothing waits for it, nor for a rank it cannot report.
            with self._lock:
                self._gone = True
                for rank in self._ranks.values():
                    rank._end(-9)
                self._ranks.clear()
                self._started.notify_all()
            self._ready.set()

    def alive(self) -> bool:
        """Whether the launcher can still fork."""
        return not self._gone and self.process.poll() is None

    def fork(self, env: dict[str, str], log: Path, *fds: int) -> ForkedRank:
        """A rank with ``env`` as its whole environment, its output appended to ``log``,
        running ``rank.serve`` on ``fds`` (its request pipe's read end and its reply
        pipe's write end, which the caller still closes on its side)."""
        with self._lock:
            if self._gone:
                raise RuntimeError(f"the rank launcher has ended; its log: {self.log}")
            self._ids += 1
            request_id = self._ids
            self._starting[request_id] = None
            body = json.dumps({"id": request_id, "env": env, "log": str(log)}).encode()
            socket.send_fds(self._socket, [body], list(fds))
            started = self._started.wait_for(
                lambda: self._starting.get(request_id) is not None or self._gone,
                FORK_TIMEOUT_S,
            )
            rank = self._starting.pop(request_id, None)
        if not started or rank is None:
            raise RuntimeError(f"the rank launcher did not fork a rank; its log: {self.log}")
        return rank

    def close(self) -> None:
        """End the launcher (the ranks it forked end as their pipes close)."""
        try:
            self._socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._socket.close()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._reader.join(30)


# ------------------------------------------------------------------------------ launcher
def _launch(connection: socket.socket) -> None:
    """The launcher's loop: fork a rank per request, report each start and end. One thread
    and no signal handler: requests and ended ranks are polled in turn."""
    for name in PREIMPORT:
        importlib.import_module(name)
    # What the imports made, out of the collector before the forks: each rank's first full
    # collection (its trainer freezes its heap once the model is loaded) would walk all of
    # it, ~0.3 s a rank, and write to every object's header, copying the pages it shares
    # with this process (Python's gc docs: freeze before fork).
    freeze_heap()
    if threading.active_count() != 1:
        print(f"not forking: {threading.active_count()} threads after the imports", flush=True)
        return
    connection.send(json.dumps({"ready": True}).encode())
    ranks = 0
    open_ = True
    while open_ or ranks:
        # Once the coordinator is gone only the ranks are waited for (a closed socket would
        # be readable at once, forever).
        watched = [connection] if open_ else []
        readable = select.select(watched, [], [], _REAP_EVERY_S if ranks else None)[0]
        while ranks:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            ranks -= 1
            code = os.waitstatus_to_exitcode(status)
            if open_:
                try:
                    connection.send(json.dumps({"exited": pid, "returncode": code}).encode())
                except OSError:
                    open_ = False
        if not readable or not open_:
            continue
        try:
            body, fds, _, _ = socket.recv_fds(connection, _MAX_MESSAGE, 2)
        except OSError:
            body, fds = b"", []
        if not body:
            open_ = False
            continue
        request = json.loads(body)
        pid = os.fork()
        if pid == 0:
            connection.close()
            _rank(request, fds)  # never returns
        for fd in fds:
            os.close(fd)
        ranks += 1
        connection.send(json.dumps({"started": request["id"], "pid": pid}).encode())


def _rank(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked rank: its environment and output, then ``serve`` until it is done."""
    code = 1
    try:
        os.environ.clear()
        os.environ.update(request["env"])
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        serve(Connection(fds[0], writable=False), Connection(fds[1], readable=False))
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    _launch(socket.socket(fileno=int(sys.argv[1])))
    # Nothing to clean up once its ranks have ended: tearing down the interpreter's torch,
    # transformers and peft modules would take the coordinator's ``close`` a second.
    sys.stdout.flush()
    os._exit(0)
