"""``LocalBackend``: engine, gateway and trainer on this machine.

One gateway (on its own thread and event loop) serves every model registered with the
backend; each model has its own engine, call store and trainer, and lives in its
``ModelFolder`` (``{path}/{project}/models/{name}/``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from art_core.backends.base import BackendBase, ProgressCallback
from art_core.backends.s3 import SyncReport, pull_model_folder, push_model_folder
from art_core.chat_formats import chat_format_settings
from art_core.cpu import CoreSplit, cpu_budget
from art_core.diagnoses import diagnose
from art_core.embedded import resolve_base_model
from art_core.engines.base import Engine
from art_core.engines.select import choose_engine
from art_core.engines.tokenizer import ChatTokenizer, load_chat_tokenizer
from art_core.export import export_checkpoint
from art_core.files import atomic_write_text
from art_core.gateway.app import Gateway, ServedModel
from art_core.gateway.server import GatewayServer
from art_core.gateway.store import CallStore, open_call_store
from art_core.matching import attach_recorded_calls
from art_core.memory import (
    collect_frozen_unless_freed,
    freeze_heap,
    return_freed_pages,
    weak_references,
)
from art_core.metrics import hooks as metric_hooks
from art_core.model_folder import ModelFolder
from art_core.names import check_name
from art_core.sft.data import demonstrations
from art_core.tracing import hooks as tracing
from art_core.trajectories import LLMCall, TrajectoryGroup, require_finished

if TYPE_CHECKING:
    from art_core.export import ExportFormat, ExportResult
    from art_core.model import TrainableModel
    from art_core.sft.data import SFTData
    from art_core.training.config import SFTConfig, TrainConfig, TrainResult
    from art_core.training.distributed import TrainingWorld
    from art_core.training.trainer import Trainer

logger = logging.getLogger(__name__)


@dataclass
class _Registered:
    model: TrainableModel
    folder: ModelFolder
    base_path: Path
    served: ServedModel
    # The one thread that runs this model's torch work: engine batches and training steps.
    # OpenMP keeps a thread team per calling thread; with sampling and training on different
    # threads, the idle team competes for the cores (decode steps measured ~1.6x slower).
    torch_thread: ThreadPoolExecutor
    trainer: Trainer | None = None
    # The thread that trains while the engine keeps serving (``serve_while_training``),
    # with its own share of the CPU threads; None until first used.
    train_thread: ThreadPoolExecutor | None = None
    # The model thread's CPU threads before they were split with ``train_thread``.
    threads_before_split: int | None = None
    # How sampling and training share this process's cores while overlapped (None: the
    # engine samples in another process, or nothing is split yet).
    core_split: CoreSplit | None = None
    train_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # The cancel event of the step running now (``cancel_training``); None between steps.
    cancel: threading.Event | None = None


class LocalBackend(BackendBase):
    """Serve and train models on this machine (training on ``training_world``'s ranks when
    given: several processes or GPUs, locally or on a Ray cluster).

    Example:
        >>> backend = LocalBackend(path=".art")
        >>> await model.register(backend)  # needs a registered model: `model`, and `groups` made with it  # doctest: +SKIP
        >>> result = await backend.train(model, groups, learning_rate=1e-5)  # needs a registered model  # doctest: +SKIP
        >>> await backend.close()
    """

    def __init__(
        self,
        path: str | Path = ".art",
        *,
        engine: str = "auto",
        host: str = "127.0.0.1",
        port: int = 0,
        rollout_ttl_s: float = 1800.0,
        max_rollout_memory_mb: float = 256.0,
        device: str | None = None,
        dtype: str | None = None,
        max_batch_size: int = 32,
        default_max_tokens: int = 1024,
        training_world: TrainingWorld | None = None,
        replicas: int = 1,
        threads_per_replica: int | None = None,
        replica_devices: list[str] | None = None,
        ray_address: str | None = None,
        prefix_cache_bytes: int | None = None,
        compile_decode: bool = False,
    ) -> None:
        if replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {replicas}")
        self.path = Path(path)
        # Several engine replicas per model (engine workers behind the gateway's router), or
        # one engine worker placed by Ray (``ray_address``: "auto" or a cluster's address).
        self.replicas = replicas
        self.threads_per_replica = threads_per_replica
        self.replica_devices = replica_devices
        self.ray_address = ray_address
        self.training_world = training_world
        self.engine_name = choose_engine(engine)
        self.device = device
        self.dtype = dtype
        self.max_batch_size = max_batch_size
        # The transformers engine's prefix cache, per engine (each replica its own): None
        # for a default from free memory, 0 for none (see engines/prefix_cache.py).
        if prefix_cache_bytes is not None and prefix_cache_bytes < 0:
            raise ValueError(f"prefix_cache_bytes must be >= 0, got {prefix_cache_bytes}")
        self.prefix_cache_bytes = prefix_cache_bytes
        # The transformers engine's decode steps compiled (TransformersEngine's
        # ``compile_decode``): each engine compiles and checks them when it starts.
        self.compile_decode = compile_decode
        self.default_max_tokens = default_max_tokens
        # A rollout not released this long after its last call leaves memory (its calls
        # stay on disk, read back if it goes on or is released later).
        self.rollout_ttl_s = rollout_ttl_s
        # And the least recently active ones leave it once the calls held in memory (per
        # model, their recorded size) pass this: a caller that never releases holds no more.
        if not max_rollout_memory_mb > 0:
            raise ValueError(f"max_rollout_memory_mb must be > 0, got {max_rollout_memory_mb}")
        self.max_rollout_memory_bytes = int(max_rollout_memory_mb * 1024 * 1024)
        self.gateway = Gateway()
        self.server = GatewayServer(self.gateway, host=host, port=port)
        self._models: dict[str, _Registered] = {}
        self._started = False

    async def __aenter__(self) -> LocalBackend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def base_url(self) -> str:
        """The gateway's OpenAI base URL (``.../v1``)."""
        return f"{self.server.base_url}/v1"

    def model_folder(self, model: TrainableModel) -> ModelFolder:
        """The folder of ``model`` under this backend's path (registered or not)."""
        return ModelFolder.of(self.path, model.project, model.name)

    def _entry(self, model: TrainableModel) -> _Registered:
        entry = self._models.get(model.name)
        if entry is None:
            raise RuntimeError(f"model {model.name!r} is not registered with this backend")
        return entry

    def engine(self, model: TrainableModel) -> Engine:
        """The engine serving ``model``."""
        return self._entry(model).served.engine

    def served(self, model: TrainableModel) -> ServedModel:
        """What the gateway serves for ``model``: engine, chat tokenizer, call record."""
        return self._entry(model).served

    def store(self, model: TrainableModel) -> CallStore:
        """The record of every call served for ``model``."""
        return self._entry(model).served.store

    async def start(self) -> None:
        """Start the gateway now (``register`` does it on first use); a service calls this.

        Example:
            >>> await LocalBackend(path=".art", port=7999).start()  # starts a server: the gateway, on port 7999  # doctest: +SKIP
        """
        if not self._started:
            await asyncio.to_thread(self.server.start)
            self._started = True

    # ------------------------------------------------------------------------------ register
    async def register(self, model: TrainableModel) -> None:
        # Checked before anything is written: a refused setting leaves no folder behind.
        chat_settings = chat_format_settings(getattr(model, "_internal_config", None))
        if model.name in self._models:
            existing = self._models[model.name]
            if (
                existing.model.base_model != model.base_model
                or existing.model.project != model.project
            ):
                raise ValueError(f"another model named {model.name!r} is already registered")
            self._bind(model)
            existing.model = model
            return
        # The base model resolves (or is built) before anything of the model is written: a
        # refused one leaves no folder that would hold the name.
        base_path = await asyncio.to_thread(resolve_base_model, model.base_model, self.path)
        await self.start()
        folder = self.model_folder(model)
        folder.root.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(self._check_folder, folder, model)
        atomic_write_text(
            folder.model_json,
            model.model_dump_json(indent=2, exclude={"inference_api_key", "inference_base_url"}),
        )
        chat = await asyncio.to_thread(
            functools.partial(load_chat_tokenizer, base_path, **chat_settings)
        )
        # The record first (cheap, and a damaged one is set aside), then the engine; whatever
        # fails, nothing started for this model is left running (a retried load would leak
        # an engine, its weights and threads each time).
        store = await asyncio.to_thread(
            functools.partial(
                open_call_store,
                folder,
                rollout_ttl_s=self.rollout_ttl_s,
                max_memory_bytes=self.max_rollout_memory_bytes,
            )
        )
        torch_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="art-torch")
        engine: Engine | None = None
        try:
            engine = self._new_engine(base_path, folder, chat, torch_thread)
            await self.server.call(engine.start())
            latest = folder.latest_checkpoint()
            if latest is not None:
                await self.server.call(engine.load_adapter(latest[1], latest[0]))
        except BaseException:
            if engine is not None:
                try:
                    await self.server.call(engine.close())
                except Exception:  # already failed: the first error is the one to report
                    logger.debug("closing the engine of a failed load", exc_info=True)
            torch_thread.shutdown(wait=False)
            await asyncio.to_thread(store.close)
            raise
        served = ServedModel(
            name=model.name,
            engine=engine,
            store=store,
            chat=chat,
            default_max_tokens=self.default_max_tokens,
        )
        self.gateway.add(served)
        self._models[model.name] = _Registered(
            model=model,
            folder=folder,
            base_path=base_path,
            served=served,
            torch_thread=torch_thread,
        )
        self._bind(model)
        freeze_heap()  # the engine's weights and modules: out of later full collections

    @staticmethod
    def _check_folder(folder: ModelFolder, model: TrainableModel) -> None:
        """Refuse a folder trained from another base model; set aside damaged checkpoints."""
        import json

        if folder.model_json.is_file():
            try:
                previous = json.loads(folder.model_json.read_text())
            except ValueError:
                previous = {}
            if isinstance(previous, dict) and previous.get("base_model") not in (
                None,
                model.base_model,
            ):
                raise ValueError(
                    f"{folder.root.name} holds a model trained from "
                    f"{previous.get('base_model')!r}, not {model.base_model!r}: use another "
                    "name or project"
                )
        for old, new in folder.set_aside_incomplete():
            logger.warning(
                "checkpoint %s of %s is incomplete or damaged; set aside as %s",
                old.name,
                model.name,
                new.name,
            )

    def _new_engine(
        self,
        base_path: Path,
        folder: ModelFolder,
        chat: ChatTokenizer,
        torch_thread: ThreadPoolExecutor,
    ) -> Engine:
        if self.uses_engine_workers:
            return self._replica_router(base_path, folder, chat)
        if self.engine_name == "vllm":
            from art_core.engines.vllm_engine import VLLMEngine  # vLLM: an optional dependency

            return VLLMEngine(base_path, log_dir=folder.logs)
        # Imported here: torch takes ~1.5 s to import, and `import art_core` should not pay
        # it (a RemoteBackend client never needs it).
        from art_core.engines.transformers_engine import TransformersEngine

        return TransformersEngine(
            base_path,
            device=self.device,
            dtype=self.dtype,
            max_batch_size=self.max_batch_size,
            worker=torch_thread,
            chat=chat,
            prefix_cache_bytes=self.prefix_cache_bytes,
            compile_decode=self.compile_decode,
        )

    @property
    def uses_engine_workers(self) -> bool:
        """Whether models are served by engine workers behind a router: several replicas, a
        Ray cluster, or a replica's threads or devices given (else the engine runs in this
        process, the default for one replica)."""
        return (
            self.replicas > 1
            or self.ray_address is not None
            or self.threads_per_replica is not None
            or self.replica_devices is not None
        )

    def _replica_router(self, base_path: Path, folder: ModelFolder, chat: ChatTokenizer) -> Engine:
        """``replicas`` engine workers (processes here, or Ray actors) behind one router."""
        # Replicas only: kept off `import art_core` (~15 ms with the worker engine's modules).
        from art_core.engines.replicas import build_replicas, plan_replicas
        from art_core.engines.router import ReplicaRouter

        if self.engine_name == "vllm":
            raise ValueError(
                "replicas > 1 run the transformers engine in worker processes; for vLLM, "
                "use its own data parallelism (engine='vllm' with one replica)"
            )
        specs = plan_replicas(
            self.replicas,
            threads_per_replica=self.threads_per_replica,
            devices=self.replica_devices or ([self.device] if self.device else None),
        )
        engines = build_replicas(
            specs,
            base_path,
            log_dir=folder.logs,
            chat=chat,
            dtype=self.dtype,
            max_batch_size=self.max_batch_size,
            ray_address=self.ray_address,
            prefix_cache_bytes=self.prefix_cache_bytes,
            compile_decode=self.compile_decode,
        )
        return ReplicaRouter(engines)

    def _bind(self, model: TrainableModel) -> None:
        model.inference_base_url = self.base_url
        model.inference_api_key = model.inference_api_key or "art-local"
        model.inference_model_name = model.name

    # ------------------------------------------------------------------------------ capture
    async def rollout_calls(
        self, model: TrainableModel, rollout_id: str, *, release: bool = False
    ) -> list[LLMCall]:
        store = self.store(model)
        return store.release(rollout_id) if release else store.calls_for(rollout_id)

    # ------------------------------------------------------------------------------ training
    def _trainer(self, entry: _Registered) -> Trainer:
        if entry.trainer is None:
            if self.training_world is not None:
                # torch: loaded on the first train step, never by `import art_core`.
                from art_core.training.distributed import DistributedTrainer

                entry.trainer = DistributedTrainer(
                    entry.base_path, entry.folder, self.training_world
                )
            else:
                from art_core.training.trainer import Trainer  # torch, as above

                entry.trainer = Trainer(entry.base_path, entry.folder, device=self.device)
        return entry.trainer

    async def train(
        self,
        model: TrainableModel,
        trajectory_groups: Iterable[TrajectoryGroup],
        config: TrainConfig | None = None,
        *,
        on_progress: ProgressCallback | None = None,
        serve_while_training: bool = False,
        cancel: threading.Event | None = None,
        **overrides: Any,
    ) -> TrainResult:
        """One training step; ``on_progress`` gets the trainer's per-batch records (in its
        worker thread), e.g. to stream them to a remote client.

        Cancelling: set ``cancel``, call ``cancel_training(model)`` or cancel the task
        awaiting this call. The step stops within a micro-batch with ``TrainingCancelled``
        (``art_core.training.cancel``), writes no checkpoint, and the engine serves the
        previous one again at once.

        Lock-step (default): the engine is paused (in-flight requests finish), the step runs
        on the model's torch thread, the new adapter is loaded and serving resumes.
        ``serve_while_training`` (pipelined training, ``art.PipelineTrainer``): the engine
        keeps serving on its own cores while the step trains on the others, and the new
        adapter is loaded between two decode steps (requests in flight finish on theirs). A
        step that trained nothing (``TrainResult.nothing_trained``) leaves the served
        adapter as it was.
        """
        config = self.train_config(config, overrides, model=model)
        entry = self._entry(model)
        groups = list(trajectory_groups)
        require_finished(groups)
        store = entry.served.store
        groups = [
            g.model_copy(
                update={"trajectories": [attach_recorded_calls(t, store) for t in g.trajectories]}
            )
            for g in groups
        ]
        engine = entry.served.engine
        started = time.time()
        cancel = threading.Event() if cancel is None else cancel
        step = functools.partial(
            self._trainer(entry).train_step, groups, config, on_progress=on_progress, cancel=cancel
        )
        async with entry.train_lock:
            if serve_while_training:
                pool = self._train_thread(entry)
                result = await self._run_step(entry, pool, step, cancel)
                await self._serve_result(engine, result)
            else:
                await self._end_serve_while_training(entry)
                await self.server.call(engine.pause())
                try:
                    result = await self._run_step(entry, entry.torch_thread, step, cancel)
                    await self._serve_result(engine, result)
                finally:
                    await self.server.call(engine.resume())
        await self._log_serving(entry, result)
        await self._diagnose(entry, groups, result)
        tracing.train_step_finished(model, groups, config, result, started)
        metric_hooks.train_step_finished(model, result.metrics, result.step)
        return result

    @staticmethod
    async def _run_step(
        entry: _Registered,
        pool: ThreadPoolExecutor,
        step: functools.partial[TrainResult],
        cancel: threading.Event,
    ) -> TrainResult:
        """Run a step in ``pool``; while it runs, ``cancel_training`` can stop it. A caller
        cancelling the task awaiting it stops the step too, and waits for the thread to let
        go of the weights (within a micro-batch) before serving resumes."""
        future = asyncio.get_running_loop().run_in_executor(pool, step)
        entry.cancel = cancel
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            cancel.set()
            await asyncio.gather(future, return_exceptions=True)
            raise
        finally:
            entry.cancel = None

    def cancel_training(self, model: TrainableModel) -> bool:
        """Stop the step ``model`` is training now (see ``train``); False when none runs.

        Example:
            >>> backend.cancel_training(model)  # needs a registered model, training  # doctest: +SKIP
            True
        """
        cancel = self._entry(model).cancel
        if cancel is None:
            return False
        cancel.set()
        return True

    async def _log_serving(self, entry: _Registered, result: TrainResult) -> None:
        """Serving metrics into the step's result (so its span and W&B): the prefix cache's
        (hit rate, tokens prefilled vs asked for, bytes, evictions); for a replicated model,
        each replica's (in flight, tokens/s, restarts, its prefix cache), also written as a
        ``serving`` record of ``history.jsonl``."""
        from art_core.engines.router import ReplicaRouter  # as in _replica_router

        engine = entry.served.engine
        if not isinstance(engine, ReplicaRouter):
            metrics = getattr(engine, "metrics", None)
            if callable(metrics):
                result.metrics.update(metrics(prefix="serving/"))
            return
        await engine.refresh_metrics()
        serving = engine.metrics()
        result.metrics.update(serving)
        record = {"step": result.step, "split": "serving", "time": time.time(), **serving}
        await asyncio.to_thread(entry.folder.append_history, record)

    async def _diagnose(
        self, entry: _Registered, groups: list[TrajectoryGroup], result: TrainResult
    ) -> None:
        """Why the step's groups taught little or nothing (``art_core.diagnoses``): into the
        result, a ``diagnoses`` record of ``history.jsonl`` (under the step that sampled the
        groups, as the step's train record) and the log when the step trained nothing."""
        result.diagnoses = await asyncio.to_thread(diagnose, groups)
        if not result.diagnoses:
            return
        sampled = result.step if result.nothing_trained else result.step - 1
        record = {
            "step": sampled,
            "split": "diagnoses",
            "time": time.time(),
            "diagnoses": [d.model_dump() for d in result.diagnoses],
        }
        await asyncio.to_thread(entry.folder.append_history, record)
        if result.nothing_trained:
            logger.warning(
                "why step %d trained nothing:\n%s",
                sampled + 1,
                "\n".join(f"  {d.line()}" for d in result.diagnoses),
            )

    async def _serve_result(self, engine: Engine, result: TrainResult) -> None:
        """Load the adapter a step produced (nothing to do when it trained nothing)."""
        if result.nothing_trained is None and result.checkpoint_path is not None:
            await self.server.call(engine.load_adapter(Path(result.checkpoint_path), result.step))

    def prepare_serve_while_training(self, model: TrainableModel) -> CoreSplit | None:
        """Set up training while serving for ``model`` now (the thread and the CPU split);
        ``ValueError`` where sampling and training would share one device. Returns how the
        two share this process's cores, or None where the engine samples in another process
        (its CPU time is not this process's)."""
        entry = self._entry(model)
        self._train_thread(entry)
        return entry.core_split

    def plan_serve_while_training(self, model: TrainableModel) -> CoreSplit | None:
        """How sampling and training would share this process's cores if ``model`` trained
        while serving (None where the engine samples in another process); ``ValueError``
        where the two would share one device. Changes nothing: the engine keeps every core
        until such a step runs (or ``prepare_serve_while_training``)."""
        return self._core_plan(self._entry(model))

    def _core_plan(self, entry: _Registered) -> CoreSplit | None:
        """The CPU split of training while serving, or None (the engine in another process).

        Refused where sampling and training would share one device (one GPU, or one CPU
        core): taking turns (lock-step) is the right way to share it, and overlapping them
        would only thrash.
        """
        # torch (device.py imports it): only once training beside serving is considered.
        from art_core.device import choose_device
        from art_core.engines.transformers_engine import TransformersEngine

        engine = entry.served.engine
        in_process = isinstance(engine, TransformersEngine)
        trainer_device = choose_device(self.device)
        if trainer_device.type == "cuda" and (in_process or getattr(engine, "cuda", False)):
            raise ValueError(
                "training while serving needs separate devices for sampling and training; "
                "here one GPU holds both: train lock-step (the default), which gives the GPU "
                "to each in turn"
            )
        budget = cpu_budget()
        if not in_process:
            return None
        if budget < 2:
            raise ValueError(
                f"training while serving needs two CPU cores (one to sample, one to train); "
                f"this process may use {budget}: train lock-step (the default)"
            )
        trainer_threads = max(1, budget // 2)
        return CoreSplit(budget, budget - trainer_threads, trainer_threads)

    def _train_thread(self, entry: _Registered) -> ThreadPoolExecutor:
        """The thread that trains while the engine serves, the CPU threads split between them
        (``_core_plan``: refused where the two would share one device)."""
        if entry.train_thread is not None:
            return entry.train_thread
        from art_core.device import set_cpu_threads  # torch, as in _core_plan

        split = self._core_plan(entry)
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="art-train")
        # torch's CPU thread count is per calling thread (OpenMP): each side gets its share.
        set_cpu_threads(pool, split.trainer_threads if split else cpu_budget())
        if split is not None:
            entry.threads_before_split = set_cpu_threads(entry.torch_thread)
            set_cpu_threads(entry.torch_thread, split.sampler_threads)
            entry.core_split = split
        entry.train_thread = pool
        return pool

    async def end_serve_while_training(self, model: TrainableModel) -> None:
        """Give ``model``'s engine back every CPU thread it had before training while serving
        split them (what a pipeline that trained overlapped does when it ends); nothing to do
        when no split was made.

        Example:
            >>> await backend.end_serve_while_training(model)  # needs a registered model  # doctest: +SKIP
        """
        entry = self._entry(model)
        async with entry.train_lock:
            await self._end_serve_while_training(entry)

    @staticmethod
    async def _end_serve_while_training(entry: _Registered) -> None:
        """A lock-step step after steps trained while serving: the model's thread gets back
        the CPU threads it had before the split (it samples and trains on all of them)."""
        pool, threads = entry.train_thread, entry.threads_before_split
        if pool is None:
            return
        from art_core.device import set_cpu_threads  # torch, as in _train_thread

        entry.train_thread = entry.threads_before_split = None
        pool.shutdown(wait=False)
        if threads is not None:
            await asyncio.to_thread(set_cpu_threads, entry.torch_thread, threads)

    async def train_sft(
        self,
        model: TrainableModel,
        trajectories: SFTData,
        config: SFTConfig | None = None,
        *,
        on_progress: ProgressCallback | None = None,
        cancel: threading.Event | None = None,
        **overrides: Any,
    ) -> TrainResult:
        """Supervised epochs on demonstrations, as the next checkpoint (``art_core.sft``).

        The data is read, checked and turned into token sequences first, while the engine
        keeps serving (recorded calls of this model token-exactly, the rest with its chat
        template); a bad record raises ``ValueError`` naming it and nothing is trained. Then,
        as for ``train``: engine paused, the epochs run on the model's torch thread, the new
        adapter loaded, serving resumed.
        """
        from art_core.sft.render import SFTRenderer  # torch (the renderer's tensors)

        config = self.sft_config(config, overrides)
        entry = self._entry(model)
        started = time.time()
        demos = await asyncio.to_thread(demonstrations, trajectories)
        renderer = SFTRenderer(entry.served.chat)
        records = await asyncio.to_thread(
            renderer.records,
            demos,
            assistant_turns=config.assistant_turns,
            lookup=entry.served.store.get,
        )
        group = TrajectoryGroup([demo.trajectory for demo in demos])
        data_metrics = {
            "sft/records_token_exact": float(renderer.token_exact),
            "sft/records_rendered": float(renderer.rendered),
        }
        engine = entry.served.engine
        cancel = threading.Event() if cancel is None else cancel

        def step() -> TrainResult:
            if self.training_world is None:
                trainer = self._trainer(entry)
            else:
                # SFT is not data-parallel: it runs here, on this backend's device, and the
                # ranks load its checkpoint at their next step (they check the latest).
                from art_core.training.trainer import Trainer

                trainer = Trainer(entry.base_path, entry.folder, device=self.device)
            try:
                return trainer.train_sft(
                    records,
                    config,
                    on_progress=on_progress,
                    groups=[group],
                    data_metrics=data_metrics,
                    cancel=cancel,
                )
            finally:
                if trainer is not entry.trainer:
                    trainer.unload()

        async with entry.train_lock:
            await self._end_serve_while_training(entry)
            await self.server.call(engine.pause())
            try:
                result = await self._run_step(
                    entry, entry.torch_thread, functools.partial(step), cancel
                )
                assert result.checkpoint_path is not None
                await self.server.call(
                    engine.load_adapter(Path(result.checkpoint_path), result.step)
                )
            finally:
                await self.server.call(engine.resume())
        tracing.train_step_finished(model, [], config, result, started)
        return result

    async def get_step(self, model: TrainableModel) -> int:
        return self._entry(model).folder.latest_step()

    async def log(
        self,
        model: TrainableModel,
        trajectory_groups: Iterable[TrajectoryGroup] | None = None,
        *,
        split: str = "val",
        metrics: Mapping[str, float | None] | None = None,
        step: int | None = None,
    ) -> None:
        check_name(split, "split")
        groups = list(trajectory_groups or [])
        require_finished(groups)
        folder = self._entry(model).folder
        step = folder.latest_step() if step is None else step
        if groups:
            lines = [g.model_dump_json() for g in groups]
            await asyncio.to_thread(folder.append_trajectories, split, step, lines)
        record = history_record(groups, split=split, step=step, metrics=metrics)
        await asyncio.to_thread(folder.append_history, record)
        metric_hooks.history_logged(model, record)

    async def delete_checkpoints(
        self, model: TrainableModel, best_checkpoint_metric: str = "val/reward"
    ) -> list[int]:
        entry = self._entry(model)
        return await asyncio.to_thread(
            self._trainer(entry).delete_checkpoints, best_checkpoint_metric
        )

    async def export(
        self,
        model: TrainableModel,
        out: str | Path,
        *,
        format: ExportFormat = "peft",
        step: int | None = None,
        best: str | None = None,
        higher_is_better: bool | None = None,
        overwrite: bool = False,
        gguf_type: str = "f16",
    ) -> ExportResult:
        """Export a checkpoint of ``model``'s folder (``art_core.export.export_checkpoint``,
        in a worker thread; base models resolve under this backend's path)."""

        return await asyncio.to_thread(
            functools.partial(
                export_checkpoint,
                self.model_folder(model),
                out,
                format=format,
                step=step,
                best=best,
                higher_is_better=higher_is_better,
                overwrite=overwrite,
                art_path=self.path,
                gguf_type=gguf_type,
            )
        )

    # ------------------------------------------------------------------------------ S3 backup
    async def _experimental_push_to_s3(
        self,
        model: TrainableModel,
        s3_bucket: str | None = None,
        prefix: str | None = None,
        verbose: bool = False,
        delete: bool = False,
        *,
        profile: str | None = None,
    ) -> SyncReport:
        """Upload ``model``'s folder to ``s3://{s3_bucket or $BACKUP_BUCKET}/{prefix/}
        {project}/models/{name}/`` (ART's layout and name; see ``art_core.backends.s3``).

        Example:
            >>> await backend._experimental_push_to_s3(model)  # needs a network service: S3  # doctest: +SKIP
        """
        return await push_model_folder(
            self.model_folder(model),
            bucket=s3_bucket,
            prefix=prefix,
            profile=profile,
            delete=delete,
            verbose=verbose,
        )

    async def _experimental_pull_from_s3(
        self,
        model: TrainableModel,
        step: int | None = None,
        s3_bucket: str | None = None,
        prefix: str | None = None,
        verbose: bool = False,
        delete: bool = False,
        *,
        profile: str | None = None,
    ) -> SyncReport:
        """Download ``model``'s folder (or only checkpoint ``step``) from S3 into this
        backend's path, before ``model.register(backend)``: a registered model's engine and
        trainer already read the folder, so pulling under them is refused.

        Example:
            >>> await backend._experimental_pull_from_s3(model)  # needs a network service: S3  # doctest: +SKIP
            >>> await model.register(backend)  # needs a registered model  # doctest: +SKIP
        """
        if model.name in self._models:
            raise RuntimeError(
                f"model {model.name!r} is registered: pull from S3 before model.register(backend)"
            )
        return await pull_model_folder(
            self.model_folder(model),
            step=step,
            bucket=s3_bucket,
            prefix=prefix,
            profile=profile,
            delete=delete,
            verbose=verbose,
        )

    # ------------------------------------------------------------------------------ shutdown
    async def close(self) -> None:
        """Stop serving: finish queued work, close engines, stores and the gateway."""
        # What must be freed with the models: the engines and trainers and their weights.
        # A comprehension, not a loop: a loop's variable would keep the last model's engine
        # alive through the check below (and a collection would freeze it again).
        let_go = [ref for entry in self._models.values() for ref in _held_by(entry)]
        stores = [await self._close_model(entry) for entry in self._models.values()]
        self._models.clear()
        self.gateway.models.clear()
        # Their frozen objects that only cycles keep; none when reference counting freed all.
        collect_frozen_unless_freed(let_go)
        return_freed_pages()  # their weights, back to the system now, not at some later trim
        if self._started:
            await asyncio.to_thread(self.server.stop)
            self._started = False
        # Stores close last: a call answered while the engines closed is still recorded.
        for store in stores:
            await asyncio.to_thread(store.close)

    async def _close_model(self, entry: _Registered) -> CallStore:
        """Close one model's engine, training ranks and threads, and the client its
        ``openai_client()`` shares; its store (closed last)."""
        await entry.model.close_openai_client()
        try:
            await self.server.call(entry.served.engine.close())
        except RuntimeError:
            pass
        if entry.trainer is not None and self.training_world is not None:
            await asyncio.to_thread(entry.trainer.unload)  # the rank processes
        entry.torch_thread.shutdown(wait=False)
        if entry.train_thread is not None:
            entry.train_thread.shutdown(wait=False)
        return entry.served.store


