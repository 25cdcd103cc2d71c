"""``TransformersEngine(compile_decode=True)`` serves what the eager engine serves.

Two engines over the same model folder (tiny-random's architecture, seeded weights of a larger
scale so that rows do not just repeat their last token; fp32), one eager and one compiled,
are sent the same requests: seeded sampling (each row's own generator), prompts of different
lengths, token budgets that end rows at different steps (rows leave the compiled buffers),
requests that arrive while a batch runs (rows join it), a row that outgrows the first width
bucket (128 columns), ``n`` choices, a second turn whose prompt is the first turn's prompt and
answer (its prefix read from the KV the compiled step held), two checkpoints of one adapter
(same targets and rank: served by the graphs compiled for the first, none added), and a
batch whose rows use both checkpoints at once (decoded eagerly, then compiled again when one
is left). Every token must be the eager engine's and every logprob within ``ATOL``. The
engines compile into the test run's shared cache (``shared_cache_home``: what another test
compiled is loaded, not compiled again); no timing is asserted.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from lora_support import make_adapter
from sharp_support import sharp_model_folder

from art_core.embedded import resolve_base_model
from art_core.engines.base import GenerationRequest, SamplingParams
from art_core.engines.compiled_step import compiled_variants
from art_core.engines.transformers_engine import TransformersEngine

ATOL = 1e-4  # fp32 logprobs: the compiled step sums in another order


def request(
    prompt: list[int],
    tokens: int,
    seed: int,
    adapter: str | None = None,
    n: int = 1,
    on_tokens: Any = None,
) -> GenerationRequest:
    params = SamplingParams(max_tokens=tokens, temperature=1.0, seed=seed, n=n)
    return GenerationRequest(prompt, params, adapter, on_tokens=on_tokens)


PROMPTS = [[5, 17, 300, 42, 8, 99, 123], [7, 7, 250], list(range(600, 611)), [31, 41, 59, 26]]


async def serve(folder: Path, adapters: list[Path], *, compiled: bool) -> dict[str, Any]:
    engine = TransformersEngine(folder, dtype="float32", compile_decode=compiled)
    await engine.start()
    out: dict[str, Any] = {}
    try:
        # Rows ending at different steps, one past 128 columns, n choices; late arrivals join:
        # the long row's 5th token holds the engine's thread until they are queued, so they
        # join the running batch (after its first decode steps) on any machine.
        queued = asyncio.Event()
        loop = asyncio.get_running_loop()
        seen = [0]

        def hold_until_joined(_choice: int, ids: list[int]) -> None:
            seen[0] += len(ids)
            if seen[0] != 5:
                return
            loop.call_soon_threadsafe(queued.set)
            deadline = time.monotonic() + 60
            while len(engine._queue) < len(PROMPTS) and time.monotonic() < deadline:
                time.sleep(0.001)

        first = [
            engine.generate(
                request(p, tokens, seed=i, n=1 + (i == 1), on_tokens=hold if i == 2 else None)
            )
            for i, (p, tokens, hold) in enumerate(
                zip(PROMPTS, (6, 19, 130, 33), [hold_until_joined] * 4, strict=True)
            )
        ]
        started = asyncio.gather(*first)
        await asyncio.wait_for(queued.wait(), 60)
        late = asyncio.gather(
            *(
                engine.generate(request(p[::-1], 9 + 4 * i, seed=10 + i))
                for i, p in enumerate(PROMPTS)
            )
        )
        out["base"] = await started + await late
        # A second turn: the first turn's prompt and answer, then more.
        answer = out["base"][0][0].token_ids
        out["turn"] = [await engine.generate(request(PROMPTS[0] + answer + [3, 4], 12, seed=20))]
        variants = compiled_variants()
        await engine.load_adapter(adapters[0], 1, name="ckpt-1")
        out["ckpt-1"] = await asyncio.gather(
            *(engine.generate(request(p, 15, seed=30 + i)) for i, p in enumerate(PROMPTS))
        )
        after_first = compiled_variants()
        await engine.load_adapter(adapters[1], 2, name="ckpt-2")
        out["ckpt-2"] = await asyncio.gather(
            *(engine.generate(request(p, 15, seed=40 + i)) for i, p in enumerate(PROMPTS))
        )
        out["graphs"] = (variants, after_first, compiled_variants())
        # Rows of both checkpoints in one batch; the ckpt-2 rows outlive the ckpt-1 ones.
        out["mixed"] = await asyncio.gather(
            *(
                engine.generate(
                    request(p, 5 + 20 * (i % 2), seed=50 + i, adapter=f"ckpt-{1 + i % 2}")
                )
                for i, p in enumerate(PROMPTS)
            )
        )
        out["steps"] = engine.compiled_steps
        out["off"] = engine.compiled_decode_off
    finally:
        await engine.close()
    return out


@pytest.mark.slow
async def test_compiled_engine_serves_what_the_eager_engine_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared_cache_home: Path
) -> None:
    monkeypatch.setenv("ART_CORE_CACHE_DIR", str(shared_cache_home))
    folder = sharp_model_folder(tmp_path / "model")
    adapters = [tmp_path / "ckpt-1", tmp_path / "ckpt-2"]
    for seed, adapter in enumerate(adapters, start=1):
        make_adapter(folder, adapter, seed)
    eager = await serve(folder, adapters, compiled=False)
    compiled = await serve(folder, adapters, compiled=True)

    assert compiled["off"] is None
    assert compiled["steps"] > 100
    before, after_first, after_second = compiled["graphs"]
    assert after_first > before  # the adapter's forwards are new to the base model's graphs
    assert after_second == after_first  # the next checkpoint: the same graphs
    for part in ("base", "turn", "ckpt-1", "ckpt-2", "mixed"):
        for ours, theirs in zip(compiled[part], eager[part], strict=True):
            for mine, reference in zip(ours, theirs, strict=True):
                assert mine.token_ids == reference.token_ids, part
                assert mine.finish_reason == reference.finish_reason
                assert mine.adapter_step == reference.adapter_step
                assert torch.allclose(
                    torch.tensor(mine.logprobs), torch.tensor(reference.logprobs), atol=ATOL
                ), part
    # The long row decoded past the first width bucket; the checkpoints changed the answers.
    assert len(eager["base"][2][0].token_ids) == 130
    assert eager["ckpt-1"][0][0].token_ids != eager["ckpt-2"][0][0].token_ids


async def test_a_model_the_fixed_width_step_does_not_fit_decodes_eagerly(tmp_path: Path) -> None:
    """gemma3 alternates sliding-window layers: the engine says so and serves eagerly."""
    engine = TransformersEngine(resolve_base_model("tiny-gemma3"), compile_decode=True)
    await engine.start()
    try:
        [result] = await engine.generate(request([5, 6, 7], 4, seed=0))
        assert len(result.token_ids) == 4
        assert "not one plain tensor pair per token" in (engine.compiled_decode_off or "")
        assert engine.compiled_steps == 0
        assert engine.metrics()["decode/compiled_steps"] == 0
    finally:
        await engine.close()


def test_compile_decode_reaches_every_engine_the_server_starts(tmp_path: Path) -> None:
    """``art-core serve --compile-decode``: in the settings, the backend, an engine worker's
    command line and the worker's own arguments."""
    import argparse

    from art_core.backends.local import LocalBackend
    from art_core.engines import worker
    from art_core.engines.worker_engine import COMPILING_STARTUP_TIMEOUT_S, WorkerEngine
    from art_core.server.cli import add_arguments, settings_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert settings_from_args(parser.parse_args([])).compile_decode is False
    settings = settings_from_args(parser.parse_args(["--compile-decode"]))
    assert settings.compile_decode is True
    assert LocalBackend(tmp_path, compile_decode=True).compile_decode is True
    model = resolve_base_model("tiny-random")
    compiling = WorkerEngine(model, log_dir=tmp_path, compile_decode=True)
    assert "--compile-decode" in compiling._command(8000)
    assert compiling.startup_timeout_s == COMPILING_STARTUP_TIMEOUT_S  # it compiles at start
    plain = WorkerEngine(model, log_dir=tmp_path)
    assert "--compile-decode" not in plain._command(8000)
    assert plain.startup_timeout_s < COMPILING_STARTUP_TIMEOUT_S
    arguments = worker.parse_args(["--model", str(model), "--port", "1", "--compile-decode"])
    assert arguments.compile_decode is True
