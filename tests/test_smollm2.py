"""End to end on the embedded SmolLM2-135M-Instruct: offline, coherent, tool calls exact."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from rollout_checks import WEATHER_TOOL

import art_core as art

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
async def smol(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[tuple[art.LocalBackend, art.TrainableModel]]:
    backend = art.LocalBackend(path=tmp_path_factory.mktemp("smol"))
    model = art.TrainableModel(name="smol", project="tests", base_model="smollm2-135m")
    await model.register(backend)
    yield backend, model
    await backend.close()


async def test_smollm2_answers_coherently(
    smol: tuple[art.LocalBackend, art.TrainableModel],
) -> None:
    _, model = smol
    response = await model.openai_client().chat.completions.create(
        model=model.name,
        temperature=0.0,
        max_tokens=32,
        messages=[
            {"role": "user", "content": "What is the capital of France? Answer in one sentence."}
        ],
    )
    assert "Paris" in (response.choices[0].message.content or "")
    assert response.choices[0].finish_reason == "stop"


async def test_smollm2_tool_round_trip_is_token_exact(
    smol: tuple[art.LocalBackend, art.TrainableModel],
) -> None:
    backend, model = smol
    async with art.capture(model) as run:
        client = run.openai_client()
        messages: list[dict] = [{"role": "user", "content": "What's the weather in Tokyo?"}]
        first = await client.chat.completions.create(
            model=run.model_name,
            messages=messages,
            tools=[WEATHER_TOOL],
            tool_choice="required",
            max_tokens=48,
        )
        call = first.choices[0].message.tool_calls[0]
        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            {
                "role": "tool",
                "tool_call_id": call.id,
                "content": json.dumps({"sky": "clear", "celsius": 18}),
            },
        ]
        await client.chat.completions.create(
            model=run.model_name,
            messages=messages,
            tools=[WEATHER_TOOL],
            max_tokens=40,
            temperature=0.0,
        )
    first_call, second_call = run.trajectory().calls
    assert json.loads(call.function.arguments)["city"] in {"Paris", "Tokyo", "Lima"}
    tokenizer = backend.engine(model).tokenizer
    for recorded in (first_call, second_call):
        assert (
            tokenizer.decode(recorded.completion_token_ids, skip_special_tokens=False)
            == recorded.completion_text
        )
    prefix = first_call.prompt_token_ids + first_call.completion_token_ids
    assert second_call.prompt_token_ids[: len(prefix)] == prefix
    assert "clear" in tokenizer.decode(second_call.prompt_token_ids[len(prefix) :])


def test_converted_model_is_cached(smol: tuple[art.LocalBackend, art.TrainableModel]) -> None:
    backend, model = smol
    folder = Path(backend.engine(model).model_path)
    assert (folder / "config.json").is_file() and (folder / ".art-complete").is_file()
    assert not list(folder.glob("*.gguf"))
