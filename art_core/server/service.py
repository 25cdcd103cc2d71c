"""``Service``: a ``LocalBackend`` driven over HTTP, with persisted registrations and jobs.

Everything here runs on the gateway's event loop (the API routes are served by the same
uvicorn server as the gateway), so the backend, the registry and the jobs need no locks
beyond the per-model ones that serialize training.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import shutil
import threading
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from art_core.backends.local import LocalBackend
from art_core.embedded import EMBEDDED_MODELS, BaseModelError, is_embedded_name
from art_core.export.api import estimate_export_bytes, export_checkpoint
from art_core.export.archive import pack
from art_core.gateway.errors import scrub_paths
from art_core.model import TrainableModel
from art_core.model_folder import ModelFolder
from art_core.names import check_name
from art_core.server.export_space import ExportSpace, Reservation
from art_core.server.jobs import Job, JobStore
from art_core.server.registry import ModelRecord, ModelRegistry
from art_core.server.schemas import (
    ExportRequest,
    FieldError,
    RegisterRequest,
    TrainRequest,
    TrainSFTRequest,
    check_calls,
    to_groups,
)
from art_core.server.settings import ServeSettings
from art_core.sft.data import Demonstration, check_demonstration
from art_core.training.cancel import TrainingCancelled
from art_core.trajectories import new_id

# Runs one training call (``train`` or ``train_sft``) with a progress callback.
# A training call of a job: given the progress callback and the job's cancel event.
TrainCall = Callable[[Callable[[dict[str, Any]], None], threading.Event], Awaitable[Any]]

logger = logging.getLogger(__name__)


class NotFound(LookupError):
    """A model or job this server does not know (HTTP 404)."""


class Conflict(ValueError):
    """A request that contradicts the server's state (HTTP 409)."""


class ExportRefused(ValueError):
    """An export the model's folder cannot give (no such step, metric, format; HTTP 400)."""


@dataclass
class ExportDownload:
    """An export packed as one tar in its scratch folder, ready to send; ``remove`` (once
    sent, failed or cut) deletes the folder and frees its share of the export space."""

    archive: Path
    scratch: Path
    size: int
    reservation: Reservation
    removed: bool = field(default=False, init=False)

    async def remove(self) -> None:
        """Delete the scratch folder and release its space; once (later calls do nothing)."""
        if self.removed:
            return
        self.removed = True
        await asyncio.to_thread(shutil.rmtree, self.scratch, True)
        self.reservation.release()


