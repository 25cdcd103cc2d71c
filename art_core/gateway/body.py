"""Request bodies: read once, bounded, parsed once.

``BodyLimit`` (ASGI middleware) answers 413 for a body over the limit, declared or streamed,
before anything else reads it, and leaves the bytes in ``scope["art.body"]``;
``read_json_object`` parses them (or reads the body itself when no middleware did, with the
same bound). uvicorn keeps reading (and discarding) a body the app did not consume, so
answering early is safe for the client.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from art_core.gateway.errors import APIError, error_body, send_json

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024

BODY_SCOPE_KEY = "art.body"
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def too_large_message(limit: int) -> str:
    return (
        f"the request body is larger than this server's limit of {limit} bytes "
        "(art-core serve --max-body-mb)"
    )


def _too_large(limit: int) -> dict[str, object]:
    return error_body(
        too_large_message(limit), type="invalid_request_error", code="request_too_large"
    )


class BodyLimit:
    """ASGI middleware: 413 for bodies over ``max_bytes``, declared or streamed (chunked).

    Bodies of POST/PUT/PATCH are read here (bounded by the limit) and replayed to the app;
    the bytes are also left in ``scope["art.body"]`` for later middleware.

    Example:
        >>> app = BodyLimit(inner_app, max_bytes=1 << 20)  # doctest: +SKIP
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = next((v for k, v in scope.get("headers", []) if k == b"content-length"), None)
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                await send_json(
                    send, 400, error_body("invalid Content-Length", type="invalid_request_error")
                )
                return
            if size > self.max_bytes:
                await send_json(send, 413, _too_large(self.max_bytes))
                return
        if scope["method"] not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before sending its body: nobody to answer
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_bytes:
                await send_json(send, 413, _too_large(self.max_bytes))
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        scope[BODY_SCOPE_KEY] = body
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # later calls wait for the disconnect, as usual

        await self.app(scope, replay, send)


async def read_json_object(
    request: Request, max_bytes: int = DEFAULT_MAX_BODY_BYTES
) -> dict[str, Any]:
    """The request's body as a JSON object; ``APIError`` 400/413 otherwise.

    Example:
        >>> payload = await read_json_object(request)  # doctest: +SKIP
    """
    body = request.scope.get(BODY_SCOPE_KEY)
    if body is None:
        body = await request.body()
        if len(body) > max_bytes:
            raise APIError(413, too_large_message(max_bytes), code="request_too_large")
    try:
        payload = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(400, f"the body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise APIError(400, "the body must be a JSON object")
    return payload
