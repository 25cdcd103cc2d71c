"""The backend API under ``/api``: what ``RemoteBackend`` calls.

``POST /api/models/register``; per model (``/api/models/{project}/{name}``): ``GET``,
``GET /step``, ``POST /train`` (NDJSON progress, then the result), ``POST /train_sft`` (the
same, for supervised epochs on demonstrations), ``POST /log``,
``POST /delete_checkpoints``, ``POST /export`` (the export as one tar), ``GET /rollouts/{id}/calls``, ``POST /rollouts/{id}/release``;
``GET /api/jobs/{id}`` and ``GET /api/jobs/{id}/events?after=N`` (reattach to a job's stream);
``GET /api/info``. Errors use the gateway's ``{"error": {...}}`` shape; 422 names the field.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from art_core.gateway.body import parse_json_object
from art_core.gateway.errors import APIError, error_body, json_response
from art_core.gateway.requests import INLINE_BODY_BYTES
from art_core.gateway.serving import ROLLOUT_ID
from art_core.names import check_name
from art_core.server.errors import validation_body
from art_core.server.export_space import ExportSpaceFull
from art_core.server.jobs import Job
from art_core.server.schemas import (
    DeleteCheckpointsRequest,
    ExportRequest,
    FieldError,
    LogRequest,
    RegisterRequest,
    TrainRequest,
    TrainSFTRequest,
    to_groups,
)
from art_core.server.service import (
    Conflict,
    ExportDownload,
    ExportRefused,
    ModelUnavailable,
    NotFound,
    Service,
)
from art_core.trajectories import LLMCall

logger = logging.getLogger(__name__)
Handler = Callable[[Request], Awaitable[Response]]
NDJSON = "application/x-ndjson"
MODEL = "/api/models/{project}/{name}"
# An export is streamed in pieces of this size.
EXPORT_CHUNK_BYTES = 1 << 20


class BadRequest(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


def _errors(handler: Handler) -> Handler:
    """Map every expected failure to a 4xx with a clear body; anything else is a bug (500)."""

    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except ValidationError as exc:
            return json_response(validation_body(exc), 422)
        except FieldError as exc:
            body = error_body(
                f"invalid request: {exc.field}: {exc.message}",
                type="invalid_request_error",
                param=exc.field,
                code="validation_error",
            )
            body["detail"] = [{"field": exc.field, "message": exc.message}]
            return json_response(body, 422)
        except BadRequest as exc:
            return json_response(
                error_body(exc.message, type="invalid_request_error", param=exc.param), exc.status
            )
        except NotFound as exc:
            return json_response(error_body(str(exc), type="not_found_error"), 404)
        except ExportRefused as exc:
            return json_response(error_body(str(exc), type="invalid_request_error"), 400)
        except Conflict as exc:
            return json_response(error_body(str(exc), type="conflict_error"), 409)
        except ExportSpaceFull as exc:
            response = json_response(
                error_body(str(exc), type="server_error", code="export_space_full"), 503
            )
            if exc.retry_after_s is not None:
                response.headers["Retry-After"] = str(exc.retry_after_s)
            return response
        except ModelUnavailable as exc:
            response = json_response(
                error_body(str(exc), type="server_error", code="model_unavailable"), 503
            )
            response.headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
            return response

    return wrapped


async def _json_body(request: Request) -> dict[str, Any]:
    """The body as a JSON object, read by the gateway's bounded parser (nesting and text
    checked: deep JSON is a 400, never a ``RecursionError``); large bodies parse off the
    event loop."""
    raw = await request.body()
    if not raw:
        return {}
    try:
        if len(raw) > INLINE_BODY_BYTES:
            return await asyncio.to_thread(parse_json_object, raw)
        return parse_json_object(raw)
    except APIError as exc:
        raise BadRequest(exc.status, exc.message) from None


def _rollout_id(request: Request) -> str:
    rollout_id = str(request.path_params["rollout_id"])
    if not ROLLOUT_ID.fullmatch(rollout_id):
        raise FieldError(
            "path.rollout_id", "rollout ids are 1-128 letters, digits, '_', '-', '.' or ':'"
        )
    return rollout_id


def _model_path(request: Request) -> None:
    """The project and model names of the path, checked (422 naming the one that is bad)."""
    for key in ("project", "name"):
        try:
            check_name(str(request.path_params[key]), f"{key} name")
        except ValueError as exc:
            raise FieldError(f"path.{key}", str(exc)) from None


def _after(request: Request) -> int:
    raw = request.query_params.get("after", "0")
    # isdigit() alone accepts "²" and other non-ASCII digits that int() rejects.
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 9:
        raise FieldError("query.after", "must be a non-negative integer")
    return int(raw)


def _calls_json(calls: list[LLMCall]) -> dict[str, Any]:
    return {"calls": [call.model_dump(mode="json") for call in calls]}


class ServiceAPI:
    """Starlette routes over a ``Service``.

    Example:
        >>> routes = ServiceAPI(service).routes  # fragment: a `Service` over a backend  # doctest: +SKIP
    """

    def __init__(self, service: Service, *, heartbeat_s: float = 10.0) -> None:
        self.service = service
        self.heartbeat_s = heartbeat_s
        self.routes = [
            Route("/api/info", _errors(self.info), methods=["GET"]),
            Route("/api/models/register", _errors(self.register), methods=["POST"]),
            Route(MODEL, _errors(self.get_model), methods=["GET"]),
            Route(f"{MODEL}/step", _errors(self.step), methods=["GET"]),
            Route(f"{MODEL}/train", _errors(self.train), methods=["POST"]),
            Route(f"{MODEL}/train_sft", _errors(self.train_sft), methods=["POST"]),
            Route(f"{MODEL}/log", _errors(self.log), methods=["POST"]),
            Route(f"{MODEL}/export", _errors(self.export), methods=["POST"]),
            Route(
                f"{MODEL}/delete_checkpoints", _errors(self.delete_checkpoints), methods=["POST"]
            ),
            Route(f"{MODEL}/rollouts/{{rollout_id}}/calls", _errors(self.calls), methods=["GET"]),
            Route(
                f"{MODEL}/rollouts/{{rollout_id}}/release", _errors(self.release), methods=["POST"]
            ),
            Route("/api/jobs/{job_id}", _errors(self.job), methods=["GET"]),
            Route("/api/jobs/{job_id}", _errors(self.cancel_job), methods=["DELETE"]),
            Route("/api/jobs/{job_id}/events", _errors(self.job_events), methods=["GET"]),
        ]

    async def _model(self, request: Request) -> Any:
        return await self.service.model(
            str(request.path_params["project"]), str(request.path_params["name"])
        )

    # ------------------------------------------------------------------------------ models
    async def info(self, request: Request) -> Response:
        return json_response(
            {
                "service": "art-core",
                "models": self.service.registry.names(),
                "loaded": sorted(self.service.models),
                "auth": self.service.settings.token is not None,
            }
        )

    async def register(self, request: Request) -> Response:
        body = RegisterRequest.model_validate(await _json_body(request))
        model = await self.service.register(body)
        step = await self.service.backend.get_step(model)
        return json_response(self.service.model_info(model, step))

    async def get_model(self, request: Request) -> Response:
        model = await self._model(request)
        step = await self.service.backend.get_step(model)
        return json_response(self.service.model_info(model, step))

    async def step(self, request: Request) -> Response:
        model = await self._model(request)
        return json_response({"step": await self.service.backend.get_step(model)})

    async def log(self, request: Request) -> Response:
        _model_path(request)
        body = LogRequest.model_validate(await _json_body(request))
        model = await self._model(request)
        groups = to_groups(body.groups)
        await self.service.backend.log(
            model, groups, split=body.split, metrics=body.metrics, step=body.step
        )
        return json_response({"logged": sum(len(g.trajectories) for g in groups)})

    async def delete_checkpoints(self, request: Request) -> Response:
        _model_path(request)
        body = DeleteCheckpointsRequest.model_validate(await _json_body(request))
        model = await self._model(request)
        deleted = await self.service.delete_checkpoints(model, body.best_checkpoint_metric)
        return json_response({"deleted": deleted})

    async def export(self, request: Request) -> Response:
        """Build the export on this server and send it as one tar (``application/x-tar``,
        with its length); the scratch copy is removed once sent, once the client went away,
        or once a piece of it waited ``export_send_timeout_s`` for the client (cut)."""
        _model_path(request)
        body = ExportRequest.model_validate(await _json_body(request))
        model = await self._model(request)
        download = await self.service.export(model, body)
        try:
            return _ExportResponse(download, self.service.settings.export_send_timeout_s)
        except BaseException:
            await download.remove()
            raise

    async def calls(self, request: Request) -> Response:
        _model_path(request)
        rollout_id = _rollout_id(request)
        model = await self._model(request)
        calls = await self.service.backend.rollout_calls(model, rollout_id, release=False)
        return json_response(_calls_json(calls))

    async def release(self, request: Request) -> Response:
        _model_path(request)
        rollout_id = _rollout_id(request)
        await _json_body(request)  # takes no fields, but a body it is sent must be JSON
        model = await self._model(request)
        calls = await self.service.backend.rollout_calls(model, rollout_id, release=True)
        if not calls:
            # Released already (a retried request) or served before a restart: the calls
            # are on disk, written as they completed.
            store = self.service.backend.store(model)
            calls = await asyncio.to_thread(store.load_rollout, rollout_id)
        return json_response(_calls_json(calls))

    # ------------------------------------------------------------------------------ training
    # Every handler checks its whole request (path, query, body) before it acts: a request
    # answered 4xx has started no job and changed nothing.
    async def train(self, request: Request) -> Response:
        after = _after(request)
        _model_path(request)
        body = TrainRequest.model_validate(await _json_body(request))
        model = await self._model(request)
        job = await self.service.start_training(model, body)
        return self._stream(job, after)

    async def train_sft(self, request: Request) -> Response:
        after = _after(request)
        _model_path(request)
        body = TrainSFTRequest.model_validate(await _json_body(request))
        model = await self._model(request)
        job = await self.service.start_sft(model, body)
        return self._stream(job, after)

    async def job(self, request: Request) -> Response:
        return json_response(self._job(request).summary())

    async def cancel_job(self, request: Request) -> Response:
        """Cancel a queued or running job; answers once it has ended (its summary: status
        ``cancelled``, or the outcome it reached first), or after ``?wait=`` seconds (default
        60, at most 600) with the job still ``running`` (it stops within a micro-batch)."""
        job = self._job(request)
        raw = request.query_params.get("wait", "60")
        try:
            wait_s = float(raw)
        except ValueError:
            wait_s = -1.0
        if not 0 <= wait_s <= 600:
            raise FieldError("query.wait", "must be a number of seconds from 0 to 600")
        await self.service.cancel(job.id, wait_s)
        return json_response(job.summary())

    async def job_events(self, request: Request) -> Response:
        return self._stream(self._job(request), _after(request))

    def _job(self, request: Request) -> Job:
        job_id = str(request.path_params["job_id"])
        job = self.service.jobs.get(job_id)
        if job is None:
            raise NotFound(f"no job {job_id!r} on this server")
        return job

    def _stream(self, job: Job, after: int) -> Response:
        async def lines() -> AsyncIterator[bytes]:
            # Cancelled when the client hangs up; the job's own task is not.
            async for event in job.follow(after, self.heartbeat_s):
                record = event if event is not None else {"event": "heartbeat"}
                yield (json.dumps(record) + "\n").encode()

        return StreamingResponse(
            lines(),
            media_type=NDJSON,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "X-Job-Id": job.id},
        )


class _SendStalled(Exception):
    """A piece of a response waited too long for the client (not an ``OSError``: Starlette
    takes those for a client that went away)."""


class _ExportResponse(StreamingResponse):
    """An export's tar, streamed in ``EXPORT_CHUNK_BYTES`` pieces, each of which the client
    must take within ``send_timeout_s``: a stalled reader is cut (the connection is closed)
    instead of holding the scratch copy for as long as it likes. However the response ends
    (sent, failed, cut, or the client gone before the body started, when a generator's own
    ``finally`` never runs), the file is closed and the scratch folder removed at once; sent
    whole, the folder goes before the last chunk does."""

    def __init__(self, download: ExportDownload, send_timeout_s: float) -> None:
        self.download = download
        self.send_timeout_s = send_timeout_s
        self.chunks = self._chunks()
        super().__init__(
            self.chunks,
            media_type="application/x-tar",
            headers={"content-length": str(download.size)},
        )

    async def _chunks(self) -> AsyncGenerator[bytes, None]:
        with self.download.archive.open("rb") as file:
            chunk = await asyncio.to_thread(file.read, EXPORT_CHUNK_BYTES)
            while following := await asyncio.to_thread(file.read, EXPORT_CHUNK_BYTES):
                yield chunk
                chunk = following
        # The last chunk is read: the scratch folder goes before it is sent, so a client
        # that has the whole tar (its content-length) never finds the copy still on disk.
        await self.download.remove()
        if chunk:
            yield chunk

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def send_in_time(message: Any) -> None:
            try:
                with anyio.fail_after(self.send_timeout_s):
                    await send(message)
            except TimeoutError:
                raise _SendStalled from None

        try:
            await super().__call__(scope, receive, send_in_time)
        except _SendStalled:
            # Returning with the response unfinished makes the server close the connection.
            client = scope.get("client") or ("?", 0)
            logger.warning(
                "export download to %s:%s cut: the client took no data for %.0f s",
                client[0],
                client[1],
                self.send_timeout_s,
            )
        finally:
            await self.chunks.aclose()  # closes the file: its disk is freed with the folder
            await self.download.remove()
