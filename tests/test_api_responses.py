"""OpenAI Responses at the gateway, driven by the real ``openai`` SDK over loopback.

Each call is recorded like a chat call (``api == "responses"``); multi-turn runs, whether
they echo the output items back or continue with ``previous_response_id``, are spliced onto
the sampled ids (token-exact), and a group of them trains.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

import art_core as art
from art_core.gateway.apis import responses as responses_api
from art_core.gateway.errors import APIError
from art_core.testing.checks import assert_token_exact
from art_core.testing.pytest_plugin import register_tiny_model

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
FORCE_WEATHER = {"type": "function", "name": "get_weather"}


async def test_text_input_with_instructions(tiny_model: art.TrainableModel) -> None:
    async with art.capture(tiny_model) as run:
        response = await run.openai_client().responses.create(
            model=run.model_name,
            instructions="Answer briefly.",
            input="Say hello",
            max_output_tokens=8,
            temperature=1.0,
        )
    assert response.object == "response" and response.id.startswith("resp")
    assert response.status in ("completed", "incomplete")
    assert [item.type for item in response.output] == ["message"]
    (call,) = run.calls
    assert call.api == "responses"
    assert call.messages == [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Say hello"},
    ]
    assert response.output_text == (call.response_message["content"] or "")
    assert response.usage.input_tokens == call.num_prompt_tokens
    assert response.usage.output_tokens == call.num_completion_tokens
    assert response.model_extra["token_ids"] == call.completion_token_ids
    assert call.request_params["max_output_tokens"] == 8
    if call.finish_reason == "length":
        assert response.status == "incomplete"
        assert response.incomplete_details.reason == "max_output_tokens"


async def _weather_turns(model: art.TrainableModel, i: int, *, chain: str) -> art.Trajectory:
    """A forced call, its output sent back (echoing the output items, or by
    previous_response_id), and a final answer."""
    async with art.capture(model) as run:
        client = run.openai_client()
        first_input: list[Any] = [{"role": "user", "content": f"task {i}: weather in Paris?"}]
        first = await client.responses.create(
            model=run.model_name,
            input=first_input,
            tools=[WEATHER],
            tool_choice=FORCE_WEATHER,
            max_output_tokens=40,
        )
        (call,) = [item for item in first.output if item.type == "function_call"]
        assert call.name == "get_weather" and json.loads(call.arguments)["city"] in {
            "Paris",
            "Tokyo",
            "Lima",
        }
        output = {"type": "function_call_output", "call_id": call.call_id, "output": f"sunny {i}"}
        if chain == "echo":
            echoed = [item.model_dump(exclude_none=True) for item in first.output]
            second = await client.responses.create(
                model=run.model_name,
                input=[*first_input, *echoed, output],
                tools=[WEATHER],
                max_output_tokens=12,
                store=False,
            )
        else:
            second = await client.responses.create(
                model=run.model_name,
                previous_response_id=first.id,
                input=[output],
                tools=[WEATHER],
                max_output_tokens=12,
            )
        assert second.status in ("completed", "incomplete")
    return run.trajectory(reward=float(i % 2))


@pytest.mark.parametrize("chain", ["echo", "previous_response_id"])
async def test_multi_turn_is_token_exact(tiny_model: art.TrainableModel, chain: str) -> None:
    trajectory = await _weather_turns(tiny_model, 0, chain=chain)
    first, second = trajectory.calls
    assert first.finish_reason == "tool_calls" and first.api == second.api == "responses"
    assert second.messages[-1] == {
        "role": "tool",
        "tool_call_id": first.response_message["tool_calls"][0]["id"],
        "content": "sunny 0",
    }
    # The second prompt is the first prompt, the sampled ids, then the tool turn.
    assert_token_exact(trajectory, tiny_model.backend().engine(tiny_model).tokenizer)


async def test_previous_response_id_unknown_and_not_stored(
    tiny_model: art.TrainableModel,
) -> None:
    async with art.capture(tiny_model) as run:
        client = run.openai_client()
        with pytest.raises(openai.BadRequestError, match="previous_response_id"):
            await client.responses.create(
                model=run.model_name, previous_response_id="resp_nope", input="hi"
            )
        unstored = await client.responses.create(
            model=run.model_name, input="hi", max_output_tokens=2, store=False
        )
        with pytest.raises(openai.BadRequestError, match="store: false"):
            await client.responses.create(
                model=run.model_name, previous_response_id=unstored.id, input="more"
            )
        assert unstored.store is False
    assert len(run.calls) == 1  # refused requests recorded nothing


async def test_stream_forced_call_and_text(tiny_model: art.TrainableModel) -> None:
    async with art.capture(tiny_model) as run:
        client = run.openai_client()
        kinds = []
        async with client.responses.stream(
            model=run.model_name,
            input="weather?",
            tools=[WEATHER],
            tool_choice=FORCE_WEATHER,
            max_output_tokens=40,
        ) as stream:
            async for event in stream:
                kinds.append(event.type)
            final = await stream.get_final_response()
        async with client.responses.stream(
            model=run.model_name, input="tell me a story", max_output_tokens=16
        ) as stream:
            text = ""
            async for event in stream:
                if event.type == "response.output_text.delta":
                    text += event.delta
            # A random model rarely ends by itself: cut by max_output_tokens, the stream ends
            # with response.incomplete (as OpenAI's does), which carries the response too.
            assert event.type in ("response.completed", "response.incomplete")
            story = event.response
    forced, told = run.calls
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in kinds
    assert "response.function_call_arguments.done" in kinds
    (call,) = [item for item in final.output if item.type == "function_call"]
    recorded = forced.response_message["tool_calls"][0]
    assert (call.call_id, call.name, call.arguments) == (
        recorded["id"],
        "get_weather",
        recorded["function"]["arguments"],
    )
    assert text == story.output_text == (told.response_message["content"] or "")
    assert story.usage.output_tokens == told.num_completion_tokens


async def test_custom_tool_with_regex_grammar(tiny_model: art.TrainableModel) -> None:
    tool = {
        "type": "custom",
        "name": "shell",
        "description": "Run a command",
        "format": {"type": "grammar", "syntax": "regex", "definition": "(ls|pwd) -[al]"},
    }
    async with art.capture(tiny_model) as run:
        client = run.openai_client()
        first = await client.responses.create(
            model=run.model_name,
            input="list files",
            tools=[tool],
            tool_choice={"type": "custom", "name": "shell"},
            max_output_tokens=40,
        )
        (call,) = [item for item in first.output if item.type == "custom_tool_call"]
        assert call.name == "shell" and re.fullmatch("(ls|pwd) -[al]", call.input)
        second = await client.responses.create(
            model=run.model_name,
            input=[
                {"role": "user", "content": "list files"},
                call.model_dump(exclude_none=True),
                {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "a.txt"},
            ],
            tools=[tool],
            max_output_tokens=4,
        )
    assert second.status in ("completed", "incomplete")
    assert_token_exact(run.trajectory(), tiny_model.backend().engine(tiny_model).tokenizer)


async def test_what_agents_send_is_accepted_and_named(tiny_model: art.TrainableModel) -> None:
    """A coding agent's request: hosted tools, namespaces, reasoning, include, cache keys."""
    namespace = {
        "type": "namespace",
        "name": "repo",
        "description": "Repository tools",
        "tools": [{**WEATHER, "name": "read_file"}],
    }
    async with art.capture(tiny_model) as run:
        response = await run.openai_client().responses.create(
            model=run.model_name,
            instructions="You are a coding agent.",
            input=[
                {"type": "message", "role": "developer", "content": "Sandbox: read-only."},
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "hi"}],
                },
                {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {}},
            ],
            tools=[WEATHER, namespace, {"type": "web_search"}],
            tool_choice={"type": "function", "name": "read_file", "namespace": "repo"},
            reasoning={"effort": "high", "summary": "auto"},
            include=["reasoning.encrypted_content"],
            prompt_cache_key="abc",
            store=False,
            parallel_tool_calls=False,
            max_output_tokens=32000,
        )
    (call,) = run.calls
    (item,) = [i for i in response.output if i.type == "function_call"]
    assert item.name == "read_file" and item.namespace == "repo"
    params = call.request_params
    assert {"include", "reasoning", "prompt_cache_key"} <= set(params["ignored_fields"])
    assert params["ignored_tools"] == ["web_search"]
    assert params["ignored_input_items"] == ["web_search_call"]
    context = tiny_model.backend().engine(tiny_model).context_length
    assert params["max_tokens_fitted"] == context - call.num_prompt_tokens
    # Instructions and the leading developer message make one system message.
    assert call.messages[0] == {
        "role": "system",
        "content": "You are a coding agent.\n\nSandbox: read-only.",
    }
    assert [t["function"]["name"] for t in call.tools] == ["get_weather", "repo__read_file"]


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            400,
            "text models",
        ),
        ({"input": 5}, 400, "input"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, 400, "item_reference"),
        ({"input": [{"type": "function_call", "name": "f"}]}, 400, "call_id"),
        ({"input": "hi", "tools": [{"type": "function", "name": "bad name"}]}, 400, "tools.0.name"),
        (
            {"input": "hi", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "x"}},
            400,
            "not among",
        ),
        ({"input": "hi", "conversation": "conv_1"}, 400, "conversation"),
        ({"input": "hi", "temperature": "hot"}, 400, "temperature"),
        ({"input": "hi", "model": "nope"}, 404, "does not exist"),
        ({"input": "hi", "text": {"format": {"type": "yaml"}}}, 400, "text.format"),
    ],
)
async def test_bad_requests_are_400_in_openai_shape(
    tiny_model: art.TrainableModel, body: dict[str, Any], status: int, needle: str
) -> None:
    async with art.capture(tiny_model) as run:
        async with httpx.AsyncClient() as http:
            answer = await http.post(
                f"{run.base_url}/responses", json={"model": run.model_name, **body}
            )
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert needle in error["message"] and error["type"]
    assert run.calls == []


