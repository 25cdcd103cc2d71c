"""Request limits: body size (413) and backpressure on chat completions (429 + Retry-After).

Both are plain ASGI middleware around the whole service. uvicorn keeps reading (and
discarding) a body the app did not consume, so answering early is safe for the client.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from art_core.server.errors import error_body, send_json

BODY_SCOPE_KEY = "art.body"
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def _too_large(limit: int) -> dict[str, object]:
    return error_body(
        f"the request body is larger than this server's limit of {limit} bytes "
        "(art-core serve --max-body-mb)",
        type="invalid_request_error",
        code="request_too_large",
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


class Backpressure:
    """ASGI middleware: at most ``max_pending`` chat completions in flight, then 429.

    A rollout storm queues in the engine up to the bound; beyond it clients get
    ``429 Too Many Requests`` with ``Retry-After`` (the openai client retries those by itself)
    instead of the server running out of memory. Streams count until they finish.

    Example:
        >>> app = Backpressure(inner_app, max_pending=512, retry_after_s=1)  # doctest: +SKIP
    """

    def __init__(self, app: ASGIApp, max_pending: int, retry_after_s: int = 1) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self.app = app
        self.max_pending = max_pending
        self.retry_after_s = retry_after_s
        # Only touched on the server's event loop: no lock needed.
        self.in_flight = 0
        self.rejected = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or not scope["path"].endswith("/chat/completions")
        ):
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.max_pending:
            self.rejected += 1
            await send_json(
                send,
                429,
                error_body(
                    f"the server has {self.in_flight} requests in flight (limit "
                    f"{self.max_pending}); retry after {self.retry_after_s} s",
                    type="rate_limit_error",
                    code="server_busy",
                ),
                {"retry-after": str(self.retry_after_s)},
            )
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
