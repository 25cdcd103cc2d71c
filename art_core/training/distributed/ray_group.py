"""Rank processes as a Ray actor group: placed by Ray (across machines), restarted by Ray.

One placement group holds a bundle per rank (a GPU, or ``threads_per_rank`` CPUs), packed
onto as few machines as fit by default; rank r is an actor in bundle r. Rank 0 picks a
free port on its own node and its address reaches the other ranks through Ray (the
``init_method`` of their process group). Every op is a streaming actor call that yields
the rank's JSON messages (progress, then its result), so the coordinator sees progress
while a step runs and learns at once when an actor dies (Ray raises ``RayActorError``).

After a failed step every actor is killed with ``no_restart=False``: Ray restarts them
(``ray_max_restarts``) and the next step forms a fresh world on them; an actor Ray gave up
on is replaced in its bundle. The model folder must be on a filesystem every node sees (the
ranks load from it, rank 0 writes checkpoints into it, the engine loads adapters from it).
"""

from __future__ import annotations

import os
import queue
import socket
import threading
import time
import traceback
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from art_core.training.distributed.messages import dumps, error_message, loads
from art_core.training.distributed.world import TrainingWorld

# Seconds idle actors get to answer the liveness ping before a step.
ALIVE_TIMEOUT_S = 30.0


class RankActor:
    """The Ray actor of one rank: a ``RankWorker`` on one persistent torch thread."""

    def __init__(self, threads: int) -> None:
        from art_core.training.distributed.rank import RankWorker  # torch: in the actor only

        # Set here, not as the actor's Ray ``runtime_env``: an actor with one of its own is
        # started through Ray's setup_worker.py, a second interpreter importing Ray (~4 s of
        # CPU per actor), and none of the workers Ray prestarted serves it. The rank sets
        # torch's threads itself (``torch.set_num_threads``); these reach what it starts.
        os.environ.update(
            OMP_NUM_THREADS=str(threads),
            MKL_NUM_THREADS=str(threads),
            TOKENIZERS_PARALLELISM="false",
        )
        self._worker = RankWorker()
        # One thread for all torch work: OpenMP keeps a thread team per calling thread.
        self._torch_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="art-rank")

    def ping(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "host": socket.gethostname()}

    def free_address(self) -> tuple[str, int]:
        """This node's address and a free port on it: where rank 0's process group listens."""
        import ray

        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("", 0))
            port = int(probe.getsockname()[1])
        return ray.util.get_node_ip_address(), port

    def handle(self, message: str) -> Iterator[str]:
        """Run one op; yield its progress messages, then its result (or error) message."""
        request = loads(message)
        replies: queue.Queue[bytes | None] = queue.Queue()

        def run() -> None:
            try:
                result = self._worker.handle(
                    str(request.get("op")),
                    request.get("payload") or {},
                    emit=lambda event: replies.put(dumps({"kind": "event", "event": event})),
                )
                replies.put(dumps({"kind": "result", "result": result}))
            except Exception as error:
                traceback.print_exc()  # into the actor's log
                replies.put(dumps(error_message(error)))
            finally:
                replies.put(None)

        self._torch_thread.submit(run)
        while (reply := replies.get()) is not None:
            yield reply.decode("utf-8")


