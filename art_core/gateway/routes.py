"""What an API module hands the gateway: its routes, each answering its own errors.

A wire API is a module with ``ROUTES``, a sequence of ``APIRoute``: a path (mounted under
``/v1`` as given and again under ``/rollouts/{rollout_id}``, which scopes the calls to one
rollout), the endpoint ``(serving, request) -> response``, the methods, and the API's error
shape. ``app.Gateway`` mounts them; adding an API is one module and one entry in
``app.WIRE_APIS``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from art_core.gateway.errors import APIError, internal_error
from art_core.gateway.serving import Serving

logger = logging.getLogger(__name__)
ROLLOUT_PREFIX = "/rollouts/{rollout_id}"
Endpoint = Callable[[Request], Awaitable[Response]]
APIEndpoint = Callable[[Serving, Request], Awaitable[Response]]


def openai_error(error: APIError) -> Response:
    """An error in OpenAI's shape, with its status (every API's but Anthropic's)."""
    return error.response()


@dataclass(frozen=True)
class APIRoute:
    """One route of an API module.

    Example:
        >>> from art_core.gateway.apis.completions import create
        >>> APIRoute("/v1/completions", create).prefixes
        ('', '/rollouts/{rollout_id}')
    """

    path: str
    endpoint: APIEndpoint
    methods: tuple[str, ...] = ("POST",)
    error_response: Callable[[APIError], Response] = openai_error
    # Where the path is mounted: as given, and under a rollout's prefix.
    prefixes: tuple[str, ...] = ("", ROLLOUT_PREFIX)


class WireAPI(Protocol):
    """An API module: its routes (``art_core.gateway.apis.chat`` is one)."""

    @property
    def ROUTES(self) -> Sequence[APIRoute]: ...


def mounted(serving: Serving, apis: Sequence[WireAPI]) -> list[Route]:
    """Starlette routes for every route of ``apis``, bound to ``serving``: plain routes
    first, then the rollout-scoped ones, each answering its errors in its API's shape.

    Example:
        >>> from art_core.gateway.apis import chat
        >>> [r.path for r in mounted(Serving(), [chat])]
        ['/v1/chat/completions', '/rollouts/{rollout_id}/v1/chat/completions']
    """
    routes = []
    for prefix in ("", ROLLOUT_PREFIX):
        for api in apis:
            for route in api.ROUTES:
                if prefix in route.prefixes:
                    endpoint = answered(_bound(serving, route.endpoint), route.error_response)
                    routes.append(Route(prefix + route.path, endpoint, methods=list(route.methods)))
    return routes


def _bound(serving: Serving, handler: APIEndpoint) -> Endpoint:
    async def endpoint(request: Request) -> Response:
        return await handler(serving, request)

    endpoint.__name__ = getattr(handler, "__name__", "endpoint")
    return endpoint


def answered(
    endpoint: Endpoint, error_response: Callable[[APIError], Response] = openai_error
) -> Endpoint:
    """``endpoint`` answering its own errors: ``APIError`` as itself, anything else as a 500
    (logged, without paths), each in the API's error shape (``error_response``; OpenAI's by
    default). Returning the answer, rather than letting Starlette's error middleware send it
    and re-raise, keeps the client's keep-alive connection open.

    Example:
        >>> from starlette.responses import PlainTextResponse
        >>> async def health(request):
        ...     return PlainTextResponse("ok")
        >>> route = Route("/health", answered(health))
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
