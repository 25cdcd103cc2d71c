"""The HTTP front agents talk to: serves four wire APIs and records every call.

Routes (each also under ``/rollouts/{rollout_id}``, which scopes the calls to one rollout):
``GET /v1/models``, ``POST /v1/chat/completions`` (``stream: true`` answers as SSE), and
the other wire APIs, one module each under ``apis``: ``POST /v1/responses`` (OpenAI
Responses), ``POST /v1/messages`` and ``/v1/messages/count_tokens`` (Anthropic Messages),
``POST /v1/completions``; plus ``GET /health`` and ``PUT /rollouts/{rollout_id}/sampling``
(the rollout's own sampling settings, ``rollout_sampling``). A chat request goes: body
(``body``) -> validated and translated to token ids (``requests``) -> sampled and recorded
(``recording``) -> answered as JSON (``responses``) or SSE (``streaming``); the other APIs
translate their request to a chat request at their edge and their answer back. Errors are
``errors.APIError``, in OpenAI's shape (Anthropic's on its routes).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from art_core.engines.base import Engine, EngineError
from art_core.engines.tokenizer import ChatTokenizer
from art_core.gateway.apis import completions as completions_api
from art_core.gateway.apis import messages as messages_api
from art_core.gateway.apis import responses as responses_api
from art_core.gateway.body import DEFAULT_MAX_BODY_BYTES, parse_json_object, read_body
from art_core.gateway.errors import (
    APIError,
    engine_error,
    http_exception_response,
    internal_error,
    scrub_paths,
    validation_message,
)
from art_core.gateway.prompts import PromptBuilder
from art_core.gateway.recording import sample_and_record
from art_core.gateway.requests import DEFAULT_MAX_METADATA_BYTES, prepare_call, read_request
from art_core.gateway.responses import ResponseShaper, completion_response
from art_core.gateway.rollout_sampling import RolloutSampling, RolloutSamplingStore
from art_core.gateway.schemas import SchemaChecks
from art_core.gateway.store import CallStore
from art_core.gateway.streaming import stream_completion
from art_core.gateway.timing import StageClock, StageLog

logger = logging.getLogger(__name__)
ROLLOUT_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
ADAPTER_STEP = re.compile(r"[0-9]{1,9}")  # ASCII digits only: str.isdigit() accepts '²'
# Called with a model name the gateway does not serve, before answering 404: a service
# loads models registered before a restart this way.
ModelLoader = Callable[[str], Awaitable[None]]


@dataclass
class ServedModel:
    """A model the gateway serves: its engine, its chat tokenizer and its call record."""

    name: str
    engine: Engine
    store: CallStore
    chat: ChatTokenizer
    default_max_tokens: int = 1024
    prompts: PromptBuilder = field(init=False)

    def __post_init__(self) -> None:
        self.prompts = PromptBuilder(
            self.chat.tokenizer, self.chat.eos_token_ids, chat_format=self.chat.format
        )

    @property
    def tokenizer(self) -> Any:
        return self.chat.tokenizer


class Gateway:
    """Holds the served models and builds the Starlette app.

    Example:
        >>> gateway = Gateway()
        >>> gateway.add(served_model)  # doctest: +SKIP
        >>> app = gateway.app  # run with uvicorn
    """

    def __init__(
        self,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_metadata_bytes: int = DEFAULT_MAX_METADATA_BYTES,
        model_loader: ModelLoader | None = None,
    ) -> None:
        self.models: dict[str, ServedModel] = {}
        self.max_body_bytes = max_body_bytes
        self.max_metadata_bytes = max_metadata_bytes
        # JSON Schemas that passed the (slow) check, by content: agents resend the same tools.
        self.schema_checks = SchemaChecks()
        self.model_loader = model_loader
        # Set to a StageLog to record where each request's time goes (the benchmark does).
        self.stage_log: StageLog | None = None
        # Request fields accepted and left out of the prompt, by API, each logged once.
        self.ignored_fields_logged: set[tuple[str, str]] = set()
        self.responses = responses_api.ResponseStore()
        # Each rollout's own sampling settings (``PUT /rollouts/{id}/sampling``), applied to
        # its calls by ``prepare_call``; held here rather than per model: a rollout may call
        # any model, and the settings may come before its first call names one.
        self.rollout_sampling = RolloutSamplingStore()
        self.routes = []
        for prefix in ("", "/rollouts/{rollout_id}"):
            self.routes += [
                Route(f"{prefix}/v1/models", answered(self.list_models), methods=["GET"]),
                Route(
                    f"{prefix}/v1/models/{{model_id:path}}",
                    answered(self.get_model),
                    methods=["GET"],
                ),
                Route(
                    f"{prefix}/v1/chat/completions",
                    answered(self.chat_completions),
                    methods=["POST"],
                ),
                Route(
                    f"{prefix}/v1/responses",
                    answered(self.bound(responses_api.create)),
                    methods=["POST"],
                ),
                Route(
                    f"{prefix}/v1/messages",
                    answered(self.bound(messages_api.create), messages_api.error_response),
                    methods=["POST"],
                ),
                Route(
                    f"{prefix}/v1/messages/count_tokens",
                    answered(self.bound(messages_api.count_tokens), messages_api.error_response),
                    methods=["POST"],
                ),
                Route(
                    f"{prefix}/v1/completions",
                    answered(self.bound(completions_api.create)),
                    methods=["POST"],
                ),
            ]
        self.routes.append(Route("/health", answered(self.health), methods=["GET"]))
        self.routes.append(
            Route(
                "/rollouts/{rollout_id}/sampling",
                answered(self.set_rollout_sampling),
                methods=["PUT"],
            )
        )
        # Routes answer their own errors (``answered``); these handlers are the last resort
        # for errors raised outside them. APIError has its own: one registered only for
        # Exception re-raises after answering, which makes uvicorn log an error and close the
        # keep-alive connection. Starlette's own 404 / 405 (no route, a method not routed)
        # answer in the same JSON shape (Anthropic's under a Messages route).
        self.app = Starlette(
            routes=self.routes,
            exception_handlers={
                HTTPException: http_exception_response,
                APIError: self.on_api_error,
                Exception: self.on_internal_error,
            },
        )

    def add(self, served: ServedModel) -> None:
        self.models[served.name] = served
        # A rollout released (its calls handed to the trainer) is over: its settings go too.
        if self.rollout_sampling.discard not in served.store.release_listeners:
            served.store.release_listeners.append(self.rollout_sampling.discard)

    def bound(self, handler: Callable[[Gateway, Request], Awaitable[Response]]) -> Endpoint:
        """An API module's ``handler(gateway, request)`` as this gateway's endpoint."""

        async def endpoint(request: Request) -> Response:
            return await handler(self, request)

        endpoint.__name__ = getattr(handler, "__name__", "endpoint")
        return endpoint

    @staticmethod
    async def on_api_error(request: Request, exc: Exception) -> Response:
        return (
            exc.response()
            if isinstance(exc, APIError)
            else await Gateway.on_internal_error(request, exc)
        )

    @staticmethod
    async def on_internal_error(request: Request, exc: Exception) -> Response:
        logger.exception("internal error on %s", request.url.path)
        return internal_error(exc).response()

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "models": sorted(self.models)})

    async def set_rollout_sampling(self, request: Request) -> Response:
        """``PUT /rollouts/{rollout_id}/sampling``: set (replace) the sampling settings of
        every later call of the rollout, in every wire API (``rollout_sampling``); a body
        whose settings are all null (``{}``) removes them. The rollout need not have called
        yet. Answers ``{"rollout_id", "sampling"}``; 400 naming the field for a bad body.

        Example:
            >>> httpx.put(f"{root}/rollouts/r1/sampling", json={"seed": 7, "temperature": 1.0})  # doctest: +SKIP
        """
        rollout = rollout_id(request)
        assert rollout is not None  # the route's path has it
        payload = parse_json_object(await read_body(request, self.max_body_bytes))
        try:
            sampling = RolloutSampling.model_validate(payload)
        except ValidationError as exc:
            message, param = validation_message(exc)
            raise APIError(400, message, param=param) from None
        self.rollout_sampling.set(rollout, sampling)
        return JSONResponse(
            {
                "rollout_id": rollout,
                "sampling": None if sampling.is_empty else sampling.model_dump(),
            }
        )

    def model_ids(self) -> list[str]:
        """Every name a request may use: ``NAME`` and ``NAME@STEP`` of each loaded adapter."""
        ids = []
        for served in self.models.values():
            ids += [served.name] + [f"{served.name}@{a.step}" for a in served.engine.adapters()]
        return ids

    async def list_models(self, request: Request) -> Response:
        rollout_id(request)
        return JSONResponse({"object": "list", "data": [_model_card(n) for n in self.model_ids()]})

    async def get_model(self, request: Request) -> Response:
        """``GET /v1/models/{id}`` (``client.models.retrieve``): the model, or 404."""
        rollout_id(request)
        model_id = str(request.path_params["model_id"])
        await self.resolve(model_id)  # 404 unless served (loading a known one on demand)
        return JSONResponse(_model_card(model_id))

    async def resolve(self, name: str) -> tuple[ServedModel, str | None]:
        """The served model a request names (``NAME`` or ``NAME@STEP``) and the adapter."""
        base, _, step = name.partition("@")
        if base not in self.models and self.model_loader is not None:
            try:
                await self.model_loader(base)
            except LookupError:
                pass  # not a model of this server: the 404 below
            except Exception as exc:
                # A model known here that cannot be loaded: say why (503), not "no such
                # model"; the loader keeps the failure for a while, so retries are cheap.
                logger.warning("could not load model %r on demand: %s", base, exc)
                raise APIError(
                    503,
                    scrub_paths(str(exc)),
                    type="server_error",
                    param="model",
                    code="model_unavailable",
                ) from None
        served = self.models.get(base)
        if served is None:
            raise APIError(
                404,
                f"model {name!r} does not exist; served: {sorted(self.models)}",
                type="not_found_error",
                param="model",
                code="model_not_found",
            )
        if not step:
            return served, None
        adapter = served.engine.adapter(int(step)) if ADAPTER_STEP.fullmatch(step) else None
        if adapter is None:
            raise APIError(
                404,
                f"no adapter of step {step!r} is loaded for {base!r}",
                type="not_found_error",
                param="model",
                code="model_not_found",
            )
        return served, adapter.name

    async def chat_completions(self, request: Request) -> Response:
        clock = StageClock() if self.stage_log is not None else None
        rollout = rollout_id(request)
        raw = await read_body(request, self.max_body_bytes)
        parsed = await read_request(
            raw,
            request.headers.get("x-art-metadata"),
            schema_checks=self.schema_checks,
            max_metadata_bytes=self.max_metadata_bytes,
        )
        if clock:
            clock.mark("parse")
        served, adapter = await self.resolve(parsed.chat.model)
        call = await prepare_call(
            served,
            adapter,
            parsed,
            rollout_id=rollout,
            sampling=self.rollout_sampling.get(rollout),
        )
        if parsed.chat.stream:
            return StreamingResponse(
                stream_completion(call),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        if clock:
            clock.mark("prepare")
            call.clock = clock
        shaper = ResponseShaper(call)
        # Shielded: a client that hangs up does not cancel the sampling or the recording.
        task = asyncio.ensure_future(sample_and_record(call))
        try:
            calls = await asyncio.shield(task)
        except EngineError as exc:
            raise engine_error(exc) from None
        response = completion_response(shaper.completion(calls))
        if clock and self.stage_log is not None:
            clock.mark("respond")
            self.stage_log.add(clock)
        return response


Endpoint = Callable[[Request], Awaitable[Response]]


def _openai_error(error: APIError) -> Response:
    return error.response()


def answered(
    endpoint: Endpoint, error_response: Callable[[APIError], Response] = _openai_error
) -> Endpoint:
    """``endpoint`` answering its own errors: ``APIError`` as itself, anything else as a 500
    (logged, without paths), each in the API's error shape (``error_response``; OpenAI's by
    default). Returning the answer, rather than letting Starlette's error middleware send it
    and re-raise, keeps the client's keep-alive connection open.

    Example:
        >>> Route("/health", answered(gateway.health))  # doctest: +SKIP
    """

    async def guarded(request: Request) -> Response:
        try:
            return await endpoint(request)
        except APIError as exc:
            return error_response(exc)
        except Exception as exc:
            logger.exception("internal error on %s", request.url.path)
            return error_response(internal_error(exc))

    guarded.__name__ = getattr(endpoint, "__name__", "endpoint")
    return guarded


def _model_card(model_id: str) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": 0, "owned_by": "art"}


def rollout_id(request: Request) -> str | None:
    """The request's rollout id (``/rollouts/{id}/v1/...``), validated; None on plain ``/v1``."""
    value = request.path_params.get("rollout_id")
    if value is not None and not ROLLOUT_ID.fullmatch(value):
        raise APIError(
            400,
            "rollout ids are 1-128 letters, digits, '_', '-', '.' or ':'",
            param="rollout_id",
        )
    return value
