"""Streamed tokens reach the event loop in batches (``gateway/relay.py``): the engine's
thread wakes the loop only while a stream waits for tokens, once for all the tokens sampled
until the loop runs; otherwise the tokens wait until a stream collects them, each stream's
in order. A stream's pause ends at its deadline or as soon as its calls finish."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator

import pytest

from art_core.gateway.relay import TokenInbox, TokenRelay

Listener = Callable[[int, list[int]], None]  # the engine's callback: (choice, token ids)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def counting_wakes(relay: TokenRelay) -> list[int]:
    """Each wake-up of the loop the engine's callbacks schedule is counted."""
    wakes: list[int] = []
    loop = relay.loop

    class Counted:
        def call_soon_threadsafe(self, callback: Callable[[], None]) -> None:
            wakes.append(1)
            loop.call_soon_threadsafe(callback)

    relay.loop = Counted()  # type: ignore[assignment]
    return wakes


def on_engine_thread(work: Callable[[], None]) -> None:
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()


def put_tokens(callbacks: list[Listener], tokens: range) -> None:
    for token in tokens:
        for choice, on_tokens in enumerate(callbacks):
            on_tokens(choice, [token])


@pytest.fixture
def two_streams(
    loop: asyncio.AbstractEventLoop,
) -> tuple[TokenRelay, list[int], list[TokenInbox], list[Listener]]:
    """A relay on ``loop`` (its wake-ups counted), two streams' inboxes and the engine's
    callbacks for them (calls 0 and 1)."""
    relay = TokenRelay(loop)
    wakes = counting_wakes(relay)
    inboxes = [TokenInbox(), TokenInbox()]
    callbacks = [relay.listener(inbox, call=i) for i, inbox in enumerate(inboxes)]
    return relay, wakes, inboxes, callbacks


def test_tokens_wait_in_the_relay_until_a_stream_collects_them(
    loop: asyncio.AbstractEventLoop,
    two_streams: tuple[TokenRelay, list[int], list[TokenInbox], list[Listener]],
) -> None:
    relay, wakes, inboxes, callbacks = two_streams
    on_engine_thread(lambda: put_tokens(callbacks, range(100)))
    loop.run_until_complete(asyncio.sleep(0))
    assert wakes == [] and all(inbox.take() == [] for inbox in inboxes)  # nobody waited
    relay.collect()
    for i, inbox in enumerate(inboxes):
        assert inbox.ready.is_set()
        assert inbox.take() == [(i, i, [token]) for token in range(100)]
        assert not inbox.ready.is_set() and inbox.take() == []


def test_a_waiting_stream_is_woken_once_for_every_token_sampled_until_the_loop_runs(
    loop: asyncio.AbstractEventLoop,
    two_streams: tuple[TokenRelay, list[int], list[TokenInbox], list[Listener]],
) -> None:
    relay, wakes, inboxes, callbacks = two_streams
    waiting = loop.create_task(relay.wait(inboxes[0]))
    loop.run_until_complete(asyncio.sleep(0))  # the stream now waits
    assert not waiting.done()
    on_engine_thread(lambda: put_tokens(callbacks, range(100)))  # while the loop is stopped
    loop.run_until_complete(asyncio.wait_for(waiting, 10))
    assert len(wakes) == 1
    for i, inbox in enumerate(inboxes):
        assert inbox.take() == [(i, i, [token]) for token in range(100)]

    callbacks[0](0, [7])  # nobody waits any more: no wake-up, the token waits for a collect
    loop.run_until_complete(asyncio.sleep(0))
    assert len(wakes) == 1 and inboxes[0].take() == []
    relay.collect()
    assert inboxes[0].take() == [(0, 0, [7])]


def test_a_token_that_came_just_before_the_wait_is_collected_by_it(
    loop: asyncio.AbstractEventLoop,
) -> None:
    relay = TokenRelay(loop)
    inbox = TokenInbox()
    relay.listener(inbox, 0)(0, [3])  # no stream was waiting: no wake-up scheduled
    loop.run_until_complete(asyncio.wait_for(relay.wait(inbox), 10))
    assert inbox.take() == [(0, 0, [3])]


def test_a_pause_ends_when_the_calls_finish_or_at_its_deadline(
    loop: asyncio.AbstractEventLoop,
) -> None:
    async def paused_then_finished() -> None:
        inbox = TokenInbox()
        asyncio.get_running_loop().call_soon(inbox.finish)
        await inbox.pause(asyncio.get_running_loop().time() + 3600)  # ended by finish
        assert inbox.finished and inbox.ready.is_set()
        await inbox.pause(float("inf"))  # finished: no pause at all

        other = TokenInbox()
        await other.pause(asyncio.get_running_loop().time() + 0.001)  # its deadline
        assert not other.finished

    loop.run_until_complete(asyncio.wait_for(paused_then_finished(), 10))