async def test_a_group_of_responses_runs_trains(backend: art.LocalBackend) -> None:
    model = await register_tiny_model(backend, "responses-train")
    group = art.TrajectoryGroup(
        [await _weather_turns(model, i, chain="echo") for i in range(2)]
        + [await _weather_turns(model, i, chain="previous_response_id") for i in range(2, 4)]
    )
    result = await model.train([group], config=art.TrainConfig())
    assert await model.get_step() == 1, result
    folder = backend.model_folder(model).checkpoint(1)
    weights = load_file(str(folder / "adapter_model.safetensors"))
    assert any(k.endswith("lora_B.weight") and v.abs().sum() > 0 for k, v in weights.items())


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
ITEM_KEYS = st.sampled_from(
    [
        "type",
        "role",
        "content",
        "call_id",
        "name",
        "arguments",
        "input",
        "output",
        "summary",
        "namespace",
        "text",
        "format",
        "tools",
        "parameters",
        "definition",
        "syntax",
    ]
)
ITEM = st.dictionaries(
    ITEM_KEYS,
    JSON
    | st.sampled_from(
        [
            "message",
            "function_call",
            "function_call_output",
            "reasoning",
            "custom_tool_call",
            "custom",
            "function",
            "namespace",
            "user",
            "assistant",
            "developer",
            "grammar",
            "regex",
            "lark",
        ]
    ),
    max_size=6,
)


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,  # the same examples every run: CI cannot turn red by chance
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    inputs=st.lists(ITEM, max_size=5) | JSON,
    tools=st.lists(ITEM, max_size=3) | JSON,
    tool_choice=JSON | ITEM,
    text=JSON,
)
def test_translate_refuses_whatever_it_cannot_read_with_a_400(
    inputs: Any, tools: Any, tool_choice: Any, text: Any
) -> None:
    """Any JSON in any field: a translation, or an APIError 400 naming what was wrong."""
    payload = {
        "model": "m",
        "input": inputs,
        "tools": tools,
        "tool_choice": tool_choice,
        "text": text,
    }
    try:
        translated = responses_api.translate(payload)
    except APIError as exc:
        assert exc.status == 400 and exc.message
    else:
        assert translated.chat["messages"]
