"""The service's ASGI app: the gateway's OpenAI routes and the backend API on one port.

``GET /openapi.json`` is the OpenAPI 3.1 document of both (``server.openapi``).
Middleware, outermost first: CORS (only when origins are configured), bearer auth (when a
token is set), body size limit, backpressure on chat completions; then ``/api/...`` goes to
the API and everything else (``/v1/...``, ``/rollouts/{id}/v1/...``, ``/health``) to the
gateway, which loads a model registered before a restart when a request names it.
"""

from __future__ import annotations

import asyncio
import logging

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from art_core.gateway.body import BodyLimit
from art_core.gateway.errors import (
    error_body,
    http_exception_response,
    json_response,
    send_error,
    shown_path,
)
from art_core.gateway.pacing import StreamPacing
from art_core.server.api import ServiceAPI
from art_core.server.auth import BearerAuth
from art_core.server.limits import Backpressure
from art_core.server.openapi import openapi_document
from art_core.server.service import Service
from art_core.ui.app import build_ui_app
from art_core.ui.auth import BrowserTokenAuth

logger = logging.getLogger(__name__)


class _Dispatch:
    """``/api`` to the backend API, the rest to the gateway."""

    def __init__(self, api: ASGIApp, gateway: ASGIApp) -> None:
        self.api, self.gateway = api, gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and path == "/openapi.json":
            if scope["method"] not in ("GET", "HEAD"):
                method = scope["method"]
                await send_error(
                    send,
                    scope,
                    405,
                    f"method {method} is not allowed on {shown_path(path)}; allowed: GET, HEAD",
                    type="invalid_request_error",
                    code="method_not_allowed",
                    headers={"Allow": "GET, HEAD"},
                )
                return
            # Built once, off the loop (pydantic's JSON Schema generation takes ~50 ms).
            document = await asyncio.to_thread(openapi_document)
            await json_response(document)(scope, receive, send)
        elif scope["type"] == "http" and (path == "/api" or path.startswith("/api/")):
            await self.api(scope, receive, send)
        else:
            await self.gateway(scope, receive, send)


class _WithUI:
    """``/ui`` to the read-only viewer of the art folder (its own token check: a browser
    carries the token in a cookie), the rest to the service."""

    PREFIX = "/ui"

    def __init__(self, service: ASGIApp, ui: ASGIApp) -> None:
        self.service, self.ui = service, ui

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and (path == self.PREFIX or path.startswith(self.PREFIX + "/")):
            if path == self.PREFIX:
                await RedirectResponse(self.PREFIX + "/", 307)(scope, receive, send)
                return
            # Starlette's convention: ``path`` keeps the prefix, ``root_path`` names it.
            ui_scope = {**scope, "root_path": scope.get("root_path", "") + self.PREFIX}
            await self.ui(ui_scope, receive, send)
        else:
            await self.service(scope, receive, send)


async def _internal_error(request: Request, exc: Exception) -> Response:
    logger.exception("internal error on %s", request.url.path)
    return json_response(
        error_body(f"internal error: {type(exc).__name__}: {exc}", type="server_error"), 500
    )


def build_app(service: Service) -> ASGIApp:
    """The whole service as one ASGI app (serve it with the backend's ``GatewayServer``).

    Example:
        >>> backend.server.app = build_app(Service(backend, settings))  # fragment: `art-core serve`'s `backend` and `settings`  # doctest: +SKIP
    """
    settings = service.settings
    # Starlette's own 404 / 405 (no route, a method not routed) answer in the one JSON shape.
    api = Starlette(
        routes=ServiceAPI(service).routes,
        exception_handlers={HTTPException: http_exception_response, Exception: _internal_error},
    )
    gateway = service.backend.gateway
    gateway.max_body_bytes = settings.max_body_bytes
    gateway.stream_pacing = StreamPacing(
        settings.stream_interval_s, settings.max_stream_writes_per_s
    )
    gateway.model_loader = service.load_on_demand
    app: ASGIApp = _Dispatch(api, gateway.app)
    app = Backpressure(app, settings.max_pending, settings.retry_after_s)
    app = BodyLimit(app, settings.max_body_bytes)
    token = settings.resolved_token()
    ui = build_ui_app(settings.path)
    if token is not None:
        app = BearerAuth(app, token)
        ui = BrowserTokenAuth(ui, token)
    app = _WithUI(app, ui)
    if settings.cors_origins:
        app = CORSMiddleware(
            app,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=[
                "authorization",
                "content-type",
                "x-art-metadata",
                "x-api-key",
                "anthropic-version",
                "anthropic-beta",
            ],
        )
    return app
