"""Engine replicas as Ray actors: placed by Ray (across machines), restarted by Ray.

Each replica is an actor in a bundle of one placement group shared by the model's
replicas (a GPU each on CUDA, ``threads`` CPUs each otherwise; PACK by default). The actor
runs the engine worker's app (``worker.ThreadedWorker``) on a port of its node and tells
its address; the gateway stays the single entry point and reaches it over HTTP like any
engine server. Ray restarts a dead actor (``max_restarts=-1``); this side notices the
replica stopped answering, waits for Ray's restart, learns the new address and loads the
adapters again before sending it calls. An actor Ray gave up on is replaced in its bundle.
No cluster management here: Ray places, watches and restarts; we only route.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Any

from art_core.engines.base import EngineError
from art_core.engines.replica_spec import ReplicaSpec
from art_core.engines.tokenizer import ChatTokenizer
from art_core.engines.worker import ThreadedWorker, build_engine
from art_core.engines.worker_engine import WorkerClient, startup_timeout

logger = logging.getLogger(__name__)


class EngineWorkerActor:
    """The Ray actor of one replica: the transformers engine behind the worker app."""

    def __init__(
        self,
        model_path: str,
        device: str | None,
        dtype: str | None,
        threads: int | None,
        max_batch_size: int,
        max_loras: int,
        prefix_cache_bytes: int | None = None,
        compile_decode: bool = False,
    ) -> None:
        # Set here, not as the actor's Ray ``runtime_env``: an actor with one of its own is
        # started through Ray's setup_worker.py, a second interpreter importing Ray (~4 s of
        # CPU per actor), and none of the workers Ray prestarted serves it. The engine sets
        # torch's threads itself (``build_engine``); these reach what it starts.
        os.environ.update(OMP_NUM_THREADS=str(threads or 1), TOKENIZERS_PARALLELISM="false")
        engine = build_engine(
            Path(model_path),
            device=device,
            dtype=dtype,
            max_batch_size=max_batch_size,
            max_loras=max_loras,
            threads=threads,
            prefix_cache_bytes=prefix_cache_bytes,
            compile_decode=compile_decode,
        )
        self._worker = ThreadedWorker(engine, host="0.0.0.0")

    def address(self) -> tuple[str, int, int]:
        """(node IP, port, pid) of this replica's server."""
        import ray

        return ray.util.get_node_ip_address(), self._worker.port, os.getpid()


class RayPlacement:
    """One placement group for a model's replicas, made on first use."""

    def __init__(self, ray_address: str, bundles: list[dict[str, float]], strategy: str) -> None:
        self.ray_address = ray_address
        self.bundles = bundles
        self.strategy = strategy
        self.group: Any = None
        self._lock = asyncio.Lock()

    async def ready(self, within_s: float) -> Any:
        async with self._lock:
            if self.group is None:
                import ray
                from ray.util.placement_group import placement_group

                if not ray.is_initialized():
                    address = None if self.ray_address == "auto" else self.ray_address
                    ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
                self.group = placement_group(self.bundles, strategy=self.strategy)
                try:
                    await asyncio.wait_for(self.group.ready(), within_s)
                except TimeoutError:
                    raise EngineError(
                        f"the Ray cluster has no room for {len(self.bundles)} replicas of "
                        f"{self.bundles[0]} ({self.strategy}) after {within_s:.0f} s"
                    ) from None
            return self.group

    def remove(self) -> None:
        if self.group is not None:
            from ray.util.placement_group import remove_placement_group

            with contextlib.suppress(Exception):
                remove_placement_group(self.group)
            self.group = None


def bundle_of(spec: ReplicaSpec) -> dict[str, float]:
    if spec.device is not None and spec.device.startswith("cuda"):
        return {"GPU": 1.0, "CPU": 1.0}
    return {"CPU": float(spec.threads or 1)}