def _held_by(entry: _Registered) -> list[weakref.ref[Any]]:
    """Weak references to what ``entry``'s model holds in this process: its engine and the
    engine's model, its trainer and the trainer's model (each with its parameters)."""
    engine, trainer = entry.served.engine, entry.trainer
    return weak_references(
        engine,
        getattr(engine, "model", None),
        trainer,
        getattr(trainer, "model", None),
    )


def history_record(
    groups: list[TrajectoryGroup],
    *,
    split: str,
    step: int,
    metrics: Mapping[str, float | None] | None = None,
) -> dict[str, Any]:
    """The ``history.jsonl`` record of a ``log`` call: the groups' mean reward and count, and
    ``metrics`` (keys without a ``/`` get the split as prefix, ART-style).

    Example:
        >>> history_record([], split="val", step=2, metrics={"acc": 0.5})["val/acc"]
        0.5
    """
    rewards = [t.reward for g in groups for t in g.trajectories]
    record: dict[str, Any] = {"step": step, "split": split, "time": time.time()}
    if groups:
        record[f"{split}/num_trajectories"] = len(rewards)
        if rewards:
            record[f"{split}/reward"] = sum(rewards) / len(rewards)
    for name, value in (metrics or {}).items():
        finite = isinstance(value, int | float) and math.isfinite(value)
        # NaN/inf (a diverged step) become null: history.jsonl stays strict JSON.
        record[name if "/" in name else f"{split}/{name}"] = value if finite else None
    return record
