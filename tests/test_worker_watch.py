"""The watch loop every engine worker shares (``WorkerClient._watch``), against real health
endpoints on loopback: a worker found gone is brought back at once, a slow one only after
``unresponsive_after_s``, and a worker answering from another process (restarted in place,
without its adapters) counts as gone."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from art_core.engines.base import EngineUnavailable, GenerationRequest, SamplingParams
from art_core.engines.process import free_port
from art_core.engines.worker_engine import WorkerClient
from art_core.testing.loopback import LoopbackServer


class Health(LoopbackServer):
    """``GET /health`` answering ``status`` with ``pid`` (changeable while it runs)."""

    def __init__(self, pid: int, status: int = 200) -> None:
        super().__init__()
        self.pid = pid
        self.status = status

    def routes(self) -> list[Route]:
        async def health(request: Request) -> JSONResponse:
            return JSONResponse({"status": "ok", "pid": self.pid}, status_code=self.status)

        return [Route("/health", health)]


class Watched(WorkerClient):
    """A worker client whose recovery only records why it was called."""

    def __init__(self, url: str, pid: int, unresponsive_after_s: float) -> None:
        super().__init__(
            max_loras=1,
            name="test worker",
            health_interval_s=0.05,
            unresponsive_after_s=unresponsive_after_s,
        )
        self.url = url
        self.pid = pid
        self.recoveries: list[tuple[float, bool]] = []
        self.started = time.monotonic()

    def _expected_pid(self) -> int | None:
        return self.pid

    async def _recover(self, hung: bool) -> None:
        self.recoveries.append((time.monotonic() - self.started, hung))
        self._ready.set()

    async def watch_for(self, seconds: float) -> list[tuple[float, bool]]:
        self._ready.set()
        task = asyncio.create_task(self._watch())
        try:
            await asyncio.sleep(seconds)
        finally:
            self._closing = True
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        return self.recoveries


async def test_a_healthy_worker_is_left_alone() -> None:
    with Health(pid=41) as server:
        assert await Watched(server.url, 41, unresponsive_after_s=0.3).watch_for(1.0) == []


async def test_a_refused_connection_is_recovered_at_once_not_after_the_unresponsive_wait() -> None:
    recoveries = await Watched(
        f"http://127.0.0.1:{free_port()}", 41, unresponsive_after_s=60
    ).watch_for(3.0)
    # Well before the 60 s a silent worker gets: a port nobody listens on is a dead worker.
    assert recoveries, "a refused connection must count as a dead worker"
    assert recoveries[0][1] is False


async def test_an_answer_from_another_process_counts_as_a_restart_to_recover() -> None:
    with Health(pid=41) as server:
        watched = Watched(server.url, 41, unresponsive_after_s=60)
        watch = asyncio.create_task(watched.watch_for(2.0))
        await asyncio.sleep(0.5)
        assert watched.recoveries == []
        server.pid = 42  # the worker came back in place, without the adapters it served
        recoveries = await watch
    assert recoveries and recoveries[0][1] is False


@pytest.mark.parametrize("unresponsive_after_s", [0.4])
async def test_an_unhealthy_answer_waits_for_unresponsive_after_then_counts_as_hung(
    unresponsive_after_s: float,
) -> None:
    with Health(pid=41, status=500) as server:
        recoveries: list[Any] = await Watched(
            server.url, 41, unresponsive_after_s=unresponsive_after_s
        ).watch_for(3.0)
    assert recoveries, "a worker failing its health check for longer than the wait is hung"
    first_at, hung = recoveries[0]
    assert first_at >= unresponsive_after_s and hung is True


async def test_a_call_that_cannot_connect_wakes_the_watch_before_its_next_tick() -> None:
    watched = Watched(f"http://127.0.0.1:{free_port()}", 41, unresponsive_after_s=60)
    watched.health_interval_s = 30.0  # only the nudge can wake it in time
    await watched.connect()
    try:
        watched.context_length = 64
        watched.vocab_size = None
        watch = asyncio.create_task(watched.watch_for(3.0))
        await asyncio.sleep(0.1)
        with pytest.raises(EngineUnavailable):
            await watched.generate(GenerationRequest([1, 2], SamplingParams(max_tokens=2)))
        recoveries = await watch
    finally:
        await watched.disconnect()
    # The next health tick is 30 s away: only the failed call can have woken the watch.
    assert recoveries