class RayRankGroup:
    """The ranks of a ``TrainingWorld(launcher="ray")`` as Ray actors in a placement group."""

    def __init__(self, world: TrainingWorld) -> None:
        self.world = world
        self.size = world.ranks
        self.events: queue.Queue[tuple[int, dict[str, Any] | None]] = queue.Queue()
        self._placement_group: Any = None
        self._actors: list[Any] = []
        self._info: list[dict[str, Any]] = [{} for _ in range(world.ranks)]
        self._ended: dict[int, str] = {}

    def rank_devices(self) -> list[str]:
        # Ray sets CUDA_VISIBLE_DEVICES to the actor's GPU: it is cuda:0 inside.
        return ["cuda:0" if self.world.device_type() == "cuda" else "cpu"] * self.size

    def _bundle(self) -> dict[str, float]:
        if self.world.device_type() == "cuda":
            return {"GPU": 1.0, "CPU": 1.0}
        return {"CPU": float(self.world.threads())}

    def _new_actor(self, rank: int) -> Any:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = self._bundle()
        return (
            ray.remote(RankActor)
            .options(
                num_cpus=bundle["CPU"],
                num_gpus=bundle.get("GPU", 0.0),
                max_restarts=self.world.ray_max_restarts,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self._placement_group, placement_group_bundle_index=rank
                ),
            )
            .remote(self.world.threads())
        )

    def launch(self) -> str:
        """Create (or revive) the actors; return rank 0's ``tcp://`` address."""
        import ray
        from ray.exceptions import GetTimeoutError
        from ray.util.placement_group import placement_group

        self.events = queue.Queue()
        self._ended = {}
        if not ray.is_initialized():
            ray.init(address=self.world.ray_address, ignore_reinit_error=True)
        timeout = self.world.start_timeout_s
        if self._placement_group is None:
            self._placement_group = placement_group(
                [self._bundle() for _ in range(self.size)],
                strategy=self.world.ray_placement_strategy,
            )
            try:
                ray.get(self._placement_group.ready(), timeout=timeout)
            except GetTimeoutError:
                raise RuntimeError(
                    f"the Ray cluster has no room for {self.size} ranks of {self._bundle()} "
                    f"({self.world.ray_placement_strategy}) after {timeout:.0f} s"
                ) from None
            self._actors = [self._new_actor(rank) for rank in range(self.size)]
        deadline = time.monotonic() + timeout
        for rank in range(self.size):
            self._info[rank] = self._reach(rank, deadline)
        host, port = ray.get(self._actors[0].free_address.remote(), timeout=timeout)
        return f"tcp://{host}:{port}"

    def _reach(self, rank: int, deadline: float) -> dict[str, Any]:
        """Ping rank ``rank``'s actor until it answers: while Ray restarts it, wait; once Ray
        has given up on it, put a new actor in its bundle (once)."""
        import ray
        from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

        replaced = False
        while True:
            try:
                left = max(1.0, deadline - time.monotonic())
                info: dict[str, Any] = ray.get(self._actors[rank].ping.remote(), timeout=left)
                return info
            except GetTimeoutError:
                raise RuntimeError(f"rank {rank}'s Ray actor did not start in time") from None
            except RayActorError as error:
                if time.monotonic() >= deadline:
                    raise RuntimeError(
                        f"rank {rank}'s Ray actor did not come back: {error}"
                    ) from None
                if isinstance(error, ActorUnavailableError) or replaced:
                    time.sleep(0.5)  # Ray is restarting it
                    continue
                ray.kill(self._actors[rank], no_restart=True)
                self._actors[rank] = self._new_actor(rank)
                replaced = True

    def send(self, rank: int, op: str, payload: dict[str, Any]) -> None:
        """Start ``op`` on rank ``rank``; its messages arrive on ``events``."""
        stream = (
            self._actors[rank]
            .handle.options(num_returns="streaming")
            .remote(dumps({"op": op, "payload": payload}).decode("utf-8"))
        )
        events = self.events  # this world's queue, even if the next world replaces it
        threading.Thread(
            target=self._pump,
            args=(rank, stream, events),
            name=f"art-train-rank{rank}-stream",
            daemon=True,
        ).start()

    def _pump(self, rank: int, stream: Any, events: queue.Queue[Any]) -> None:
        import ray

        try:
            for ref in stream:
                events.put((rank, loads(ray.get(ref))))
        except Exception as error:  # RayActorError and friends: the rank is gone
            self._ended[rank] = f"{type(error).__name__}: {str(error).splitlines()[0]}"
            events.put((rank, None))

    def alive(self) -> bool:
        """Whether every rank's actor answers (an idle actor answers at once)."""
        import ray

        try:
            ray.get([actor.ping.remote() for actor in self._actors], timeout=ALIVE_TIMEOUT_S)
        except Exception:
            return False
        return bool(self._actors)

    def describe(self, rank: int) -> str:
        info = self._info[rank]
        why = self._ended.get(rank, "its actor died")
        return f"rank {rank} (Ray actor, pid {info.get('pid')} on {info.get('host')}) died: {why}"

    def stop(self, *, failed: bool) -> None:
        """After a failure: kill the actors and let Ray restart them for the next world.
        Otherwise: end them and release their placement group."""
        import ray

        if not ray.is_initialized():
            self._actors, self._placement_group = [], None
            return
        for actor in self._actors:
            try:
                ray.kill(actor, no_restart=not failed)
            except Exception:
                pass
        if not failed:
            from ray.util.placement_group import remove_placement_group

            if self._placement_group is not None:
                remove_placement_group(self._placement_group)
            self._actors, self._placement_group = [], None
