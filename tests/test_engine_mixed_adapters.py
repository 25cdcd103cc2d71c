"""One batch serves rows of several adapters, and a new adapter is loaded between two decode
steps without draining: what pipelined training needs from the engine."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from lora_support import make_adapter
from transformers import AutoModelForCausalLM

from art_core.embedded import resolve_base_model
from art_core.engines.base import GenerationRequest, SamplingParams
from art_core.engines.lora import LoraServer
from art_core.engines.transformers_engine import TransformersEngine


@pytest.fixture(scope="module")
def base_path() -> Path:
    return resolve_base_model("tiny-random")


def test_rows_of_several_adapters_compute_what_each_computes_alone(
    base_path: Path, tmp_path: Path
) -> None:
    make_adapter(base_path, tmp_path / "a", seed=1)
    make_adapter(base_path, tmp_path / "b", seed=2)
    model = AutoModelForCausalLM.from_pretrained(base_path).eval()
    server = LoraServer(model)
    server.load("a", tmp_path / "a")
    server.load("b", tmp_path / "b")
    ids = torch.randint(0, 600, (3, 10))
    alone = {}
    with torch.no_grad():
        for name in ("a", "b", None):
            server.activate(name)
            alone[name] = model(ids).logits
        server.use_rows(["b", None, "a"])
        mixed = model(ids).logits
    torch.testing.assert_close(mixed[0], alone["b"][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mixed[1], alone[None][1], rtol=0, atol=0)
    torch.testing.assert_close(mixed[2], alone["a"][2], rtol=1e-5, atol=1e-5)
    assert (alone["a"] - alone["b"]).abs().max() > 1e-2  # the adapters really differ


def test_an_adapter_removed_while_rows_use_it_is_freed_when_they_finish(
    base_path: Path, tmp_path: Path
) -> None:
    make_adapter(base_path, tmp_path / "a", seed=1)
    model = AutoModelForCausalLM.from_pretrained(base_path).eval()
    server = LoraServer(model)
    server.load("a", tmp_path / "a")
    ids = torch.randint(0, 600, (2, 6))
    with torch.no_grad():
        server.use_rows(["a", None])
        before = model(ids).logits
        server.remove("a")  # rows still use it: they keep it
        assert server.names == []
        torch.testing.assert_close(model(ids).logits, before, rtol=0, atol=0)
        server.use_rows([None, None])  # no row uses it any more: freed
    with pytest.raises(KeyError):
        server.use_rows(["a"])


async def test_a_new_adapter_is_loaded_between_decode_steps_without_draining(
    base_path: Path, tmp_path: Path
) -> None:
    make_adapter(base_path, tmp_path / "one", seed=1)
    make_adapter(base_path, tmp_path / "two", seed=2)
    engine = TransformersEngine(base_path, dtype="float32", batch_window=0)
    await engine.start()
    try:
        await engine.load_adapter(tmp_path / "one", 1)
        started = asyncio.Event()
        loop = asyncio.get_running_loop()
        long_request = GenerationRequest(
            [5, 6, 7],
            # A long answer (the grammar rules out ending before max_tokens): the batch it
            # runs in goes on for hundreds of decode steps.
            SamplingParams(
                temperature=1.0, max_tokens=400, seed=0, grammar="start: /[a-z]{4000,}/\n"
            ),
            # Called on the engine's thread: wake this loop the thread-safe way.
            on_tokens=lambda _c, _ids: loop.call_soon_threadsafe(started.set),
        )
        running = asyncio.ensure_future(engine.generate(long_request))
        await asyncio.wait_for(started.wait(), 60)
        await asyncio.wait_for(engine.load_adapter(tmp_path / "two", 2), 60)
        short = GenerationRequest([5, 6], SamplingParams(temperature=0.0, max_tokens=3))
        [new] = await asyncio.wait_for(engine.generate(short), 60)
        assert new.adapter_step == 2
        # Served while the long request still runs: it joined its batch, nothing drained.
        assert not running.done()
        [old] = await asyncio.wait_for(running, 120)
        assert old.adapter_step == 1 and old.finish_reason == "length"
        # The greedy answer on step 2 inside the mixed batch is the one step 2 gives alone.
        [again] = await engine.generate(short)
        assert again.token_ids == new.token_ids and again.adapter_step == 2
    finally:
        await engine.close()


async def test_a_cancelled_adapter_load_never_fails_the_batch_it_would_have_joined(
    base_path: Path, tmp_path: Path
) -> None:
    make_adapter(base_path, tmp_path / "one", seed=1)
    engine = TransformersEngine(base_path, dtype="float32", batch_window=0)
    await engine.start()
    try:
        started = asyncio.Event()
        loop = asyncio.get_running_loop()
        long_request = GenerationRequest(
            [5, 6, 7],
            SamplingParams(
                temperature=1.0, max_tokens=300, seed=0, grammar="start: /[a-z]{4000,}/\n"
            ),
            on_tokens=lambda _c, _ids: loop.call_soon_threadsafe(started.set),
        )
        running = asyncio.ensure_future(engine.generate(long_request))
        await asyncio.wait_for(started.wait(), 60)
        # Loads given up by their callers (a cancelled train) at every point of their run.
        for attempt in range(20):
            load = asyncio.ensure_future(engine.load_adapter(tmp_path / "one", attempt + 1))
            await asyncio.sleep(0.002 * (attempt % 4))
            load.cancel()
            await asyncio.gather(load, return_exceptions=True)
        [result] = await asyncio.wait_for(running, 120)
        assert result.finish_reason == "length" and len(result.token_ids) == 300
    finally:
        await engine.close()
