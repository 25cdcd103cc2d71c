"""Sampled ids from the engine's thread to the streams on the event loop, in batches.

A streamed request reads its ids from a ``TokenInbox``; the engine's callbacks go through
the model's ``TokenRelay`` for the loop. The relay wakes the loop only while a stream is
waiting for ids, once for every stream's ids sampled since the last wake-up; a stream that
has just written pauses (``pacing``) and then collects what came meanwhile, so the engine's
thread wakes the loop rarely.
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
        # Every call of the request has finished: no more ids will come.
        self.finished = False
        self._pause: asyncio.Future[None] | None = None

    def take(self) -> list[tuple[int, int, list[int]]]:
        """Every item delivered so far."""
        self.ready.clear()
        items = list(self.items)
        self.items.clear()
        return items

    def finish(self) -> None:
        """No more ids will come: wakes a reader waiting or pausing."""
        self.finished = True
        self.ready.set()
        if self._pause is not None and not self._pause.done():
            self._pause.set_result(None)

    async def pause(self, until: float) -> None:
        """Sleep until the loop's time ``until``, or until ``finish``.

        Example:
            >>> inbox = TokenInbox(); inbox.finish()
            >>> await inbox.pause(float("inf"))  # finished: returns at once
        """
        if self.finished:
            return
        loop = asyncio.get_running_loop()
        self._pause = waiter = loop.create_future()
        timer = loop.call_at(until, _resolve, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._pause = None


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class TokenRelay:
    """Hands the ids sampled on the engine's thread to the streams on one event loop.

    The engine calls back for every token of every row. Ids wait here until a stream on the
    loop collects them (``collect``, delivering every stream's to its ``TokenInbox``): a
    stream collects when it wakes from its pause, and while one is waiting (``wait``) the
    engine's callback wakes the loop, once for all the ids sampled until it runs. A wake-up
    costs a write to the loop's self-pipe on the engine's thread and a turn of the loop,
    which then holds the interpreter the engine's next step needs.

    Example:
        >>> relay = TokenRelay(asyncio.new_event_loop())
        >>> inbox = TokenInbox()
        >>> relay.listener(inbox, 0)(0, [7])  # the engine's on_tokens, on its thread
        >>> relay.collect(); inbox.take()
        [(0, 0, [7])]
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._items: list[tuple[TokenInbox, int, int, list[int]]] = []
        self._wake_pending = False
        self._waiting = 0  # streams waiting in ``wait``

    def listener(self, inbox: TokenInbox, call: int) -> TokenCallback:
        """The engine's ``on_tokens`` for call ``call`` of the request reading ``inbox``."""

        def on_tokens(choice: int, ids: list[int]) -> None:
            with self._lock:
                self._items.append((inbox, call, choice, ids))
                if self._wake_pending or not self._waiting:
                    return
                self._wake_pending = True
            self.loop.call_soon_threadsafe(self.collect)

        return on_tokens

    def collect(self) -> None:
        """Deliver every id that came to its stream's inbox (on the loop)."""
        with self._lock:
            items, self._items = self._items, []
            self._wake_pending = False
        for inbox, call, choice, ids in items:
            inbox.items.append((call, choice, ids))
            inbox.ready.set()

    async def wait(self, inbox: TokenInbox) -> None:
        """Until ``inbox`` has ids or is finished; the engine's callbacks wake the loop
        meanwhile."""
        with self._lock:
            self._waiting += 1
        try:
            # Counted first: an id that came before the count is collected here, one that
            # comes after it wakes the loop.
            self.collect()
            if not inbox.ready.is_set():
                await inbox.ready.wait()
        finally:
            with self._lock:
                self._waiting -= 1
