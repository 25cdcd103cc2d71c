"""A streamed answer's writes (``gateway/wire.py``): each item of the events one body
message, the body ended together with the item marked ``LastEvents`` (no empty message
after it), or by an empty one when none is marked; nothing may follow ``LastEvents``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from art_core.gateway.wire import LastEvents, event_stream


async def sent(*items: str) -> list[dict[str, Any]]:
    async def events() -> AsyncIterator[str]:
        for item in items:
            yield item

    messages: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    await event_stream(events()).stream_response(send)
    return messages


async def test_the_last_events_end_the_body_in_the_same_message() -> None:
    start, *body = await sent("data: 1\n\n", "data: 2\n\n", LastEvents("data: [DONE]\n\n"))
    assert start["type"] == "http.response.start" and start["status"] == 200
    assert dict(start["headers"])[b"content-type"].startswith(b"text/event-stream")
    assert [(m["body"], m["more_body"]) for m in body] == [
        (b"data: 1\n\n", True),
        (b"data: 2\n\n", True),
        (b"data: [DONE]\n\n", False),
    ]


async def test_without_last_events_an_empty_message_ends_the_body() -> None:
    _, *body = await sent("data: 1\n\n")
    assert [(m["body"], m["more_body"]) for m in body] == [(b"data: 1\n\n", True), (b"", False)]


async def test_nothing_may_follow_the_last_events() -> None:
    with pytest.raises(RuntimeError, match="after its LastEvents"):
        await sent(LastEvents("data: [DONE]\n\n"), "data: late\n\n")
