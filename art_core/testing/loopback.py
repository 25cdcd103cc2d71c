"""A real HTTP server on loopback for tests: a Starlette app in a daemon thread, free port.

Every stand-in of this package (the RULER judge, the tracing backends) is one of these, so a
test talks to it over real HTTP with the real client SDK.
"""

from __future__ import annotations

import threading
import time
from typing import Self

import uvicorn
from starlette.applications import Starlette
from starlette.routing import Route
from starlette.types import ASGIApp

START_TIMEOUT_S = 30.0


class LoopbackServer:
    """Serves ``routes()`` on ``127.0.0.1`` (a port the OS picks) until ``stop()``.

    ``stopping`` is set when the server is asked to stop, so a handler that waits on purpose
    (a "slow" reply) can give up instead of holding the shutdown.

    Example:
        >>> import httpx
        >>> from starlette.responses import PlainTextResponse
        >>> class Hello(LoopbackServer):
        ...     def routes(self):
        ...         return [Route("/", lambda request: PlainTextResponse("hi"))]
        >>> with Hello() as server:
        ...     httpx.get(server.url).text
        'hi'
    """

    def __init__(self) -> None:
        self.port = 0
        self.stopping = threading.Event()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def routes(self) -> list[Route]:
        """The app's routes; subclasses define them (or the whole ``app``)."""
        raise NotImplementedError

    def app(self) -> ASGIApp:
        """The ASGI app served: a Starlette app of ``routes()`` unless overridden."""
        return Starlette(routes=self.routes())

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (the port is known once started)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        """Start serving; returns once the socket is bound."""
        config = uvicorn.Config(
            self.app(),
            host="127.0.0.1",
            port=0,
            log_level="warning",
            lifespan="off",
            access_log=False,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, name=type(self).__name__, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"{type(self).__name__} did not start")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        """Ask the server to exit and wait for its thread (at most 10 s)."""
        self.stopping.set()
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
