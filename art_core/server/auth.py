"""Token authentication for every route of the service (API and gateway alike).

The token comes as ``Authorization: Bearer <token>`` (OpenAI's clients) or as ``x-api-key``
(Anthropic's clients); either is accepted wherever the other is.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from art_core.gateway.errors import send_error


def bearer_token(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or else of an ``x-api-key``
    header (what Anthropic's clients send), if any.

    Example:
        >>> bearer_token([(b"authorization", b"Bearer abc")])
        'abc'
        >>> bearer_token([(b"x-api-key", b"abc")])
        'abc'
    """
    api_key = None
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
        elif name == b"x-api-key" and value.strip():
            api_key = value.decode("latin-1").strip()
    return api_key


def token_matches(given: str | None, expected: str) -> bool:
    """Constant-time comparison, so response timing does not leak the token's prefix."""
    if given is None:
        return False
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


class BearerAuth:
    """ASGI middleware: 401 unless the request carries the token (``Authorization: Bearer
    <token>`` or ``x-api-key: <token>``).

    The openai client sends its ``api_key`` this way, so rollouts authenticate by using the
    token as their API key (``RemoteBackend`` sets ``model.inference_api_key`` to it).

    Example:
        >>> app = BearerAuth(inner_app, token="s3cret")  # doctest: +SKIP
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