class RayWorkerEngine(WorkerClient):
    """One replica as a Ray actor (see the module's docstring).

    Example:
        >>> engine = RayWorkerEngine(path, spec=ReplicaSpec(0, None, 1, None),
        ...                          placement=placement, chat=chat)  # fragment: a Ray cluster's `placement`, a model's `path` and `chat`  # doctest: +SKIP
    """

    def __init__(
        self,
        model_path: Path,
        *,
        spec: ReplicaSpec,
        placement: RayPlacement,
        chat: ChatTokenizer,
        dtype: str | None = None,
        max_batch_size: int = 32,
        max_loras: int = 4,
        prefix_cache_bytes: int | None = None,
        compile_decode: bool = False,
        startup_timeout_s: float = 300.0,
        health_interval_s: float = 1.0,
        unresponsive_after_s: float = 60.0,
    ) -> None:
        super().__init__(
            max_loras=max_loras,
            name=f"engine replica {spec.index} (Ray)",
            health_interval_s=health_interval_s,
            unresponsive_after_s=unresponsive_after_s,
        )
        self.model_path = Path(model_path)
        self.spec = spec
        self.placement = placement
        self.dtype = dtype
        self.max_batch_size = max_batch_size
        self.prefix_cache_bytes = prefix_cache_bytes
        self.compile_decode = compile_decode
        self.startup_timeout_s = startup_timeout(startup_timeout_s, compile_decode)
        self.tokenizer = chat.tokenizer
        self._eos_ids = chat.eos_token_ids
        self.context_length = chat.context_length
        self.actor: Any = None
        self.actor_pid: int | None = None

    def _new_actor(self, group: Any) -> Any:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = bundle_of(self.spec)
        return (
            ray.remote(EngineWorkerActor)
            .options(
                num_cpus=bundle["CPU"],
                num_gpus=bundle.get("GPU", 0.0),
                max_restarts=-1,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    group, placement_group_bundle_index=self.spec.index
                ),
            )
            .remote(
                str(self.model_path),
                self.spec.device,
                self.dtype,
                self.spec.threads,
                self.max_batch_size,
                self.max_loras + 1,
                self.prefix_cache_bytes,
                self.compile_decode,
            )
        )

    async def _reach(self) -> None:
        """Wait for the actor (Ray may be restarting it) and take its address; an actor Ray
        gave up on is replaced in its bundle."""
        from ray.exceptions import RayActorError

        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            try:
                host, port, pid = await asyncio.wait_for(
                    self.actor.address.remote(), max(1.0, deadline - time.monotonic())
                )
                break
            except RayActorError as exc:
                if time.monotonic() > deadline:
                    raise EngineError(f"the {self.name} could not start: {exc}") from exc
                if "restart" not in str(exc).lower():  # Ray gave up: a new actor
                    self.actor = self._new_actor(await self.placement.ready(60))
                await asyncio.sleep(0.5)
            except TimeoutError:
                raise EngineError(
                    f"the {self.name} did not start within {self.startup_timeout_s:.0f} s"
                ) from None
        if self.actor_pid is not None and pid != self.actor_pid:
            self.restarts += 1
        self.actor_pid = pid
        import ray

        # On this machine's own node: loopback (the server listens on every interface).
        if host == ray.util.get_node_ip_address():
            host = "127.0.0.1"
        self.url = f"http://{host}:{port}"
        await self.disconnect()
        await self.connect()

    async def start(self) -> None:
        group = await self.placement.ready(self.startup_timeout_s)
        self.actor = self._new_actor(group)
        await self._reach()
        self._ready.set()
        self._watcher = asyncio.create_task(self._watch(), name=f"art-{self.name}-watch")

    def _expected_pid(self) -> int | None:
        return self.actor_pid

    async def _recover(self, hung: bool) -> None:
        """Ray restarts a dead actor by itself; a hung one is killed first (Ray restarts it
        too). Then wait for it, take its new address and load its adapters again."""
        if hung:
            self.kill()
        while not self._closing:
            try:
                await self._reach()
                await self._reload_adapters()
            except EngineError as exc:
                logger.warning("%s: %s; trying again", self.name, exc)
                await asyncio.sleep(1.0)
                continue
            self._ready.set()
            logger.info("%s is back (pid %s)", self.name, self.actor_pid)
            return

    def kill(self) -> None:
        """Kill the actor (Ray restarts it): what a crashed replica looks like."""
        import ray

        ray.kill(self.actor, no_restart=False)

    async def close(self) -> None:
        await self._stop_watching()
        if self.actor is not None:
            import ray

            with contextlib.suppress(Exception):
                ray.kill(self.actor, no_restart=True)
            self.actor = None
        if self.spec.index == 0:
            self.placement.remove()
