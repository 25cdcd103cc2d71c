"""Rank processes on this machine: one process per rank, kept across steps.

Each rank is forked from a launcher of the world's own (``rank_forks``: one fresh interpreter
that has imported what a rank runs; not a fork of the backend, and not a ``multiprocessing``
spawn that would re-run the user's script), ended with the world: a world that failed leaves
no process behind, whether or not the trainer forms another. A rank joins the process group through a ``FileStore`` in a private
temporary folder (no port to pick, nothing to collide with), and talks to the coordinator over
two pipes it is given, one JSON message per frame (``multiprocessing.connection`` framing, raw
bytes, never pickle). Its stdout and stderr go to ``logs/train-rank{r}.log`` in the model
folder, the launcher's to ``logs/train-ranks.log``.

A rank that dies closes its pipe: the reader thread reports it at once, so a dead rank is
seen in well under a second, whatever the survivors are blocked on.
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from art_core.training.distributed.messages import dumps, loads
from art_core.training.distributed.rank_forks import ForkedRank, RankForks
from art_core.training.distributed.world import TrainingWorld

# Seconds a rank gets to leave the process group and exit after "close" before it is killed.
CLOSE_GRACE_S = 30.0


def describe_exit(returncode: int | None) -> str:
    """How a process ended, in words.

    Example:
        >>> describe_exit(-9), describe_exit(1), describe_exit(None)
        ('was killed by signal SIGKILL', 'exited with code 1', 'is still running')
    """
    if returncode is None:
        return "is still running"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = str(-returncode)
        return f"was killed by signal {name}"
    return f"exited with code {returncode}"


class LocalRankGroup:
    """The rank processes of one world on this machine (``TrainingWorld(launcher="local")``).

    ``launch`` starts them, ``send`` gives one an op, and everything they answer arrives on
    ``events`` as ``(rank, message)``, with ``message`` None once a rank is gone.
    """

    def __init__(self, world: TrainingWorld, log_dir: Path) -> None:
        self.world = world
        self.log_dir = Path(log_dir)
        self.size = world.ranks
        self.events: queue.Queue[tuple[int, dict[str, Any] | None]] = queue.Queue()
        self._forks: RankForks | None = None
        self._processes: list[ForkedRank] = []
        self._requests: list[Connection] = []
        self._readers: list[threading.Thread] = []
        self._store_dir: Path | None = None

    def rank_devices(self) -> list[str]:
        return self.world.rank_devices()

    def launch(self) -> str:
        """Start the rank processes; return the ``init_method`` of their process group."""
        devices = self.rank_devices()
        if self.world.device_type() == "cuda":
            import torch

            available = torch.cuda.device_count() if torch.cuda.is_available() else 0
            missing = [d for d in devices if (torch.device(d).index or 0) >= available]
            if missing:
                raise ValueError(
                    f"the training world asks for {', '.join(missing)}, but this machine has "
                    f"{available} CUDA device(s)"
                )
        self.events = queue.Queue()
        self._store_dir = Path(tempfile.mkdtemp(prefix="art-train-world-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        # The ranks import art_core from where this process did (a checkout or a venv).
        package_root = str(Path(__file__).resolve().parents[3])
        env["PYTHONPATH"] = os.pathsep.join([package_root, *filter(None, [env.get("PYTHONPATH")])])
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        # Read by OpenMP and MKL as torch loads them: the launcher's, for every rank.
        threads = str(self.world.threads())
        env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
        if self._forks is not None:  # a launch after a failed one that stopped nothing
            self._forks.close()
        self._forks = RankForks(env, self.log_dir / "train-ranks.log")
        for rank in range(self.size):
            request_read, request_write = os.pipe()
            reply_read, reply_write = os.pipe()
            rank_env = {
                **env,
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(self.size),
            }
            log = self.log_dir / f"train-rank{rank}.log"
            try:
                process = self._forks.fork(rank_env, log, request_read, reply_write)
            finally:
                os.close(request_read)
                os.close(reply_write)
            self._processes.append(process)
            self._requests.append(Connection(request_write, readable=False))
            reader = threading.Thread(
                target=self._read,
                args=(rank, Connection(reply_read, writable=False)),
                name=f"art-train-rank{rank}-reader",
                daemon=True,
            )
            reader.start()
            self._readers.append(reader)
        return f"file://{self._store_dir / 'store'}"

    def _read(self, rank: int, connection: Connection) -> None:
        try:
            while True:
                self.events.put((rank, loads(connection.recv_bytes())))
        except (EOFError, OSError, ValueError):
            pass
        finally:
            connection.close()
            self.events.put((rank, None))

    def send(self, rank: int, op: str, payload: dict[str, Any]) -> None:
        """Give rank ``rank`` an op; a rank that is gone shows up on ``events`` as None."""
        try:
            self._requests[rank].send_bytes(dumps({"op": op, "payload": payload}))
        except (OSError, ValueError):
            self.events.put((rank, None))

    def describe(self, rank: int) -> str:
        """Which process rank ``rank`` is and how it ended."""
        process = self._processes[rank]
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        log = self.log_dir / f"train-rank{rank}.log"
        return f"rank {rank} (pid {process.pid}) {describe_exit(process.poll())}; its log: {log}"

    def alive(self) -> bool:
        """Whether every rank process is still running."""
        return bool(self._processes) and all(p.poll() is None for p in self._processes)

    def stop(self, *, failed: bool) -> None:
        """End the rank processes, asked to close (``failed=False``) or killed outright, and
        their launcher."""
        if not failed:
            for rank in range(len(self._processes)):
                self.send(rank, "close", {})
        for process in self._processes:
            if not failed:
                try:
                    process.wait(timeout=CLOSE_GRACE_S)
                except subprocess.TimeoutExpired:
                    pass
            if process.poll() is None:
                process.kill()
            process.wait()
        for connection in self._requests:
            connection.close()
        for reader in self._readers:
            reader.join(timeout=CLOSE_GRACE_S)
        self._processes, self._requests, self._readers = [], [], []
        if self._forks is not None:
            self._forks.close()
            self._forks = None
        if self._store_dir is not None:
            shutil.rmtree(self._store_dir, ignore_errors=True)
            self._store_dir = None
