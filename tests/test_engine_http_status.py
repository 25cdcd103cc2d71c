"""An engine server's failure is not the caller's fault: ``HTTPEngine`` (the client of vLLM's
server) maps a 5xx to ``EngineUnavailable`` (the gateway's 503), a 4xx to ``EngineError``
(its 400), against a real HTTP server on loopback answering with each status."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from art_core.engines.base import (
    EngineError,
    EngineUnavailable,
    GenerationRequest,
    SamplingParams,
)
from art_core.engines.http_engine import HTTPEngine


async def _answer_with(status: int) -> asyncio.Server:
    """A server answering every request with ``status`` and a JSON error body."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            ),
            0,
        )
        await reader.readexactly(length)
        body = b'{"error": {"message": "Unsupported CPU attention configuration"}}'
        writer.write(
            f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


@pytest.fixture
async def engine_for() -> AsyncIterator[object]:
    servers: list[asyncio.Server] = []
    engines: list[HTTPEngine] = []

    async def make(status: int) -> HTTPEngine:
        server = await _answer_with(status)
        servers.append(server)
        engine = HTTPEngine(name="vLLM server")
        engine.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        engine.context_length, engine.vocab_size = 64, 100
        await engine.connect()
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        await engine.disconnect()
    for server in servers:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(
    ("status", "error", "says"),
    [
        (500, EngineUnavailable, "failed while serving the call (HTTP 500)"),
        (502, EngineUnavailable, "(HTTP 502)"),
        (503, EngineUnavailable, "is unavailable"),
        (400, EngineError, "rejected the request"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
async def test_server_statuses_map_to_whose_fault_it_is(
    engine_for: object, status: int, error: type[Exception], says: str, stream: bool
) -> None:
    engine = await engine_for(status)  # type: ignore[operator]
    request = GenerationRequest(
        prompt_token_ids=[1, 2, 3],
        params=SamplingParams(max_tokens=4),
        on_tokens=(lambda *_: None) if stream else None,
    )
    with pytest.raises(error, match="Unsupported CPU attention") as raised:
        await engine.generate(request)
    assert says in str(raised.value)
    if error is EngineError:
        assert not isinstance(raised.value, EngineUnavailable)
