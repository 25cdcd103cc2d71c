"""Sampled ids from the engine's thread to the streams on the event loop, in batches.

A streamed request reads its ids from a ``TokenInbox``; the engine's callbacks go through
the model's ``TokenRelay`` for the loop, which wakes the loop once for every stream's ids
sampled since the last wake-up rather than once per token per stream.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque

from art_core.engines.base import TokenCallback


class TokenInbox:
    """One streamed request's sampled ids, waiting on the event loop to be read.

    Example:
        >>> inbox = TokenInbox()
        >>> inbox.items.append((0, 0, [7])); inbox.take()
        [(0, 0, [7])]
    """

    def __init__(self) -> None:
        self.items: deque[tuple[int, int, list[int]]] = deque()
        self.ready = asyncio.Event()

    def take(self) -> list[tuple[int, int, list[int]]]:
        """Every item delivered so far."""
        self.ready.clear()
        items = list(self.items)
        self.items.clear()
        return items


class TokenRelay:
    """Hands the ids sampled on the engine's thread to the streams on one event loop, with
    one wake-up of the loop for all of them.

    The engine calls back for every token of every row; a wake-up costs a write to the
    loop's self-pipe (on the engine's thread, between two decode steps) and a turn of the
    loop, so one is scheduled only when none is pending: the ids of every stream sampled
    meanwhile are delivered together, each to its request's ``TokenInbox``.

    Example:
        >>> relay = TokenRelay(asyncio.new_event_loop())
        >>> on_tokens = relay.listener(TokenInbox(), 0)  # the engine's on_tokens
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._items: list[tuple[TokenInbox, int, int, list[int]]] = []
        self._wake_pending = False

    def listener(self, inbox: TokenInbox, call: int) -> TokenCallback:
        """The engine's ``on_tokens`` for call ``call`` of the request reading ``inbox``."""

        def on_tokens(choice: int, ids: list[int]) -> None:
            with self._lock:
                self._items.append((inbox, call, choice, ids))
                if self._wake_pending:
                    return
                self._wake_pending = True
            self.loop.call_soon_threadsafe(self._deliver)

        return on_tokens

    def _deliver(self) -> None:
        with self._lock:
            items, self._items = self._items, []
            self._wake_pending = False
        for inbox, call, choice, ids in items:
            inbox.items.append((call, choice, ids))
            inbox.ready.set()
