"""The HTTP front agents talk to: serves every wire API and records every call.

``Gateway`` is the shared ``serving.Serving`` (the served models, limits, rollouts' sampling
settings) with the routes of each API module mounted on a Starlette app, each route also
under ``/rollouts/{rollout_id}`` (which scopes the calls to one rollout):

- ``apis.chat``: ``POST /v1/chat/completions`` (``stream: true`` answers as SSE)
- ``apis.responses``: ``POST /v1/responses`` (OpenAI Responses)
- ``apis.messages``: ``POST /v1/messages`` and ``/v1/messages/count_tokens`` (Anthropic)
- ``apis.completions``: ``POST /v1/completions``
- ``apis.models``: ``GET /v1/models``, ``GET /health``, ``PUT /rollouts/{id}/sampling``

Every API takes the same path (ARCHITECTURE.md): body read and translated to the internal
chat request (``reading``), prepared (``requests``: prompt, grammar, limits), sampled and
recorded (``recording``, ``answering``), answered as JSON or through the one stream loop
with the API's own encoder (``answering.stream_answer``). Errors are ``errors.APIError``, in
OpenAI's shape (Anthropic's on its routes).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from art_core.gateway.apis import chat, completions, messages, models, responses
from art_core.gateway.body import DEFAULT_MAX_BODY_BYTES
from art_core.gateway.errors import APIError, http_exception_response, internal_error
from art_core.gateway.pacing import StreamPacing
from art_core.gateway.requests import DEFAULT_MAX_METADATA_BYTES
from art_core.gateway.routes import WireAPI, mounted
from art_core.gateway.serving import ROLLOUT_ID, ModelLoader, ServedModel, Serving

logger = logging.getLogger(__name__)

# The API modules a gateway mounts, in this order; a new API is one module and one entry.
WIRE_APIS: tuple[WireAPI, ...] = (models, chat, responses, messages, completions)

__all__ = ["ROLLOUT_ID", "WIRE_APIS", "Gateway", "ServedModel"]


class Gateway(Serving):
    """The served models (``Serving``) and the Starlette app that serves ``apis`` for them.

    Example:
        >>> gateway = Gateway()
        >>> gateway.add(served_model)  # fragment: a `ServedModel` (an engine, its tokenizer, a call store)  # doctest: +SKIP
        >>> app = gateway.app  # run with uvicorn
    """

    def __init__(
        self,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_metadata_bytes: int = DEFAULT_MAX_METADATA_BYTES,
        model_loader: ModelLoader | None = None,
        apis: Sequence[WireAPI] = WIRE_APIS,
        stream_pacing: StreamPacing | None = None,
    ) -> None:
        super().__init__(
            max_body_bytes=max_body_bytes,
            max_metadata_bytes=max_metadata_bytes,
            model_loader=model_loader,
            stream_pacing=stream_pacing,
        )
        self.routes = mounted(self, apis)
        # Routes answer their own errors (``routes.answered``); these handlers are the last
        # resort for errors raised outside them. APIError has its own: one registered only
        # for Exception re-raises after answering, which makes uvicorn log an error and
        # close the keep-alive connection. Starlette's own 404 / 405 (no route, a method
        # not routed) answer in the same JSON shape (Anthropic's under a Messages route).
        self.app = Starlette(
            routes=self.routes,
            exception_handlers={
                HTTPException: http_exception_response,
                APIError: on_api_error,
                Exception: on_internal_error,
            },
        )


async def on_api_error(request: Request, exc: Exception) -> Response:
    """Starlette's handler of an ``APIError`` raised outside a route."""
    return exc.response() if isinstance(exc, APIError) else await on_internal_error(request, exc)


async def on_internal_error(request: Request, exc: Exception) -> Response:
    """Starlette's handler of anything else raised outside a route: a 500, logged."""
    logger.exception("internal error on %s", request.url.path)
    return internal_error(exc).response()
