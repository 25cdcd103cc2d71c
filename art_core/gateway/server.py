"""Runs the gateway with uvicorn on its own event loop in a background thread.

The user's agent code may block its own event loop (sync LangChain calls, slow tools); the
gateway, the engine's scheduler and the call store must keep serving regardless, so they live
on a loop of their own. Other threads reach that loop through ``call``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import uvicorn

from art_core.gateway.app import Gateway
from art_core.gateway.connections import (
    ConnectionLimits,
    ConnectionState,
    guarded_protocol,
    http_protocol_class,
)

T = TypeVar("T")


class GatewayServer:
    """A started gateway: ``base_url`` and a way to run coroutines on its loop.

    Example:
        >>> server = GatewayServer(Gateway())
        >>> server.start()  # on a free port of loopback
        >>> server.base_url
        'http://127.0.0.1:...'
        >>> server.stop()
    """

    def __init__(
        self,
        gateway: Gateway | None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        app: Any | None = None,
    ) -> None:
        self.gateway = gateway
        # The ASGI app served: the gateway's own, or a service wrapping it (``art-core serve``
        # mounts the gateway next to its API on one port), or another app (the SFT teacher
        # proxy) when there is no gateway; settable until ``start``.
        if app is None and gateway is None:
            raise ValueError("GatewayServer needs a gateway or an app to serve")
        self.app: Any = app if app is not None else gateway.app  # type: ignore[union-attr]
        self.host = host
        self.port = port
        # How many connections it holds and how long it waits for them; settable until start.
        self.connection_limits = ConnectionLimits()
        self.connections: ConnectionState | None = None
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="art-gateway", daemon=True)
        self._started = threading.Event()
        self._server: uvicorn.Server | None = None
        self._error: BaseException | None = None

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        self._thread.start()
        if not self._started.wait(timeout):
            raise TimeoutError("the gateway did not start")
        if self._error is not None:
            raise RuntimeError(f"the gateway failed to start: {self._error}") from self._error

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        protocol = guarded_protocol(http_protocol_class(), self.connection_limits)
        self.connections = protocol.state
        config = uvicorn.Config(
            self.app,
            host=self.host,
            port=self.port,
            log_level="warning",
            lifespan="off",
            timeout_keep_alive=30,
            backlog=2048,
            http=protocol,
        )
        self._server = uvicorn.Server(config)
        self.loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        assert self._server is not None
        server = self._server
        serving = asyncio.ensure_future(server.serve())
        # uvicorn exposes readiness only as a flag, so poll it (at most a few hundred ms).
        while not server.started and not serving.done():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        if serving.done() and serving.exception() is not None:
            self._error = serving.exception()
        elif server.servers:
            self.port = server.servers[0].sockets[0].getsockname()[1]
        self._started.set()
        try:
            await serving
        except SystemExit as exc:  # uvicorn exits when it cannot bind
            self._error = exc

    async def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Await ``coroutine`` on the gateway's loop from any other loop."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        return await asyncio.wrap_future(future)

    def stop(self, timeout: float = 10.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        self._thread.join(timeout)
