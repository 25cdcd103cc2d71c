"""Training jobs: a step runs as a server-side task, independent of the request that asked.

A job records its progress as numbered events; any number of clients follow them (the
request that started the job, or a client reattaching after its connection dropped), from
any position. Each job's status and outcome is persisted to
``{art_path}/.server/jobs/{id}.json``, so a client can read the result even after a restart.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

from art_core.files import atomic_write_text

logger = logging.getLogger(__name__)

JOB_ID = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
JobStatus = Literal["queued", "running", "succeeded", "failed", "interrupted", "cancelled"]
TERMINAL: frozenset[str] = frozenset({"succeeded", "failed", "interrupted", "cancelled"})
TERMINAL_EVENTS = frozenset({"result", "error"})


def json_safe(value: Any) -> Any:
    """``value`` with NaN/inf floats replaced by None, so it is strict JSON.

    Example:
        >>> json_safe({"loss": float("nan"), "n": [1, 2.5]})
        {'loss': None, 'n': [1, 2.5]}
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if value is None or isinstance(value, str | int | bool):
        return value
    return str(value)


class Job:
    """One training request: status, progress events and outcome.

    Only touched on the server's event loop (the trainer thread reaches it through
    ``loop.call_soon_threadsafe``).

    Example:
        >>> job = Job("job_1", project="p", model="m")
        >>> job.emit({"event": "micro_batch", "loss": 0.1})["seq"]
        1
    """

    def __init__(
        self,
        job_id: str,
        *,
        project: str,
        model: str,
        status: JobStatus = "queued",
        created_at: float | None = None,
    ) -> None:
        self.id = job_id
        self.project = project
        self.model = model
        self.status: JobStatus = status
        self.start_step: int | None = None
        self.result: dict[str, Any] | None = None
        self.error: dict[str, str] | None = None
        self.created_at = time.time() if created_at is None else created_at
        self.finished_at: float | None = None
        self.events: list[dict[str, Any]] = []
        self._changed = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        # Set to cancel: the trainer thread stops before its next forward pass.
        self.cancel = threading.Event()
        self.emit({"event": "job", "job_id": job_id, "project": project, "model": model})

    @property
    def done(self) -> bool:
        return self.status in TERMINAL

    def emit(self, record: dict[str, Any]) -> dict[str, Any]:
        """Append an event (numbered ``seq``, stamped ``time``) and wake the followers."""
        event = {**json_safe(record), "seq": len(self.events), "time": time.time()}
        self.events.append(event)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        return event

    def start(self, step: int) -> None:
        self.status, self.start_step = "running", step
        self.emit({"event": "started", "step": step})

    def succeed(self, result: dict[str, Any]) -> None:
        self.status, self.result, self.finished_at = "succeeded", json_safe(result), time.time()
        self.emit(self.terminal_event())

    def fail(self, kind: str, message: str, *, status: JobStatus = "failed") -> None:
        self.status, self.finished_at = status, time.time()
        self.error = {"type": kind, "message": message}
        self.emit(self.terminal_event())

    def terminal_event(self) -> dict[str, Any]:
        if self.status == "succeeded":
            return {"event": "result", "job_id": self.id, "result": self.result}
        return {"event": "error", "job_id": self.id, "status": self.status, "error": self.error}

    async def follow(
        self, after: int = 0, heartbeat_s: float = 10.0
    ) -> AsyncIterator[dict[str, Any] | None]:
        """Events from ``seq >= after``, live, until the outcome; None = nothing new lately.

        A job loaded from disk has no progress events left; its outcome is still delivered.
        """
        position = max(after, 0)
        while True:
            while position < len(self.events):
                event = self.events[position]
                position += 1
                yield event
                if event["event"] in TERMINAL_EVENTS:
                    return
            if self.done:
                yield {**self.terminal_event(), "seq": len(self.events), "time": time.time()}
                return
            waiter = self._changed
            try:
                await asyncio.wait_for(waiter.wait(), heartbeat_s)
            except TimeoutError:
                yield None

    def summary(self) -> dict[str, Any]:
        """The persisted (and ``GET /api/jobs/{id}``) view of the job."""
        return {
            "job_id": self.id,
            "project": self.project,
            "model": self.model,
            "status": self.status,
            "start_step": self.start_step,
            "result": self.result,
            "error": self.error,
            "created_at": self.created_at,
            "finished_at": self.finished_at,
            "num_events": len(self.events),
        }

    @classmethod
    def from_summary(cls, data: dict[str, Any]) -> Job:
        job = cls(
            str(data["job_id"]),
            project=str(data["project"]),
            model=str(data["model"]),
            status=data.get("status", "interrupted"),
            created_at=float(data.get("created_at") or time.time()),
        )
        job.events.clear()  # progress events are not persisted
        job.start_step = data.get("start_step")
        job.result = data.get("result")
        job.error = data.get("error")
        job.finished_at = data.get("finished_at")
        return job


class JobStore:
    """Jobs by id: in memory while the server runs, summaries on disk across restarts.

    Example:
        >>> store = JobStore(Path(".art"))
        >>> job = store.create("job_1", project="p", model="m")
        >>> store.get("job_1") is job
        True
    """

    def __init__(self, art_path: Path, *, keep: int = 500) -> None:
        self.folder = Path(art_path) / ".server" / "jobs"
        self.keep = keep
        self._jobs: dict[str, Job] = {}
        if self.folder.is_dir():
            for file in sorted(self.folder.glob("*.json"), key=lambda p: p.stat().st_mtime):
                try:
                    job = Job.from_summary(json.loads(file.read_text(encoding="utf-8")))
                except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                    logger.warning("ignoring the unreadable job file %s: %s", file, exc)
                    continue
                self._jobs[job.id] = job

    def get(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    def unfinished(self) -> list[Job]:
        return [job for job in self._jobs.values() if not job.done]

    def create(self, job_id: str, *, project: str, model: str) -> Job:
        if not JOB_ID.fullmatch(job_id):
            raise ValueError("job ids are 1-80 letters, digits, '_' or '-'")
        job = Job(job_id, project=project, model=model)
        self._jobs[job_id] = job
        self.save(job)
        self._prune()
        return job

    def save(self, job: Job) -> None:
        atomic_write_text(self.folder / f"{job.id}.json", json.dumps(job.summary(), indent=2))

    def _prune(self) -> None:
        finished = [j for j in self._jobs.values() if j.done]
        for job in sorted(finished, key=lambda j: j.created_at)[
            : max(0, len(self._jobs) - self.keep)
        ]:
            del self._jobs[job.id]
            (self.folder / f"{job.id}.json").unlink(missing_ok=True)
