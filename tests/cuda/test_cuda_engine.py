"""The transformers engine on cuda:0: bf16 weights, our LoRA layers as peft computes them,
seeded sampling that reproduces, and adapters hot-swapped while rows are decoding."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
import torch
from cuda_support import needs_cuda
from lora_support import make_adapter
from test_engine_lora import peft_logits, save_adapter
from transformers import AutoModelForCausalLM

from art_core.embedded import resolve_base_model
from art_core.engines.base import GenerationRequest, GenerationResult, SamplingParams
from art_core.engines.lora import LoraServer
from art_core.engines.transformers_engine import TransformersEngine

pytestmark = needs_cuda


@pytest.fixture(scope="module")
def base_path() -> Path:
    return resolve_base_model("tiny-random")


def chat_prompt(engine: TransformersEngine, text: str) -> list[int]:
    rendered = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True
    )
    return list(rendered["input_ids"])


async def one(engine: TransformersEngine, request: GenerationRequest) -> GenerationResult:
    [result] = await engine.generate(request)
    return result


def test_lora_layers_match_peft_in_bf16_on_cuda(base_path: Path, tmp_path: Path) -> None:
    """Our LoRA layers on a bf16 CUDA model compute what peft computes in fp32 on the CPU, to
    bf16's precision; switched off, the model is the base again, bit for bit."""
    adapter = save_adapter(
        base_path,
        tmp_path / "a",
        seed=3,
        r=8,
        lora_alpha=64,
        target_modules=["q_proj", "v_proj", "down_proj"],
    )
    ids = torch.randint(0, 600, (2, 12))
    expected = peft_logits(base_path, adapter, ids)
    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.bfloat16)
    model = model.to("cuda:0").eval()
    server = LoraServer(model)
    server.load("a", adapter)
    with torch.inference_mode():
        base = model(ids.cuda()).logits
        server.activate("a")
        served = model(ids.cuda()).logits
        server.activate(None)
        off_again = model(ids.cuda()).logits
    assert served.device.type == "cuda" and served.dtype == torch.bfloat16
    scale = float(expected.abs().max())
    error = float((served.float().cpu() - expected).abs().max())
    effect = float((served - base).abs().max())
    assert error < 0.05 * scale, (error, scale)
    assert effect > 4 * error, (effect, error)  # the adapter's change is far above bf16 noise
    torch.testing.assert_close(off_again, base, rtol=0, atol=0)


async def test_engine_serves_bf16_on_cuda_and_a_seed_reproduces(base_path: Path) -> None:
    engine = TransformersEngine(base_path, device="cuda:0")
    await engine.start()
    try:
        weight = next(engine.model.parameters())
        assert engine.dtype == torch.bfloat16 == weight.dtype and weight.device.type == "cuda"
        prompt = chat_prompt(engine, "hello there")
        results = await asyncio.gather(
            *(
                one(engine, GenerationRequest(prompt, SamplingParams(max_tokens=16, seed=i)))
                for i in range(16)
            )
        )
        for result in results:
            assert 0 < len(result.token_ids) == len(result.logprobs) <= 16
            assert all(math.isfinite(x) and x <= 0 for x in result.logprobs)
        assert engine.batches_run < 16  # the concurrent requests shared batches
        again = await one(engine, GenerationRequest(prompt, SamplingParams(max_tokens=16, seed=3)))
        alone = await one(engine, GenerationRequest(prompt, SamplingParams(max_tokens=16, seed=3)))
        assert again.token_ids == alone.token_ids
    finally:
        await engine.close()


async def test_adapters_hot_swap_while_rows_decode_on_cuda(base_path: Path, tmp_path: Path) -> None:
    """An adapter loaded mid-batch serves new requests (which join the running batch) while
    rows already decoding finish on the base they started with; two adapters share a batch."""
    make_adapter(base_path, tmp_path / "one", seed=1)
    make_adapter(base_path, tmp_path / "two", seed=2)
    engine = TransformersEngine(base_path, device="cuda:0")
    await engine.start()
    try:
        prompt = chat_prompt(engine, "tell me a story")
        greedy = SamplingParams(temperature=0.0, max_tokens=24)
        base = await one(engine, GenerationRequest(prompt, greedy))
        loop = asyncio.get_running_loop()
        started = asyncio.Event()
        decoded: list[int] = []  # the long rows' tokens, appended on the engine's thread

        def on_tokens(_choice: int, ids: list[int]) -> None:
            decoded.extend(ids)
            loop.call_soon_threadsafe(started.set)

        long = asyncio.ensure_future(
            engine.generate(
                GenerationRequest(
                    prompt, SamplingParams(max_tokens=400, n=4, seed=0), on_tokens=on_tokens
                )
            )
        )
        await started.wait()
        await engine.load_adapter(tmp_path / "one", 1)  # between two decode steps
        at_swap = len(decoded)
        tuned = await one(engine, GenerationRequest(prompt, greedy))
        rows = await long
        assert {r.adapter_step for r in rows} == {0}  # they started on the base
        assert sum(len(r.token_ids) for r in rows) > at_swap  # and decoded on past the swap
        assert tuned.adapter_step == 1 and tuned.token_ids != base.token_ids

        await engine.load_adapter(tmp_path / "two", 2)
        mixed = await asyncio.gather(
            one(engine, GenerationRequest(prompt, greedy, adapter="step-1")),
            one(engine, GenerationRequest(prompt, greedy, adapter="step-2")),
            one(engine, GenerationRequest(prompt, greedy)),
        )
        assert [r.adapter_step for r in mixed] == [1, 2, 2]
        assert mixed[0].token_ids != mixed[1].token_ids
        assert torch.cuda.memory_allocated() > 0
    finally:
        await engine.close()


async def test_the_prefix_cache_on_cuda_answers_as_without_it(base_path: Path) -> None:
    """fp32 on cuda:0: a group of runs sharing a prompt, n > 1 and a second turn give the same
    tokens with the prefix cache on and off, and the shared prompt is computed about once."""
    import random

    rng = random.Random(0)
    prompt = [rng.randrange(5, 690) for _ in range(400)]

    async def scenario(cache_bytes: int) -> tuple[list[list[int]], int]:
        engine = TransformersEngine(
            base_path, device="cuda:0", dtype="float32", prefix_cache_bytes=cache_bytes
        )
        await engine.start()
        try:
            greedy = SamplingParams(temperature=0.0, max_tokens=16)
            first = await asyncio.gather(
                *(engine.generate(GenerationRequest(prompt, greedy)) for _ in range(4)),
                engine.generate(
                    GenerationRequest(prompt, SamplingParams(seed=1, max_tokens=16, n=3))
                ),
            )
            results = [r for group in first for r in group]
            turn = [*prompt, *results[0].token_ids, 7, 8, 9]
            results += await engine.generate(GenerationRequest(turn, greedy))
            return [r.token_ids for r in results], engine.prefill_tokens_computed
        finally:
            await engine.close()

    on, computed_on = await scenario(64 << 20)
    off, computed_off = await scenario(0)
    assert on == off
    assert computed_off >= 8 * 400
    assert computed_on <= 400 + 8 * 16 + 40
