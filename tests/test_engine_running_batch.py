"""A batch that lives on while rows come and go: a row that joins it and outlives the rows it
joined answers exactly what it answers alone, and the batch drops the cache columns no row
uses any more (else a busy engine attends over an ever wider cache)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from art_core.embedded import resolve_base_model
from art_core.engines import transformers_engine
from art_core.engines.base import GenerationRequest, SamplingParams
from art_core.engines.transformers_engine import TransformersEngine

# The grammar rules out ending early: each row runs to its max_tokens.
LONG = "start: /[a-z]{4000,}/\n"


def request(prompt: list[int], max_tokens: int, on_tokens: Any = None) -> GenerationRequest:
    return GenerationRequest(
        prompt,
        SamplingParams(temperature=0.0, max_tokens=max_tokens, grammar=LONG),
        on_tokens=on_tokens,
    )


async def test_a_row_that_outlives_the_batch_it_joined_answers_as_alone_on_a_trimmed_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    widths: list[tuple[int, int, int]] = []  # (rows before, cache width before, after)
    select = transformers_engine._BatchState.select

    def spy(state: Any, keep: list[int]) -> None:
        before = (len(state.rows), state.attention.shape[1])
        select(state, keep)
        if 0 < len(keep) < before[0]:  # rows left, some stay
            widths.append((*before, state.attention.shape[1]))

    monkeypatch.setattr(transformers_engine._BatchState, "select", spy)
    engine = TransformersEngine(resolve_base_model("tiny-random"), dtype="float32", batch_window=0)
    await engine.start()
    try:
        first = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
        joiner = [20, 21, 22]
        [alone] = await engine.generate(request(joiner, 40))

        # The first row's first token holds the engine's thread until the joiner is queued,
        # so the joiner joins the running batch (never a batch of its own), on any machine.
        started = asyncio.Event()
        loop = asyncio.get_running_loop()

        def hold_until_joined(_choice: int, _ids: list[int]) -> None:
            if started.is_set():
                return
            loop.call_soon_threadsafe(started.set)
            deadline = time.monotonic() + 60
            while not engine._queue and time.monotonic() < deadline:  # on the engine's thread
                time.sleep(0.001)

        running = asyncio.ensure_future(engine.generate(request(first, 12, hold_until_joined)))
        await asyncio.wait_for(started.wait(), 60)
        joining = asyncio.ensure_future(engine.generate(request(joiner, 40)))
        [joined] = await asyncio.wait_for(joining, 120)
        [done] = await asyncio.wait_for(running, 60)
    finally:
        await engine.close()

    assert done.finish_reason == "length" and len(done.token_ids) == 12
    assert joined.token_ids == alone.token_ids
    assert joined.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
    # When the first row left, the columns only it used (its longer prompt's) went with it:
    # the joiner's cache is as wide as its own prompt and tokens, not the batch's history.
    [(_rows, before, after)] = [w for w in widths if w[0] == 2]
    assert after < before
    assert after <= len(joiner) + len(joined.token_ids)


async def test_requests_ending_at_one_step_are_answered_with_one_wake_up_of_their_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each hand-over to the caller's loop from the engine's thread lets the loop's thread
    take the interpreter lock mid-step: the rows that end together are answered in one."""
    engine = TransformersEngine(resolve_base_model("tiny-random"), dtype="float32", batch_window=0)
    await engine.start()
    loop = asyncio.get_running_loop()
    wake_ups = 0
    call_soon_threadsafe = loop.call_soon_threadsafe

    def counted(callback: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal wake_ups
        if threading.current_thread() is not threading.main_thread():
            wake_ups += 1
        return call_soon_threadsafe(callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_soon_threadsafe", counted)

    async def one_batch(prompts: list[list[int]]) -> tuple[int, list[Any]]:
        """The wake-ups of the caller's loop from the engine's side while ``prompts`` run as
        one batch, its end included (``pause`` waits for the batch to end)."""
        nonlocal wake_ups
        await engine.pause()  # queued together, they start as one batch on resume
        tasks = [asyncio.ensure_future(engine.generate(request(p, 6))) for p in prompts]
        await asyncio.sleep(0)  # each task queues its request (its grammar is cached)
        assert len(engine._queue) == len(prompts)
        wake_ups = 0
        await engine.resume()
        results = await asyncio.wait_for(asyncio.gather(*tasks), 120)
        await engine.pause()
        woken = wake_ups
        await engine.resume()
        return woken, [r for [r] in results]

    try:
        await engine.generate(request([1, 2], 6))  # compiles the grammar once
        alone, _ = await one_batch([[5, 6, 7]])
        together, results = await one_batch([[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]])
    finally:
        await engine.close()

    assert [len(r.token_ids) for r in results] == [6, 6, 6, 6]  # all ended at one step
    assert together == alone
