"""The service's ASGI app: the gateway's OpenAI routes and the backend API on one port.

Middleware, outermost first: CORS (only when origins are configured), bearer auth (when a
token is set), body size limit, backpressure on chat completions, on-demand loading of
models registered before a restart; then ``/api/...`` goes to the API and everything else
(``/v1/...``, ``/rollouts/{id}/v1/...``, ``/health``) to the gateway.
"""

from __future__ import annotations

import json
import logging

from starlette.applications import Starlette
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from art_core.gateway.app import APIError
from art_core.model import NAME_PATTERN
from art_core.server.api import ServiceAPI, json_response
from art_core.server.auth import BearerAuth
from art_core.server.errors import error_body
from art_core.server.limits import BODY_SCOPE_KEY, Backpressure, BodyLimit
from art_core.server.service import Service

logger = logging.getLogger(__name__)


class _Dispatch:
    """``/api`` to the backend API, the rest to the gateway."""

    def __init__(self, api: ASGIApp, gateway: ASGIApp) -> None:
        self.api, self.gateway = api, gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and (path == "/api" or path.startswith("/api/")):
            await self.api(scope, receive, send)
        else:
            await self.gateway(scope, receive, send)


class _LoadOnDemand:
    """Before a chat completion, load its model if it was registered before a restart, so a
    client's rollouts keep working without registering again."""

    def __init__(self, app: ASGIApp, service: Service) -> None:
        self.app, self.service = app, service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].endswith("/chat/completions"):
            name = _requested_model(scope.get(BODY_SCOPE_KEY, b""))
            if name is not None and name not in self.service.models:
                try:
                    await self.service.load_on_demand(name)
                except Exception as exc:  # the gateway then answers 404 for the model
                    logger.warning("could not load model %r on demand: %s", name, exc)
        await self.app(scope, receive, send)


def _requested_model(body: bytes) -> str | None:
    try:
        payload = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    model = payload.get("model") if isinstance(payload, dict) else None
    if not isinstance(model, str):
        return None
    name = model.partition("@")[0]
    return name if NAME_PATTERN.match(name) and ".." not in name else None


async def _gateway_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return exc.response()


async def _internal_error(request: Request, exc: Exception) -> Response:
    logger.exception("internal error on %s", request.url.path)
    return json_response(
        error_body(f"internal error: {type(exc).__name__}: {exc}", type="server_error"), 500
    )


def build_app(service: Service) -> ASGIApp:
    """The whole service as one ASGI app (serve it with the backend's ``GatewayServer``).

    Example:
        >>> backend.server.app = build_app(Service(backend, settings))  # doctest: +SKIP
    """
    settings = service.settings
    api = Starlette(
        routes=ServiceAPI(service).routes, exception_handlers={Exception: _internal_error}
    )
    # The gateway's routes in an app whose APIError handler answers 4xx as handled errors:
    # a handler registered only for Exception re-raises after answering, which makes uvicorn
    # log an error and close the keep-alive connection on every 4xx.
    gateway = Starlette(
        routes=service.backend.gateway.app.routes,
        exception_handlers={APIError: _gateway_error, Exception: _internal_error},
    )
    app: ASGIApp = _Dispatch(api, gateway)
    app = _LoadOnDemand(app, service)
    app = Backpressure(app, settings.max_pending, settings.retry_after_s)
    app = BodyLimit(app, settings.max_body_bytes)
    token = settings.resolved_token()
    if token is not None:
        app = BearerAuth(app, token)
    if settings.cors_origins:
        app = CORSMiddleware(
            app,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type", "x-art-metadata"],
        )
    return app
