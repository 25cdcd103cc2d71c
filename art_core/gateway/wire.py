"""The bytes of an answer: JSON bodies and server-sent events, as every API writes them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.responses import Response, StreamingResponse
from starlette.types import Send

SSE_DONE = "data: [DONE]\n\n"


def completion_response(body: dict[str, Any]) -> Response:
    """The JSON answer (orjson: ~10x faster than ``json`` on long token-id lists; a
    non-finite logprob is written as ``null``).

    Example:
        >>> completion_response({"object": "chat.completion"}).body
        b'{"object":"chat.completion"}'
    """
    return Response(orjson.dumps(body), media_type="application/json")


def sse(payload: dict[str, Any]) -> str:
    """One server-sent event.

    Example:
        >>> sse({"a": "é"}) == 'data: {"a":"é"}\\n\\n'
        True
    """
    return f"data: {orjson.dumps(payload).decode()}\n\n"


def named_event(kind: str, payload: dict[str, Any]) -> str:
    """One server-sent event with its name (``event: KIND``), as Anthropic and the
    Responses API send them.

    Example:
        >>> named_event("ping", {"type": "ping"})
        'event: ping\\ndata: {"type":"ping"}\\n\\n'
    """
    return f"event: {kind}\ndata: {orjson.dumps(payload).decode()}\n\n"


class LastEvents(str):
    """The last events of a stream: written together with the end of the body (one write
    for the two; a ``StreamingResponse`` ends with a write of its own).

    Example:
        >>> LastEvents(SSE_DONE) == SSE_DONE and isinstance(LastEvents(SSE_DONE), str)
        True
    """


class EventStreamResponse(StreamingResponse):
    """A ``StreamingResponse`` of server-sent events that ends its body with the item
    marked ``LastEvents``, when one comes (nothing may follow it)."""

    async def stream_response(self, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        ended = False
        async for chunk in self.body_iterator:
            if ended:
                raise RuntimeError("a stream's events came after its LastEvents")
            ended = isinstance(chunk, LastEvents)
            body = chunk if isinstance(chunk, bytes | memoryview) else chunk.encode(self.charset)
            await send({"type": "http.response.body", "body": body, "more_body": not ended})
        if not ended:
            await send({"type": "http.response.body", "body": b"", "more_body": False})


def event_stream(events: AsyncIterator[str]) -> StreamingResponse:
    """The streamed answer of ``events`` (``text/event-stream``, never cached), each item
    one write, the body ended with the ``LastEvents`` item.

    Example:
        >>> event_stream(stream_answer([prepared], encoder))  # fragment: a `prepared` call and its `encoder`  # doctest: +SKIP
    """
    return EventStreamResponse(
        events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )
