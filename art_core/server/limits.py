"""Backpressure on the sampling routes (429 + Retry-After): ASGI middleware around the service.

The body limit (413) is the gateway's ``art_core.gateway.body.BodyLimit``.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from art_core.gateway.errors import send_error

# The routes that sample (chat completions, completions, Responses, Anthropic Messages; not
# count_tokens), by the end of their path.
SAMPLING_ROUTES = ("/completions", "/responses", "/messages")


class Backpressure:
    """ASGI middleware: at most ``max_pending`` sampling requests in flight, then 429.

    A rollout storm queues in the engine up to the bound; beyond it clients get
    ``429 Too Many Requests`` with ``Retry-After`` (the openai client retries those by itself)
    instead of the server running out of memory. Streams count until they finish.

    Example:
        >>> from starlette.applications import Starlette
        >>> app = Backpressure(Starlette(), max_pending=512, retry_after_s=1)
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
            or not scope["path"].endswith(SAMPLING_ROUTES)
        ):
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.max_pending:
            self.rejected += 1
            await send_error(
                send,
                scope,
                429,
                f"the server has {self.in_flight} requests in flight (limit "
                f"{self.max_pending}); retry after {self.retry_after_s} s",
                type="rate_limit_error",
                code="server_busy",
                headers={"retry-after": str(self.retry_after_s)},
            )
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
