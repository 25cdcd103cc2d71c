"""The real embedded model end to end: smollm2-135m trained a few GRPO steps, then exported
in every format, each loaded back in the library it is for (peft, transformers, transformers'
GGUF reader) and decoding greedily the same tokens the gateway served from that checkpoint."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

import art_core as art
from art_core.embedded import resolve_base_model
from art_core.training import TrainConfig

pytestmark = pytest.mark.slow
PROMPTS = ["Name a fruit.", "Name a colour."]
STEPS = 2


@pytest.fixture(scope="module")
async def backend(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[art.LocalBackend]:
    # fp32 on every CPU, so the fp32 reloads can be compared token for token.
    async with art.LocalBackend(
        path=tmp_path_factory.mktemp("smollm2-export"), dtype="float32"
    ) as local:
        yield local


async def _rollout(model: art.TrainableModel, prompt: str, seed: int) -> art.Trajectory:
    async with art.capture(model) as run:
        answer = await run.openai_client().chat.completions.create(
            model=run.model_name,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=8,
            temperature=1.0,
            seed=seed,
        )
    text = answer.choices[0].message.content or ""
    return run.trajectory(reward=float(len(text) % 3))  # varies: every group has a signal


@pytest.fixture(scope="module")
async def served(backend: art.LocalBackend) -> tuple[art.TrainableModel, art.LLMCall]:
    model = art.TrainableModel(name="smollm2-export", project="export", base_model="smollm2-135m")
    await model.register(backend)
    for attempt in range(3 * STEPS):
        if await model.get_step() == STEPS:
            break
        groups = await art.gather_trajectory_groups(
            (
                art.TrajectoryGroup(
                    _rollout(model, p, 100 * attempt + 10 * i + j) for j in range(4)
                )
                for i, p in enumerate(PROMPTS)
            ),
            pbar_desc=None,
        )
        await model.train(groups, config=TrainConfig(learning_rate=5e-4, precision="fp32"))
    assert await model.get_step() == STEPS
    async with art.capture(model) as run:
        await run.openai_client().chat.completions.create(
            model=run.model_name,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=12,
            temperature=0,
        )
    (call,) = run.calls
    assert call.adapter_step == STEPS
    return model, call


def _greedy(model: torch.nn.Module, call: art.LLMCall) -> list[int]:
    prompt = torch.tensor([call.prompt_token_ids])
    with torch.no_grad():
        out = model.eval().generate(  # type: ignore[operator]
            prompt,
            attention_mask=torch.ones_like(prompt),
            do_sample=False,
            max_new_tokens=len(call.completion_token_ids),
        )
    return [int(t) for t in out[0, prompt.shape[1] :]]


async def test_every_format_decodes_what_the_gateway_served(
    served: tuple[art.TrainableModel, art.LLMCall], tmp_path: Path
) -> None:
    model, call = served
    expected = call.completion_token_ids

    peft = await model.export(tmp_path / "peft", format="peft")
    assert peft.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct" and peft.step == STEPS
    # No hub here: the adapter goes onto the same base, from the local embedded copy.
    base = AutoModelForCausalLM.from_pretrained(
        resolve_base_model("smollm2-135m"), dtype=torch.float32
    )
    assert _greedy(PeftModel.from_pretrained(base, peft.path), call) == expected

    merged = await model.export(tmp_path / "merged", format="merged")
    loaded = AutoModelForCausalLM.from_pretrained(merged.path, dtype=torch.float32)
    assert _greedy(loaded, call) == expected

    gguf = await model.export(tmp_path / "gguf", format="gguf", gguf_type="f32")
    [file] = [p.name for p in gguf.path.glob("*.gguf")]
    assert (gguf.path / "Modelfile").read_text().startswith(f"FROM ./{file}")
    from_gguf = AutoModelForCausalLM.from_pretrained(gguf.path, gguf_file=file, dtype=torch.float32)
    assert _greedy(from_gguf, call) == expected
