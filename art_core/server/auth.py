"""Token authentication for every route of the service (API and gateway alike).

The token comes as ``Authorization: Bearer <token>`` (OpenAI's clients) or as ``x-api-key``
(Anthropic's clients); either is accepted wherever the other is.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from art_core.access import bearer_token, token_matches
from art_core.gateway.errors import send_error

__all__ = ["BearerAuth", "bearer_token", "token_matches"]


class BearerAuth:
    """ASGI middleware: 401 unless the request carries the token (``Authorization: Bearer
    <token>`` or ``x-api-key: <token>``).

    The openai client sends its ``api_key`` this way, so rollouts authenticate by using the
    token as their API key (``RemoteBackend`` sets ``model.inference_api_key`` to it).

    Example:
        >>> from starlette.applications import Starlette
        >>> app = BearerAuth(Starlette(), token="s3cret")
    """

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if token_matches(bearer_token(scope.get("headers", [])), self.token):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await send_error(
            send,
            scope,
            401,
            "missing or wrong bearer token: send 'Authorization: Bearer <token>' or "
            "'x-api-key: <token>' (the token art-core serve printed or was given)",
            type="authentication_error",
            code="invalid_api_key",
            headers={"www-authenticate": 'Bearer realm="art-core"'},
        )
