"""Streamed tokens reach the event loop in batches: one wake-up for every stream's tokens
sampled since the last one, each stream's in order (``gateway/relay.py``)."""

from __future__ import annotations

import asyncio
import threading

from art_core.gateway.relay import TokenInbox, TokenRelay


def test_tokens_put_while_the_loop_is_busy_arrive_with_one_wake_up_in_order() -> None:
    loop = asyncio.new_event_loop()
    try:
        relay = TokenRelay(loop)
        inboxes = [TokenInbox(), TokenInbox()]
        wakes = []
        deliver = relay._deliver

        def counted() -> None:
            wakes.append(1)
            deliver()

        relay._deliver = counted  # type: ignore[method-assign]
        callbacks = [relay.listener(inbox, call=i) for i, inbox in enumerate(inboxes)]

        def engine() -> None:  # the engine's thread, while the loop runs nothing
            for token in range(100):
                for choice, on_tokens in enumerate(callbacks):
                    on_tokens(choice, [token])

        thread = threading.Thread(target=engine)
        thread.start()
        thread.join()
        loop.run_until_complete(asyncio.sleep(0))
        assert len(wakes) == 1
        for i, inbox in enumerate(inboxes):
            assert inbox.ready.is_set()
            assert inbox.take() == [(i, i, [token]) for token in range(100)]
            assert not inbox.ready.is_set() and inbox.take() == []

        callbacks[0](0, [7])  # the next token wakes the loop again
        loop.run_until_complete(asyncio.sleep(0))
        assert len(wakes) == 2 and inboxes[0].take() == [(0, 0, [7])]
    finally:
        loop.close()
