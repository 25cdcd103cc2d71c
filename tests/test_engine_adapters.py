"""LoRA adapters load and swap between requests; each call records the step that served it."""

from __future__ import annotations

from pathlib import Path

from lora_support import make_adapter

import art_core as art


async def test_adapter_swap_changes_outputs_and_records_step(
    backend: art.LocalBackend, tiny_model: art.TrainableModel, tmp_path: Path
) -> None:
    engine = backend.engine(tiny_model)
    make_adapter(engine.model_path, tmp_path / "a7", seed=1)
    request = dict(
        model=tiny_model.name,
        messages=[{"role": "user", "content": "same prompt"}],
        max_tokens=16,
        temperature=0.0,
    )

    async def served(model_name: str) -> tuple[list[int], int]:
        async with art.capture(tiny_model) as run:
            await run.openai_client().chat.completions.create(**{**request, "model": model_name})
        [call] = run.trajectory().calls
        return call.completion_token_ids, call.adapter_step

    before_ids, before_step = await served(tiny_model.name)
    await backend.server.call(engine.load_adapter(tmp_path / "a7", 7))
    try:
        after_ids, after_step = await served(tiny_model.name)
        pinned_base_ids, pinned_base_step = await served(f"{tiny_model.name}@0")
        pinned_ids, pinned_step = await served(f"{tiny_model.name}@7")
    finally:
        # leave the shared model as the other tests expect it: serving the base weights
        engine._current = None
    assert before_step == 0 and after_step == 7 and pinned_step == 7 and pinned_base_step == 0
    assert after_ids != before_ids
    assert pinned_ids == after_ids and pinned_base_ids == before_ids
