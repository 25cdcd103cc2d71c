"""Slow and idle connections cannot starve ``art-core serve`` (a real process on loopback).

1,100 connections that send half a request and wait, against a server limited to 1,024 file
descriptors (a common default): legitimate requests, each on a new connection, are still
served, and the server keeps working after the flood. A client trickling its headers, or
stalling its body, is cut off after the configured timeout.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

os.environ.setdefault(
    "ART_CORE_MODELS_DIR", str(Path(tempfile.gettempdir()) / "art-core-test-models")
)

from remote_support import ServerProcess

import art_core as art

FLOOD = 1100
PARTIAL_REQUEST = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: appl"


def serving(path: Path, *args: str) -> Iterator[ServerProcess]:
    server = ServerProcess(path, max_open_files=1024, args=list(args)).start()
    yield server
    assert server.stop() == 0, server.describe()


@pytest.fixture
def patient_server(tmp_path: Path) -> Iterator[ServerProcess]:
    # Header deadline far beyond the test: the idle flood stays open, and only the caps
    # (idle connections before a first request, open connections) protect real clients.
    yield from serving(tmp_path / "art", "--header-timeout", "600")


@pytest.fixture
def strict_server(tmp_path: Path) -> Iterator[ServerProcess]:
    yield from serving(tmp_path / "art", "--header-timeout", "2", "--body-timeout", "2")


async def open_partial(host: str, port: int) -> asyncio.StreamWriter | None:
    try:
        _, writer = await asyncio.open_connection(host, port)
    except OSError:
        return None  # refused at once: that is allowed too
    writer.write(PARTIAL_REQUEST)
    return writer


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    """Whether the server closes the connection (EOF or reset) within ``seconds``."""
    try:
        while await asyncio.wait_for(reader.read(1024), seconds):
            pass
        return True
    except ConnectionError:
        return True
    except TimeoutError:
        return False


async def test_a_flood_of_idle_connections_does_not_block_real_requests(
    patient_server: ServerProcess,
) -> None:
    server = patient_server
    host, port = "127.0.0.1", server.port
    backend = server.backend()
    model = art.TrainableModel(name="m", project="conns", base_model="tiny-random")
    await model.register(backend)
    headers = {"Authorization": f"Bearer {server.token}"}
    writers: list[asyncio.StreamWriter] = []
    try:
        for start in range(0, FLOOD, 100):  # bounded: 100 at a time
            opened = await asyncio.gather(
                *(open_partial(host, port) for _ in range(start, min(start + 100, FLOOD)))
            )
            writers += [w for w in opened if w is not None]
        assert len(writers) > 900  # connected (the server closes the extra ones at once)

        # Each on a fresh connection, as the flood goes on: answered.
        for i in range(10):
            limits = httpx.Limits(max_keepalive_connections=0)
            async with httpx.AsyncClient(headers=headers, timeout=60, limits=limits) as http:
                health = await http.get(f"{server.url}/health")
                assert health.status_code == 200
                reply = await http.post(
                    f"{server.url}/v1/chat/completions",
                    json={
                        "model": model.name,
                        "messages": [{"role": "user", "content": f"hi {i}"}],
                        "max_tokens": 2,
                    },
                )
                assert reply.status_code == 200, reply.text
    finally:
        for writer in writers:
            writer.close()
    # The server is still whole: it answers and trains nothing it was not asked to.
    async with httpx.AsyncClient(headers=headers, timeout=60) as http:
        assert (await http.get(f"{server.url}/api/info")).status_code == 200
    await backend.close()


async def test_trickled_headers_and_stalled_bodies_are_cut_off(
    strict_server: ServerProcess,
) -> None:
    server = strict_server
    host, port = "127.0.0.1", server.port
    # Headers one byte at a time, forever: closed after the 2 s header deadline, although
    # bytes keep arriving.
    reader, writer = await asyncio.open_connection(host, port)

    async def trickle() -> None:
        try:
            for byte in PARTIAL_REQUEST * 100:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.2)
        except ConnectionError:
            pass

    trickling = asyncio.create_task(trickle())
    assert await closed_within(reader, 30)
    trickling.cancel()
    writer.close()

    # A body announced as 100 bytes that stops after 10: closed after the 2 s idle timeout.
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        b"Authorization: Bearer " + server.token.encode() + b"\r\n"
        b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n" + b'{"model": "'
    )
    await writer.drain()
    assert await closed_within(reader, 30)
    writer.close()

    # A prompt client is not affected.
    headers = {"Authorization": f"Bearer {server.token}"}
    async with httpx.AsyncClient(timeout=30, headers=headers) as http:
        assert (await http.get(f"{server.url}/health")).status_code == 200
