"""Each model family through the gateway: its own tool-call format, forced and auto, streamed
and not, multi-turn token-exact, and a train step on its runs.

Per family, ``tiny-<family>`` (its real architecture, special tokens and chat template; random
weights) is fine-tuned for a few seconds on one tool-using conversation rendered by its own
template, so that it writes calls in its family's format by itself (``auto``). Forced calls
run on it at temperature 1: whatever it samples under the grammar must be a call.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from safetensors.torch import load_file

import art_core as art
from art_core.testing.checks import assert_token_exact
from art_core.testing.fine_tuned import fine_tuned_stand_in


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def backend(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[art.LocalBackend]:
    """This module's own backend, closed after it: the models it loads (one per family)
    do not stay loaded for the rest of the session."""
    async with art.LocalBackend(path=tmp_path_factory.mktemp("families")) as local:
        yield local


FAMILIES = ["qwen2.5", "qwen3", "qwen3-coder", "llama3", "mistral", "gpt-oss", "gemma3"]
# The format each family's template is detected as.
FORMATS = {
    "qwen2.5": "hermes",
    "qwen3": "hermes",
    "qwen3-coder": "qwen3_coder",
    "llama3": "llama3_json",
    "mistral": "mistral",
    "gpt-oss": "openai",
    "gemma3": "hermes",
}
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL_ID = "abc123XYZ"  # 9 alphanumerics: Mistral's templates accept no other ids
CONVERSATION = [
    *QUESTION,
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": CALL_ID,
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    },
    {"role": "tool", "tool_call_id": CALL_ID, "name": "get_weather", "content": "sunny"},
    {"role": "assistant", "content": "It is sunny in Paris."},
]


# Thinking families reason before each answer (their templates render reasoning in history).
THINKING = {"qwen3"}


def conversation(family: str) -> list[dict[str, Any]]:
    if family not in THINKING:
        return CONVERSATION
    return [
        {**m, "reasoning_content": "The tool knows."} if m["role"] == "assistant" else m
        for m in CONVERSATION
    ]


def stand_in(family: str) -> Path:
    """``tiny-<family>`` that has learned to call the tool, then answer, in its format."""
    return fine_tuned_stand_in(
        f"calls-{family}",
        [conversation(family)],
        steps=120,
        learning_rate=1e-2,
        base=f"tiny-{family}",
        tools=TOOLS,
        context=4096,
    )


async def registered(backend: art.LocalBackend, family: str) -> art.TrainableModel:
    model = art.TrainableModel(
        name=f"family-{family}", project="families", base_model=str(stand_in(family))
    )
    await model.register(backend)
    return model


def call_of(message: Any) -> tuple[str, dict[str, Any]]:
    [call] = message.tool_calls
    return call.function.name, json.loads(call.function.arguments)


@pytest.mark.parametrize("family", FAMILIES)
async def test_a_family_calls_tools_in_its_own_format_and_trains(
    backend: art.LocalBackend, family: str
) -> None:
    model = await registered(backend, family)
    chat = backend.gateway.models[model.name].chat
    assert chat.format.name == FORMATS[family]
    groups = []
    for stream in (False, True):
        async with art.capture(model) as run:
            client = run.openai_client()
            kwargs: dict[str, Any] = dict(
                model=run.model_name, tools=TOOLS, temperature=0.0, max_tokens=64
            )
            # Turn 1, auto: the model writes the call in its own format; the gateway parses it.
            if stream:
                name, arguments, call_id = "", "", ""
                async for chunk in await client.chat.completions.create(
                    messages=QUESTION, stream=True, **kwargs
                ):
                    for delta in chunk.choices[0].delta.tool_calls or []:
                        name += delta.function.name or ""
                        arguments += delta.function.arguments or ""
                        call_id = delta.id or call_id
                assert (name, json.loads(arguments)) == ("get_weather", {"city": "Paris"})
                answer: dict[str, Any] = {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": name, "arguments": arguments},
                        }
                    ],
                }
            else:
                first = await client.chat.completions.create(messages=QUESTION, **kwargs)
                assert first.choices[0].finish_reason == "tool_calls"
                assert call_of(first.choices[0].message) == ("get_weather", {"city": "Paris"})
                if family in THINKING:  # reasoning is returned apart from the content
                    assert first.choices[0].message.reasoning_content == "The tool knows."
                answer = first.choices[0].message.model_dump(exclude_none=True)
                call_id = first.choices[0].message.tool_calls[0].id
            if family == "mistral":
                assert len(call_id) == 9 and call_id.isalnum()
            # Turn 2: the tool's result; the prompt is spliced onto the sampled ids.
            second = await client.chat.completions.create(
                messages=[
                    *QUESTION,
                    answer,
                    {"role": "tool", "tool_call_id": call_id, "content": "sunny"},
                ],
                **kwargs,
            )
            assert second.choices[0].message.tool_calls is None
        trajectory = run.trajectory(reward=1.0 if stream else 0.0)
        assert len(trajectory.calls) == 2
        assert trajectory.calls[0].metadata["tool_call_parser"] == FORMATS[family]
        assert_token_exact(trajectory, chat.tokenizer)
        groups.append(trajectory)

    # Forced calls at temperature 1, streamed and not: every choice is a call of the tool.
    async with art.capture(model) as run:
        client = run.openai_client()
        forced = dict(
            model=run.model_name,
            messages=[{"role": "user", "content": "Anything."}],
            tools=TOOLS,
            tool_choice="required",
            temperature=1.0,
            max_tokens=48,
            seed=7,
        )
        response = await client.chat.completions.create(n=3, **forced)
        for choice in response.choices:
            assert choice.message.tool_calls, choice
            assert choice.message.tool_calls[0].function.name == "get_weather"
            if choice.finish_reason == "tool_calls":  # not cut by max_tokens: whole JSON
                assert isinstance(json.loads(choice.message.tool_calls[0].function.arguments), dict)
        names = ""
        async for chunk in await client.chat.completions.create(stream=True, **forced):
            for delta in chunk.choices[0].delta.tool_calls or []:
                names += delta.function.name or ""
        assert names == "get_weather"

    # A train step on the two runs (unequal rewards) changes the adapter.
    result = await model.train([art.TrajectoryGroup(groups)], config=art.TrainConfig())
    assert await model.get_step() == 1, result
    folder = backend.model_folder(model).checkpoint(1)
    weights = load_file(str(folder / "adapter_model.safetensors"))
    assert any(k.endswith("lora_B.weight") and v.abs().sum() > 0 for k, v in weights.items())
