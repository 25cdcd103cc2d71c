"""Bounds on the connections a server holds: slow or idle clients cannot starve the rest.

uvicorn accepts every connection and waits as long as a client likes for its request
headers, so 1,000 idle sockets exhaust the file descriptors before any request (and so
before authentication) is seen. ``guarded_protocol`` wraps uvicorn's HTTP protocol class
with four bounds (``ConnectionLimits``):

- **header deadline**: a connection must deliver a request's headers within
  ``header_timeout_s`` of opening (or of its first byte after a keep-alive pause), however
  slowly it trickles them in; then it is closed;
- **body idle timeout**: a request body that stops arriving for ``body_idle_timeout_s`` is
  abandoned (the app sees a disconnect);
- **idle-before-request cap**: at most ``max_idle_connections`` connections that have not
  sent a first request are kept; beyond that, the oldest of them that has waited at least
  ``MIN_IDLE_AGE_S`` is closed. A real client sends its request at once and leaves that pool
  in milliseconds, so an attacker holding sockets open cannot crowd it out, and a burst of
  real clients connecting at once (a rollout storm) is not cut;
- **connection cap**: at most ``max_connections`` open at once (never more than the file
  descriptor limit allows, with room for the engine and files); beyond it a new connection
  first evicts an idle one, else it is closed at once.

Example:
    >>> limits = ConnectionLimits(max_connections=100, header_timeout_s=5)
    >>> limits.effective_max_connections() <= 100
    True
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

# File descriptors kept free of connections: model files, SQLite, engine workers, logs.
RESERVED_FDS = 128
# An idle connection younger than this is not evicted by the idle cap (only by the
# connection cap): it may be one of a burst of clients whose requests are on their way.
MIN_IDLE_AGE_S = 2.0


@dataclass(frozen=True)
class ConnectionLimits:
    """How many connections a server holds and how long it waits for each (see module)."""

    max_connections: int = 4096
    max_idle_connections: int = 256
    header_timeout_s: float = 10.0
    body_idle_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_idle_connections"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("header_timeout_s", "body_idle_timeout_s"):
            if not 0 < getattr(self, name) < float("inf"):
                raise ValueError(f"{name} must be a positive number, got {getattr(self, name)}")

    def effective_max_connections(self) -> int:
        """``max_connections``, lowered to fit under this process's file descriptor limit."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return self.max_connections
        return max(1, min(self.max_connections, soft - RESERVED_FDS))


@dataclass
class ConnectionState:
    """The open connections of one server (touched only on its event loop)."""

    open: set[Any] = field(default_factory=set)
    # Connections that have not sent a first request yet, oldest first, with when they came.
    idle: OrderedDict[Any, float] = field(default_factory=OrderedDict)
    refused: int = 0
    evicted: int = 0
    timed_out: int = 0

    def evict_oldest_idle(self, older_than: float | None = None) -> bool:
        """Close the connection that has waited longest for its first request (only if it
        came before ``older_than``); whether one was closed."""
        if not self.idle:
            return False
        oldest, since = next(iter(self.idle.items()))
        if older_than is not None and since > older_than:
            return False
        del self.idle[oldest]
        self.evicted += 1
        oldest.transport.close()
        return True


class ConnectionGuard:
    """The limits, as a mixin over uvicorn's protocol class (``guarded_protocol`` sets the
    class attributes ``state``, ``limits`` and ``max_connections``)."""

    state: ConnectionState
    limits: ConnectionLimits
    max_connections: int
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    cycle: Any

    def connection_made(self, transport: asyncio.Transport) -> None:
        state, limits = self.state, self.limits
        self._guard_timer: asyncio.TimerHandle | None = None
        self._refused = False
        if len(state.open) >= self.max_connections and not state.evict_oldest_idle():
            self._refused = True
            state.refused += 1
            transport.abort()
            return
        super().connection_made(transport)  # type: ignore[misc]
        state.open.add(self)
        now = self.loop.time()
        state.idle[self] = now
        while len(state.idle) > limits.max_idle_connections:
            if not state.evict_oldest_idle(older_than=now - MIN_IDLE_AGE_S):
                break
        # The request the connection is expected to start next follows this cycle.
        self._waiting_after = self.cycle
        self._arm(limits.header_timeout_s, self._on_header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        self._disarm()
        self.state.open.discard(self)
        self.state.idle.pop(self, None)
        super().connection_lost(exc)  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        if self._waiting_after is not None and self.cycle is self._waiting_after:
            # First bytes after a keep-alive pause: the next headers are now due.
            if self._guard_timer is None:
                self._arm(self.limits.header_timeout_s, self._on_header_timeout)
        super().data_received(data)  # type: ignore[misc]
        cycle = self.cycle
        if cycle is None or cycle is self._waiting_after:
            return  # still inside the headers
        self.state.idle.pop(self, None)
        if getattr(cycle, "more_body", False) and not getattr(cycle, "response_complete", True):
            self._arm(self.limits.body_idle_timeout_s, self._on_body_timeout)  # progress: re-arm
        else:
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self._disarm()
        self._waiting_after = self.cycle  # the header deadline restarts with new bytes

    def _arm(self, delay: float, callback: Any) -> None:
        self._disarm()
        self._guard_timer = self.loop.call_later(delay, callback)

    def _disarm(self) -> None:
        if self._guard_timer is not None:
            self._guard_timer.cancel()
            self._guard_timer = None

    def _on_header_timeout(self) -> None:
        self._guard_timer = None
        if self.cycle is self._waiting_after and not self.transport.is_closing():
            self.state.timed_out += 1
            self.transport.close()

    def _on_body_timeout(self) -> None:
        self._guard_timer = None
        cycle = self.cycle
        if cycle is not None and getattr(cycle, "more_body", False):
            self.state.timed_out += 1
            self.transport.close()


def guarded_protocol(base: type[asyncio.Protocol], limits: ConnectionLimits) -> type[Any]:
    """``base`` (uvicorn's httptools or h11 protocol class) with ``limits`` enforced; the
    class to pass as ``uvicorn.Config(http=...)``. Its ``state`` holds the counters.

    Example:
        >>> from uvicorn.protocols.http.h11_impl import H11Protocol
        >>> protocol = guarded_protocol(H11Protocol, ConnectionLimits())
        >>> protocol.state.refused
        0
    """
    attributes = {
        "state": ConnectionState(),
        "limits": limits,
        "max_connections": limits.effective_max_connections(),
    }
    return type(f"Guarded{base.__name__}", (ConnectionGuard, base), attributes)


def http_protocol_class() -> type[asyncio.Protocol]:
    """The HTTP protocol class uvicorn's ``http="auto"`` picks (httptools when installed)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        return HttpToolsProtocol
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol

        return H11Protocol