class ModelUnavailable(RuntimeError):
    """A model that failed to load recently (HTTP 503 + Retry-After): the failure is kept
    for ``FAILED_LOAD_RETRY_S``, so requests naming it get the reason at once instead of each
    loading it again."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


# How long a failed model load is answered from memory before the next request tries again.
FAILED_LOAD_RETRY_S = 30.0


def allowed_base_model(name: str, allowed: list[str]) -> bool:
    """Embedded models (``tiny-random-<seed>``, ``tiny-<family>-<seed>``...) or folders the
    operator listed: never an arbitrary path chosen by a client.

    Example:
        >>> allowed_base_model("tiny-random", []), allowed_base_model("/etc", [])
        (True, False)
    """
    return is_embedded_name(name) or name in allowed


class Service:
    """The state behind the HTTP API: which models are loaded, and the training jobs.

    Example:
        >>> service = Service(LocalBackend(path=".art", port=7999), ServeSettings())  # starts a server: the gateway on port 7999  # doctest: +SKIP
        >>> await service.register(RegisterRequest(name="m", base_model="tiny-random"))  # starts a server  # doctest: +SKIP
    """

    def __init__(self, backend: LocalBackend, settings: ServeSettings) -> None:
        self.backend = backend
        self.settings = settings
        self.path = Path(settings.path)
        self.registry = ModelRegistry(self.path)
        self.jobs = JobStore(self.path)
        self.models: dict[str, TrainableModel] = {}
        self._register_lock = asyncio.Lock()
        # Models whose load failed: name -> (when to try again, the reason).
        self._failed_loads: dict[str, tuple[float, str]] = {}
        # One lock per model name: training and checkpoint deletion of a model never interleave.
        self._model_locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        # Exports load a base model and write a copy of it: one at a time per server.
        self._export_slot = asyncio.Semaphore(1)
        # The scratch bytes of exports in flight (queued, building, being sent).
        self.export_space = ExportSpace(settings.max_export_scratch_bytes)
        self.reconcile_jobs()

    # ------------------------------------------------------------------------------ models
    async def register(self, request: RegisterRequest) -> TrainableModel:
        """Load (or re-bind) a model; it resumes from its latest checkpoint."""
        if not allowed_base_model(request.base_model, self.settings.allowed_base_models):
            raise FieldError(
                "base_model",
                f"{request.base_model!r} is not served here: use an embedded model "
                f"({', '.join(sorted(EMBEDDED_MODELS))}, tiny-random-<seed>, tiny-<family>-<seed>) or one the server "
                "allows (art-core serve --allow-base-model)",
            )
        async with self._register_lock:
            existing = self.models.get(request.name)
            if existing is not None:
                if (existing.project, existing.base_model) != (request.project, request.base_model):
                    raise Conflict(
                        f"a model named {request.name!r} is already registered here "
                        f"(project {existing.project!r}, base model {existing.base_model!r})"
                    )
                return existing
            model = TrainableModel(
                name=request.name,
                project=request.project,
                base_model=request.base_model,
                config=request.config,
                _internal_config=request.chat_format(),
            )
            if len(self.models) >= self.settings.max_models:
                raise Conflict(
                    f"this server holds {len(self.models)} models, its limit: register "
                    "fewer, or raise it (art-core serve --max-models)"
                )
            failed = self._failed_loads.get(request.name)
            now = time.monotonic()
            if failed is not None and now < failed[0]:
                raise ModelUnavailable(failed[1], failed[0] - now)
            try:
                await self.backend.register(model)
            except BaseModelError as exc:  # the name itself: a bad request, nothing written
                raise FieldError("base_model", scrub_paths(str(exc))) from None
            except ValueError as exc:  # e.g. the folder holds another base model's checkpoints
                raise Conflict(scrub_paths(str(exc))) from None
            except Exception as exc:
                reason = (
                    f"model {request.project}/{request.name} failed to load: "
                    f"{type(exc).__name__}: {scrub_paths(str(exc))}; the server tries again "
                    f"{FAILED_LOAD_RETRY_S:.0f} s after the failure"
                )
                logger.warning("%s", reason, exc_info=True)
                self._failed_loads[request.name] = (now + FAILED_LOAD_RETRY_S, reason)
                raise ModelUnavailable(reason, FAILED_LOAD_RETRY_S) from None
            self._failed_loads.pop(request.name, None)
            self.models[model.name] = model
            self.registry.add(
                ModelRecord(
                    name=model.name,
                    project=model.project,
                    base_model=model.base_model,
                    config=model.config,
                    chat_format=request.chat_format(),
                )
            )
            return model

    async def model(self, project: str, name: str) -> TrainableModel:
        """A registered model, loading it again from the registry after a restart."""
        for value, what in ((project, "project name"), (name, "model name")):
            try:
                check_name(value, what)
            except ValueError as exc:
                raise FieldError("path." + what.split()[0], str(exc)) from None
        model = self.models.get(name)
        if model is None:
            record = self.registry.get(name)
            if record is None or record.project != project:
                raise NotFound(f"model {project}/{name} is not registered on this server")
            model = await self.register(
                RegisterRequest(
                    name=record.name,
                    project=record.project,
                    base_model=record.base_model,
                    config=record.config,
                    **record.chat_format,
                )
            )
        if model.project != project:
            raise NotFound(f"model {project}/{name} is not registered on this server")
        return model

    async def load_on_demand(self, name: str) -> None:
        """Load a registered-before model a gateway request names (after a restart)."""
        if name in self.models:
            return
        record = self.registry.get(name)
        if record is not None:
            await self.model(record.project, record.name)

    def vocab_size(self, model: TrainableModel) -> int:
        # The embedding may be larger than the tokenizer (padded vocabularies): allow both.
        return self.backend.served(model).chat.vocab_size

    def model_info(self, model: TrainableModel, step: int) -> dict[str, Any]:
        return {
            "name": model.name,
            "project": model.project,
            "base_model": model.base_model,
            "inference_model_name": model.name,
            "step": step,
        }

    # ------------------------------------------------------------------------------ training
    def lock(self, model: TrainableModel) -> asyncio.Lock:
        return self._model_locks[model.name]

    async def start_training(self, model: TrainableModel, request: TrainRequest) -> Job:
        """The job for ``request``: a new one running as its own task, or the existing job
        with the same id (a client retrying after a dropped connection)."""
        existing = self._existing_job(model, request.job_id)
        if existing is not None:
            return existing
        self.settings.train_limits.check(request.config)
        groups = to_groups(request.groups)
        check_calls(groups, self.vocab_size(model))
        return self._start_job(
            model,
            request.job_id,
            lambda on_progress, cancel: self.backend.train(
                model,
                groups,
                request.config,
                on_progress=on_progress,
                serve_while_training=request.serve_while_training,
                cancel=cancel,
            ),
        )

    async def start_sft(self, model: TrainableModel, request: TrainSFTRequest) -> Job:
        """As ``start_training``, for ``train_sft``: the demonstrations are checked first
        (a record that cannot be trained on is a 422 naming it); tokenizer-level problems
        (over the context) fail the job with the record's name, before anything is trained."""

        existing = self._existing_job(model, request.job_id)
        if existing is not None:
            return existing
        self.settings.train_limits.check(request.config)
        labels = request.labels
        if labels is not None and len(labels) != len(request.trajectories):
            raise FieldError(
                "labels",
                f"has {len(labels)} labels for {len(request.trajectories)} trajectories",
            )
        demos = [
            Demonstration(
                labels[i] if labels is not None else f"trajectories[{i}] (trajectory {t.id})",
                t,
            )
            for i, t in enumerate(request.trajectories)
        ]
        for index, demo in enumerate(demos):
            try:
                check_demonstration(demo, request.config.assistant_turns)
            except ValueError as exc:
                raise FieldError(f"trajectories.{index}", str(exc)) from None
        return self._start_job(
            model,
            request.job_id,
            lambda on_progress, cancel: self.backend.train_sft(
                model, demos, request.config, on_progress=on_progress, cancel=cancel
            ),
        )

    def _existing_job(self, model: TrainableModel, job_id: str | None) -> Job | None:
        """The job a retried request names (after a dropped connection), if it exists."""
        existing = self.jobs.get(job_id) if job_id else None
        if existing is not None and (existing.project, existing.model) != (
            model.project,
            model.name,
        ):
            raise Conflict(f"job {job_id!r} belongs to another model")
        return existing

    def _start_job(self, model: TrainableModel, job_id: str | None, train: TrainCall) -> Job:
        job = self.jobs.create(job_id or new_id("job"), project=model.project, model=model.name)
        # The task is referenced by the job (in the store), so it is never garbage-collected,
        # and it does not depend on the request: a client hanging up does not cancel it.
        job.task = asyncio.create_task(self._run(job, model, train))
        return job

    async def _run(self, job: Job, model: TrainableModel, train: TrainCall) -> None:
        loop = asyncio.get_running_loop()

        def on_progress(record: dict[str, Any]) -> None:
            loop.call_soon_threadsafe(job.emit, record)

        try:
            async with self.lock(model):
                step = await self.backend.get_step(model)
                if job.cancel.is_set():  # cancelled while it waited for the model
                    raise TrainingCancelled(f"cancelled before it started; still at step {step}")
                job.start(step)
                self.jobs.save(job)
                result = await train(on_progress, job.cancel)
            job.succeed(result.model_dump(mode="json"))
        except TrainingCancelled as exc:
            logger.info("training job %s cancelled: %s", job.id, exc)
            job.fail("TrainingCancelled", str(exc), status="cancelled")
        except asyncio.CancelledError:
            # The trainer thread may still finish the checkpoint: leave the job "running" on
            # disk, and the next start decides from the checkpoints (``reconcile_jobs``).
            raise
        except Exception as exc:
            logger.warning("training job %s failed: %s: %s", job.id, type(exc).__name__, exc)
            job.fail(type(exc).__name__, str(exc))
        finally:
            self.jobs.save(job)

    def reconcile_jobs(self) -> None:
        """After a restart: a job that was running either wrote its checkpoint (succeeded:
        the result is read back from it) or did not (interrupted: the model is still at its
        previous step, as checkpoints are renamed into place only once complete)."""
        for job in self.jobs.unfinished():
            latest = ModelFolder.of(self.path, job.project, job.model).latest_checkpoint()
            if (
                job.start_step is not None
                and latest is not None
                and latest[0] == job.start_step + 1
            ):
                metrics: dict[str, float] = {}
                state = latest[1] / "trainer_state.json"
                try:
                    raw = json.loads(state.read_text(encoding="utf-8")).get("metrics") or {}
                    metrics = {k: float(v) for k, v in raw.items() if isinstance(v, int | float)}
                except (OSError, json.JSONDecodeError, AttributeError):
                    pass
                job.succeed(
                    {"step": latest[0], "metrics": metrics, "checkpoint_path": str(latest[1])}
                )
            else:
                step = latest[0] if latest else 0
                job.fail(
                    "TrainingInterrupted",
                    f"the server stopped before this step finished; {job.project}/{job.model} "
                    f"is still at step {step}: train again",
                    status="interrupted",
                )
            self.jobs.save(job)

    async def export(self, model: TrainableModel, request: ExportRequest) -> ExportDownload:
        """Build the export ``request`` asks for and pack it as one tar; the caller streams
        ``download.archive``, then calls ``download.remove()``. One export builds at a time
        (each may load a base model into memory); the scratch folder lives under the art
        folder's ``.exports/``, removed on failure. The export is ``portable``: it names no
        path of this server. Before anything is written: a bad request (format, step,
        metric) raises ``ExportRefused``, and an export whose estimated scratch would pass
        ``max_export_scratch_bytes`` (with the exports in flight) raises ``ExportSpaceFull``.
        """

        folder = self.backend.model_folder(model)
        options: dict[str, Any] = {
            "format": request.format,
            "step": request.step,
            "best": request.best,
            "higher_is_better": request.higher_is_better,
            "art_path": self.backend.path,
            "gguf_type": request.gguf_type,
        }
        try:
            estimate = await asyncio.to_thread(estimate_export_bytes, folder, **options)
        except (ValueError, FileNotFoundError) as exc:
            raise ExportRefused(scrub_paths(str(exc))) from exc
        reservation = self.export_space.reserve(estimate)
        scratch: Path | None = None
        try:
            async with self._export_slot:
                scratch = self.path / ".exports" / new_id("export")
                scratch.mkdir(parents=True)
                try:
                    result = await asyncio.to_thread(
                        functools.partial(
                            export_checkpoint, folder, scratch / "export", portable=True, **options
                        )
                    )
                    archive = scratch / "export.tar"
                    size = await asyncio.to_thread(pack, result.path, archive)
                except (ValueError, FileNotFoundError) as exc:
                    raise ExportRefused(scrub_paths(str(exc))) from exc
                await asyncio.to_thread(shutil.rmtree, scratch / "export", True)
                reservation.resize(size)
                return ExportDownload(archive, scratch, size, reservation)
        except BaseException:
            if scratch is not None:
                await asyncio.to_thread(shutil.rmtree, scratch, True)
            reservation.release()
            raise

    async def delete_checkpoints(self, model: TrainableModel, metric: str) -> list[int]:
        async with self.lock(model):
            return await self.backend.delete_checkpoints(model, metric)

    async def cancel(self, job_id: str, wait_s: float = 60.0) -> Job | None:
        """Cancel a job (queued or running) and wait up to ``wait_s`` for it to end; the job
        (None: unknown). A running step stops within one micro-batch and writes nothing; the
        model serves its previous checkpoint again. A job already finished is left as it is.
        """
        job = self.jobs.get(job_id)
        if job is None:
            return None
        if not job.done:
            job.cancel.set()
            if job.task is not None:
                await asyncio.wait([job.task], timeout=wait_s)
        return job

    async def drain(self, timeout_s: float | None = None) -> int:
        """On a graceful stop: let the training jobs in progress finish for up to
        ``timeout_s`` (None: the settings' ``drain_timeout_s``), then cancel the rest and wait
        for them to stop (within a micro-batch). Returns how many jobs there were. Runs on
        the gateway's loop."""
        timeout_s = self.settings.drain_timeout_s if timeout_s is None else timeout_s
        jobs = [job for job in self.jobs.unfinished() if job.task is not None]
        tasks = [job.task for job in jobs if job.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout_s)
            if pending:
                logger.warning(
                    "cancelling %d training job(s) still running after %.0f s",
                    len(pending),
                    timeout_s,
                )
                for job in jobs:
                    job.cancel.set()
                await asyncio.wait(pending)
        return len(tasks)
