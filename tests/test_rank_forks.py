"""The rank launcher (``art_core.training.distributed.rank_forks``): one warmed-up process
that forks each rank of a local world, and reports each rank's start and end.

The worlds themselves (ranks that train, one killed mid-step, a world formed again from the
same launcher) are ``tests/test_training_distributed.py``'s; here the launcher's own promises:
a rank runs the rank loop on the pipes it is given, with its own environment and log, a rank
that ends or is killed is reported with how it ended, and a launcher that is gone ends every
wait on it.
"""

from __future__ import annotations

import os
import signal
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

from art_core.training.distributed.messages import dumps, loads
from art_core.training.distributed.rank_forks import RankForks


def fork_rank(forks: RankForks, log: Path, env: dict[str, str]) -> tuple:
    request_read, request_write = os.pipe()
    reply_read, reply_write = os.pipe()
    try:
        rank = forks.fork(env, log, request_read, reply_write)
    finally:
        os.close(request_read)
        os.close(reply_write)
    return rank, Connection(request_write, readable=False), Connection(reply_read, writable=False)


def test_ranks_run_the_rank_loop_and_their_ends_are_reported(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    forks = RankForks(env, tmp_path / "train-ranks.log")
    try:
        assert forks.alive()
        # A rank asked to close answers on its pipe and exits 0.
        first, requests, replies = fork_rank(forks, tmp_path / "rank0.log", {**env, "RANK": "0"})
        assert first.pid != os.getpid() and first.poll() is None
        requests.send_bytes(dumps({"op": "close", "payload": {}}))
        assert loads(replies.recv_bytes()) == {"kind": "result", "result": {}}
        assert first.wait(60) == 0
        # An op it cannot run is answered with the error, which goes to its own log too.
        second, requests, replies = fork_rank(forks, tmp_path / "rank1.log", {**env, "RANK": "1"})
        requests.send_bytes(dumps({"op": "train", "payload": {}}))
        answer = loads(replies.recv_bytes())
        assert answer["kind"] == "error" and "before start" in answer["message"], answer
        assert "before start" in (tmp_path / "rank1.log").read_text()
        # Killed: reported as subprocess says it, and its pipe closes.
        os.kill(second.pid, signal.SIGKILL)
        assert second.wait(60) == -signal.SIGKILL
        with pytest.raises(EOFError):
            replies.recv_bytes()
        # The launcher is still there for the next world.
        third, requests, _ = fork_rank(forks, tmp_path / "rank2.log", env)
        third.kill()
        assert third.wait(60) == -signal.SIGKILL
    finally:
        forks.close()
    assert not forks.alive() and forks.process.returncode == 0


def test_a_rank_outlives_nothing_when_its_coordinator_goes(tmp_path: Path) -> None:
    """Closing the coordinator's pipe ends the rank's loop (as the coordinator dying does),
    and a launcher closed while a rank runs does not leave its waiters hanging."""
    forks = RankForks(dict(os.environ), tmp_path / "train-ranks.log")
    try:
        rank, requests, _ = fork_rank(forks, tmp_path / "rank0.log", dict(os.environ))
        requests.close()  # the coordinator is gone
        assert rank.wait(60) == 0
        running, _, _ = fork_rank(forks, tmp_path / "rank1.log", dict(os.environ))
    finally:
        forks.close()
    assert running.wait(60) in (0, -signal.SIGKILL)  # ended with its pipes, or given up on
    with pytest.raises(RuntimeError, match="has ended"):
        forks.fork(dict(os.environ), tmp_path / "late.log", 0, 1)
