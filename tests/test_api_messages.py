"""Anthropic Messages at the gateway, driven by the real ``anthropic`` SDK over loopback.

Each call is recorded like a chat call (``api == "messages"``); multi-turn runs that echo
the answer's blocks back (``tool_use`` then ``tool_result``) are spliced onto the sampled
ids (token-exact), streamed or not, and a group of them trains.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any, cast

import anthropic
import httpx
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

import art_core as art
from art_core.engines.base import EngineError, EngineUnavailable
from art_core.gateway import answering
from art_core.gateway.apis import messages as messages_api
from art_core.gateway.deltas import Recorded, StreamedText, TextDelta
from art_core.gateway.errors import APIError
from art_core.gateway.reading import Translated
from art_core.testing.checks import assert_token_exact
from art_core.testing.pytest_plugin import register_tiny_model
from art_core.trajectories import LLMCall

CITIES = {"Paris", "Tokyo", "Lima"}
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": sorted(CITIES)}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
FORCE_WEATHER = {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}


def _engine(model: art.TrainableModel) -> Any:
    backend: Any = model.backend()
    return backend.engine(model)


def _tokenizer(model: art.TrainableModel) -> Any:
    return _engine(model).tokenizer


async def test_create_plain_text(tiny_model: art.TrainableModel) -> None:
    async with art.capture(tiny_model) as run:
        message = await run.anthropic_client().messages.create(
            model=run.model_name,
            system=[
                {"type": "text", "text": "Answer briefly.", "cache_control": {"type": "ephemeral"}}
            ],
            messages=[{"role": "user", "content": [{"type": "text", "text": "Say hello"}]}],
            max_tokens=8,
            metadata={"user_id": "user-1"},
            extra_body={"temperature": 1.0, "top_k": 50},
        )
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_") and message.model == tiny_model.get_inference_name()
    (call,) = run.calls
    assert call.api == "messages"
    assert call.messages == [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Say hello"},
    ]
    (block,) = message.content  # no tools: one text block, even an empty one
    assert block.type == "text" and block.text == (call.response_message["content"] or "")
    assert message.usage.input_tokens == call.num_prompt_tokens
    assert message.usage.output_tokens == call.num_completion_tokens
    assert message.usage.cache_read_input_tokens == message.usage.cache_creation_input_tokens == 0
    expected = {"stop": "end_turn", "length": "max_tokens"}[call.finish_reason]
    assert message.stop_reason == expected and message.stop_sequence is None
    assert message.model_extra["token_ids"] == call.completion_token_ids
    assert message.model_extra["call_id"] == call.id
    params = call.request_params
    assert (params["max_tokens"], params["temperature"], params["top_k"]) == (8, 1.0, 50)
    assert call.metadata["user_id"] == "user-1"


async def _weather_turns(
    model: art.TrainableModel, i: int, *, stream: bool
) -> tuple[art.Trajectory, list[Any]]:
    """A forced tool call, its blocks echoed back with a tool_result, an answer, one more
    user turn: each turn through ``messages.create`` or ``messages.stream``."""
    async with art.capture(model) as run:
        client = run.anthropic_client()
        finals: list[Any] = []
        kinds: list[list[str]] = []

        async def turn(**kwargs: Any) -> Any:
            if not stream:
                message = await client.messages.create(model=run.model_name, **kwargs)
            else:
                seen = []
                async with client.messages.stream(model=run.model_name, **kwargs) as events:
                    async for event in events:
                        seen.append(event.type)
                    message = await events.get_final_message()
                kinds.append(seen)
            finals.append(message)
            return message

        conversation: list[dict[str, Any]] = [
            {"role": "user", "content": f"task {i}: weather in Paris?"}
        ]
        first = await turn(
            messages=conversation, tools=[WEATHER], tool_choice=FORCE_WEATHER, max_tokens=40
        )
        assert first.stop_reason == "tool_use"
        (use,) = [b for b in first.content if b.type == "tool_use"]
        assert use.name == "get_weather" and use.input["city"] in CITIES
        conversation += [
            {"role": "assistant", "content": first.content},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": use.id, "content": f"sunny {i}"}
                ],
            },
        ]
        second = await turn(messages=conversation, tools=[WEATHER], max_tokens=12)
        conversation += [
            {"role": "assistant", "content": second.content},
            {"role": "user", "content": "thanks, anything else?"},
        ]
        await turn(
            messages=conversation, tools=[WEATHER], tool_choice={"type": "none"}, max_tokens=8
        )
    return run.trajectory(reward=float(i % 2)), [finals, kinds]


def _check_matches_record(message: Any, call: LLMCall) -> None:
    """The SDK's message (created, or accumulated from the stream) is the recorded answer."""
    recorded = call.response_message
    text = "".join(b.text for b in message.content if b.type == "text")
    assert text == (recorded["content"] or "")
    uses = [(b.id, b.name, b.input) for b in message.content if b.type == "tool_use"]
    assert uses == [
        (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in recorded.get("tool_calls") or []
    ]
    assert message.usage.output_tokens == call.num_completion_tokens
    assert message.usage.input_tokens == call.num_prompt_tokens


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
async def test_multi_turn_tool_use_is_token_exact(
    tiny_model: art.TrainableModel, stream: bool
) -> None:
    trajectory, (finals, kinds) = await _weather_turns(tiny_model, 0, stream=stream)
    first, second, third = trajectory.calls
    assert {c.api for c in trajectory.calls} == {"messages"}
    assert first.finish_reason == "tool_calls"
    tool_call = first.response_message["tool_calls"][0]
    assert second.messages[-2]["tool_calls"][0]["id"] == tool_call["id"]
    assert second.messages[-1] == {
        "role": "tool",
        "tool_call_id": tool_call["id"],
        "content": "sunny 0",
    }
    assert third.messages[-1] == {"role": "user", "content": "thanks, anything else?"}
    # Each prompt is the previous prompt, its sampled ids, then the new turns.
    assert_token_exact(trajectory, _tokenizer(tiny_model))
    for message, call in zip(finals, trajectory.calls, strict=True):
        _check_matches_record(message, call)
    if stream:
        for seen in kinds:
            assert seen[0] == "message_start" and seen[-2:] == ["message_delta", "message_stop"]
            assert seen.count("content_block_start") == seen.count("content_block_stop") >= 1
        assert "input_json" in kinds[0]  # the forced call's input, as the SDK sees it


async def test_stream_raw_events_as_documented(tiny_model: art.TrainableModel) -> None:
    async with art.capture(tiny_model) as run:
        async with httpx.AsyncClient() as http:
            answer = await http.post(
                f"{run.anthropic_base_url}/v1/messages",
                json={
                    "model": run.model_name,
                    "messages": [{"role": "user", "content": "weather?"}],
                    "tools": [WEATHER],
                    "tool_choice": FORCE_WEATHER,
                    "max_tokens": 40,
                    "stream": True,
                },
            )
    assert answer.status_code == 200 and answer.headers["content-type"].startswith(
        "text/event-stream"
    )
    events = []
    for chunk in answer.text.strip().split("\n\n"):
        kind, data = chunk.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert kind == f"event: {event['type']}"
        events.append(event)
    (call,) = run.calls
    assert [e["type"] for e in events][:2] == ["message_start", "ping"]
    assert events[0]["message"]["usage"]["input_tokens"] == call.num_prompt_tokens
    assert events[0]["message"]["content"] == [] and events[0]["message"]["stop_reason"] is None
    uses = [e for e in events if e["type"] == "content_block_start"]
    assert uses[-1]["content_block"]["type"] == "tool_use"
    index = uses[-1]["index"]
    partial = "".join(
        e["delta"]["partial_json"]
        for e in events
        if e["type"] == "content_block_delta" and e["index"] == index
    )
    assert json.loads(partial) == json.loads(
        call.response_message["tool_calls"][0]["function"]["arguments"]
    )
    delta = events[-2]
    assert delta["type"] == "message_delta" and delta["delta"]["stop_reason"] == "tool_use"
    assert delta["usage"]["output_tokens"] == call.num_completion_tokens
    assert delta["token_ids"] == call.completion_token_ids and delta["call_id"] == call.id
    assert events[-1] == {"type": "message_stop"}


async def test_count_tokens_is_the_prompt_create_runs(tiny_model: art.TrainableModel) -> None:
    request: dict[str, Any] = {
        "system": "You check the weather.",
        "messages": [{"role": "user", "content": "weather in Lima?"}],
        "tools": [WEATHER],
    }
    async with art.capture(tiny_model) as run:
        client = run.anthropic_client()
        counted = await client.messages.count_tokens(model=run.model_name, **request)
        # The plain route (no rollout) counts the same prompt.
        root = run.anthropic_base_url.split("/rollouts/")[0]
        async with anthropic.AsyncAnthropic(base_url=root, api_key="art") as plain:
            counted_plain = await plain.messages.count_tokens(model=run.model_name, **request)
        first = await client.messages.create(
            model=run.model_name, tool_choice=FORCE_WEATHER, max_tokens=40, **request
        )
        # In the rollout, the count of the next turn is spliced onto the first call's ids.
        (use,) = [b for b in first.content if b.type == "tool_use"]
        request["messages"] = [
            *request["messages"],
            {"role": "assistant", "content": first.content},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "cold"}],
            },
        ]
        counted_next = await client.messages.count_tokens(model=run.model_name, **request)
        await client.messages.create(model=run.model_name, max_tokens=4, **request)
    one, two = run.calls
    assert counted.input_tokens == counted_plain.input_tokens == one.num_prompt_tokens
    assert counted_next.input_tokens == two.num_prompt_tokens
    assert two.prompt_token_ids[: one.num_prompt_tokens] == one.prompt_token_ids
    assert len(run.calls) == 2  # counting records nothing


async def test_sdk_errors(tiny_model: art.TrainableModel) -> None:
    async with art.capture(tiny_model) as run:
        client = run.anthropic_client(max_retries=0)
        with pytest.raises(anthropic.NotFoundError, match="does not exist"):
            await client.messages.create(
                model="no-such-model", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
            )
        with pytest.raises(anthropic.BadRequestError, match="text models") as refused:
            await client.messages.create(
                model=run.model_name,
                max_tokens=4,
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image",
                                "source": {
                                    "type": "base64",
                                    "media_type": "image/png",
                                    "data": "x",
                                },
                            }
                        ],
                    }
                ],
            )
        body: Any = refused.value.body
        assert body["error"]["type"] == "invalid_request_error"
        with pytest.raises(anthropic.NotFoundError):
            await client.messages.count_tokens(
                model="no-such-model", messages=[{"role": "user", "content": "hi"}]
            )
    assert run.calls == []


def _post(base_url: str, body: dict[str, Any], path: str = "/v1/messages") -> httpx.Response:
    return httpx.post(f"{base_url}{path}", json=body, timeout=30)


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({}, 400, "max_tokens"),
        ({"max_tokens": 0}, 400, "max_tokens"),
        ({"max_tokens": 4, "model": "nope"}, 404, "does not exist"),
        ({"max_tokens": 4, "messages": []}, 400, "messages"),
        ({"max_tokens": 4, "messages": "hi"}, 400, "messages"),
        ({"max_tokens": 4, "messages": [{"role": "tool", "content": "x"}]}, 400, "role"),
        ({"max_tokens": 4, "messages": [{"role": "user", "content": 5}]}, 400, "content"),
        ({"max_tokens": 4, "messages": [{"role": "user", "content": [5]}]}, 400, "content.0"),
        (
            {"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "video"}]}]},
            400,
            "video",
        ),
        (
            {
                "max_tokens": 4,
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "The answer is"},
                ],
            },
            400,
            "prefill",
        ),
        (
            {
                "max_tokens": 4,
                "messages": [
                    {"role": "user", "content": "hi"},
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "a", "name": "f", "input": [1]}],
                    },
                    {"role": "user", "content": "go on"},
                ],
            },
            400,
            "messages.1.content.0.input",
        ),
        (
            {"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
            400,
            "messages.0.content.0.text",
        ),
        ({"max_tokens": 4, "messages": [{"role": "user", "content": [[[[[[]]]]]] * 30}]}, 400, ""),
        ({"max_tokens": 4, "metadata": [1] * 70 + [[[[[[[[[[[[1]]]]]]]]]]]]}, 400, "metadata"),
        ({"max_tokens": 4, "temperature": 1.5}, 400, "temperature"),
        ({"max_tokens": 4, "temperature": "hot"}, 400, "temperature"),
        ({"max_tokens": 4, "stop_sequences": ["a", "b", "c", "d", "e"]}, 400, "stop_sequences"),
        ({"max_tokens": 4, "system": [{"type": "text", "text": 3}]}, 400, "system.0.text"),
        ({"max_tokens": 4, "tools": [{"name": "bad name", "input_schema": {}}]}, 400, "tools.0"),
        ({"max_tokens": 4, "tools": [{"name": "f"}]}, 400, "input_schema"),
        (
            {"max_tokens": 4, "tools": [{"name": "f", "input_schema": {"type": "string"}}]},
            400,
            "'object'",
        ),
        ({"max_tokens": 4, "tool_choice": {"type": "tool", "name": "x"}}, 400, "not among"),
        ({"max_tokens": 4, "tool_choice": "auto"}, 400, "tool_choice"),
        ({"max_tokens": 4, "output_config": {"format": {"type": "yaml"}}}, 400, "output_config"),
    ],
)
async def test_bad_requests_in_anthropic_shape(
    tiny_model: art.TrainableModel, body: dict[str, Any], status: int, needle: str
) -> None:
    async with art.capture(tiny_model) as run:
        payload = {"model": run.model_name, "messages": [{"role": "user", "content": "hi"}]}
        async with httpx.AsyncClient() as http:
            answer = await http.post(
                f"{run.anthropic_base_url}/v1/messages", json={**payload, **body}
            )
    assert answer.status_code == status, answer.text
    error = answer.json()
    assert error["type"] == "error" and set(error["error"]) == {"type", "message"}
    assert error["error"]["type"] == (
        "not_found_error" if status == 404 else "invalid_request_error"
    )
    assert needle in error["error"]["message"]
    assert run.calls == []


async def test_hostile_bodies_are_400(tiny_model: art.TrainableModel) -> None:
    deep = "[" * 200 + "]" * 200
    bodies = [
        b'{"model": "m", "max_tokens": 4, "messages": ' + deep.encode() + b"}",
        b"not json",
        b"[1, 2]",
    ]
    async with art.capture(tiny_model) as run:
        async with httpx.AsyncClient() as http:
            for raw in bodies:
                for path in ("/v1/messages", "/v1/messages/count_tokens"):
                    answer = await http.post(
                        f"{run.anthropic_base_url}{path}",
                        content=raw,
                        headers={"content-type": "application/json"},
                    )
                    assert answer.status_code == 400, answer.text
                    assert answer.json()["error"]["type"] == "invalid_request_error"
    assert run.calls == []


async def test_prompt_too_long_names_both_numbers(tiny_model: art.TrainableModel) -> None:
    context = _engine(tiny_model).context_length
    async with art.capture(tiny_model) as run:
        with pytest.raises(anthropic.BadRequestError, match=str(context)):
            await run.anthropic_client(max_retries=0).messages.create(
                model=run.model_name,
                max_tokens=4,
                messages=[{"role": "user", "content": "word " * (context + 10)}],
            )


async def test_what_agents_send_is_accepted_and_named(tiny_model: art.TrainableModel) -> None:
    """A coding agent's request through ``client.beta`` (``?beta=true``, ``anthropic-beta``):
    adaptive thinking, context management, server tools, cache control, 32k max_tokens."""
    async with art.capture(tiny_model) as run:
        message = await run.anthropic_client().beta.messages.create(
            model=run.model_name,
            betas=["context-management-2025-06-27", "interleaved-thinking-2025-05-14"],
            system=[
                {
                    "type": "text",
                    "text": "You are an agent.",
                    "cache_control": {"type": "ephemeral"},
                }
            ],
            messages=[
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "redacted_thinking", "data": "xyz"},
                        {
                            "type": "server_tool_use",
                            "id": "srvtoolu_1",
                            "name": "web_search",
                            "input": {"query": "weather"},
                        },
                        {
                            "type": "web_search_tool_result",
                            "tool_use_id": "srvtoolu_1",
                            "content": [],
                        },
                        {"type": "text", "text": "Searching done."},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "document",
                            "source": {
                                "type": "text",
                                "media_type": "text/plain",
                                "data": "A doc.",
                            },
                        },
                        {
                            "type": "text",
                            "text": "Weather?",
                            "cache_control": {"type": "ephemeral"},
                        },
                    ],
                },
            ],
            tools=[WEATHER, {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}],
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
            thinking={"type": "adaptive"},
            context_management={"edits": [{"type": "clear_tool_uses_20250919"}]},
            max_tokens=32000,
            timeout=60,  # else the SDK asks for streaming for so many tokens
            extra_body={"output_config": {"effort": "high"}, "service_tier": "auto"},
        )
    (call,) = run.calls
    assert message.stop_reason == "tool_use"
    params = call.request_params
    assert {"thinking", "context_management", "service_tier"} <= set(params["ignored_fields"])
    assert params["output_config"] == {"effort": "high"}
    assert params["ignored_tools"] == ["web_search_20250305"]
    assert params["ignored_blocks"] == [
        "redacted_thinking",
        "server_tool_use",
        "web_search_tool_result",
    ]
    assert params["anthropic_beta"] == [
        "context-management-2025-06-27",
        "interleaved-thinking-2025-05-14",
    ]
    context = _engine(tiny_model).context_length
    assert params["max_tokens"] == 32000
    assert params["max_tokens_fitted"] == context - call.num_prompt_tokens
    assert call.messages[1:] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Searching done."},
        {"role": "user", "content": "A doc.\n\nWeather?"},
    ]
    assert [t["function"]["name"] for t in call.tools or []] == ["get_weather"]


async def test_structured_output_and_stop_sequences(tiny_model: art.TrainableModel) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": sorted(CITIES)}},
        "required": ["city"],
        "additionalProperties": False,
    }
    async with art.capture(tiny_model) as run:
        client = run.anthropic_client()
        structured = await client.messages.create(
            model=run.model_name,
            messages=[{"role": "user", "content": "Which city?"}],
            max_tokens=40,
            extra_body={"output_config": {"format": {"type": "json_schema", "schema": schema}}},
        )
        # A stop sequence the JSON answer is sure to write: it ends the answer, named back.
        stopped = await client.messages.create(
            model=run.model_name,
            messages=[{"role": "user", "content": "Which city?"}],
            max_tokens=40,
            stop_sequences=['"city"'],
            extra_body={"output_config": {"format": {"type": "json_schema", "schema": schema}}},
        )
    assert json.loads(structured.content[0].text)["city"] in CITIES
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", '"city"')
    assert '"city"' not in stopped.content[0].text
    assert run.calls[1].finish_reason == "stop"


async def test_a_group_of_messages_runs_trains(backend: art.LocalBackend) -> None:
    model = await register_tiny_model(backend, "messages-train")
    trajectories = [(await _weather_turns(model, i, stream=i % 2 == 1))[0] for i in range(4)]
    for trajectory in trajectories:
        assert_token_exact(trajectory, _tokenizer(model))
    result = await model.train([art.TrajectoryGroup(trajectories)], config=art.TrainConfig())
    assert await model.get_step() == 1, result
    folder = backend.model_folder(model).checkpoint(1)
    weights = load_file(str(folder / "adapter_model.safetensors"))
    assert any(k.endswith("lora_B.weight") and v.abs().sum() > 0 for k, v in weights.items())


# Without a server: the answer's shape for what tiny-random does not write (reasoning), and
# the stream's events as the SDK's accumulator reads them, errors included.


def _answer(stops: list[str] | None = None) -> messages_api.Answer:
    call = SimpleNamespace(
        chat=SimpleNamespace(model="m"), prompt_ids=[1, 2, 3], params=SimpleNamespace(n=1)
    )
    translated = Translated({}, {}, {"stream": True, "stops": stops or []})
    return messages_api.Answer(call, translated)  # type: ignore[arg-type]


def _recorded(message: dict[str, Any], finish: str = "stop", text: str = "") -> LLMCall:
    return LLMCall(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        prompt_token_ids=[1, 2, 3],
        completion_token_ids=[4, 5, 6, 7],
        logprobs=[-0.1] * 4,
        completion_text=text,
        response_message={"role": "assistant", **message},
        finish_reason=finish,
    )


REASONED = _recorded(
    {
        "content": "It is sunny.",
        "reasoning_content": "Look it up.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Lima"}'},
            }
        ],
    },
    finish="tool_calls",
)


async def _events(
    answer: messages_api.Answer,
    deltas: list[tuple[str, str]],
    recorded: LLMCall,
    monkeypatch: pytest.MonkeyPatch,
    fail: Exception | None = None,
) -> list[dict[str, Any]]:
    async def fake(
        calls: list[Any], texts: list[StreamedText], pacing: Any
    ) -> AsyncIterator[list[TextDelta] | Recorded]:
        sent = {"reasoning_content": "", "content": ""}
        for field_name, chunk in deltas:
            sent[field_name] += chunk
            yield texts[0].advance(0, dict(sent))
        if fail is not None:
            raise fail
        yield Recorded([[recorded]])

    monkeypatch.setattr(answering, "sampled_deltas", fake)
    events = []
    stream = "".join([chunk async for chunk in messages_api.stream_events(answer)])
    for text in stream.removesuffix("\n\n").split("\n\n"):
        kind, data = text.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert kind == f"event: {event['type']}"
        events.append(event)
    return events


async def test_reasoning_answer_as_blocks_streamed_or_not(monkeypatch: pytest.MonkeyPatch) -> None:
    answer = _answer()
    body = answer.body(REASONED)
    assert body["content"] == [
        {"type": "thinking", "thinking": "Look it up.", "signature": ""},
        {"type": "text", "text": "It is sunny."},
        {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Lima"}},
    ]
    assert (body["stop_reason"], body["stop_sequence"]) == ("tool_use", None)
    created = anthropic.types.Message.model_validate(body)
    # Streamed: reasoning, then text, in pieces (the last piece only with the record).
    deltas = [("reasoning_content", "Look "), ("reasoning_content", "it up."), ("content", "It is")]
    events = await _events(answer, deltas, REASONED, monkeypatch)
    snapshot = None
    json_bufs: dict[int, bytes] = {}
    for event in events:
        if event["type"] in ("ping", "message_stop"):
            continue
        snapshot = accumulate_event(
            event=cast(Any, event), current_snapshot=snapshot, json_bufs=json_bufs
        )
    assert snapshot is not None
    assert [b.to_dict() for b in snapshot.content] == [b.to_dict() for b in created.content]
    assert (snapshot.stop_reason, snapshot.usage.output_tokens) == ("tool_use", 4)
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == ["thinking", "text", "tool_use"]
    assert [e["delta"]["type"] for e in events if e["type"] == "content_block_delta"] == [
        "thinking_delta",
        "thinking_delta",
        "text_delta",
        "text_delta",
        "input_json_delta",
    ]


async def test_stream_ends_with_an_error_event(monkeypatch: pytest.MonkeyPatch) -> None:
    recorded = _recorded({"content": "x"})
    events = await _events(
        _answer(), [("content", "partial")], recorded, monkeypatch, fail=EngineUnavailable("gone")
    )
    assert [e["type"] for e in events][-3:] == [
        "content_block_start",
        "content_block_delta",
        "error",
    ]
    assert events[-1]["error"] == {"type": "overloaded_error", "message": "gone"}
    events = await _events(_answer(), [], recorded, monkeypatch, fail=EngineError("bad grammar"))
    assert events[-1]["error"]["type"] == "invalid_request_error"


def test_empty_and_stopped_answers() -> None:
    answer = _answer(stops=["END", "STOP"])
    stopped = answer.body(_recorded({"content": "a"}, text="a STOP b END"))
    assert (stopped["stop_reason"], stopped["stop_sequence"]) == ("stop_sequence", "STOP")
    empty = answer.body(_recorded({"content": None}, finish="length"))
    assert empty["content"] == [{"type": "text", "text": ""}]
    assert empty["stop_reason"] == "max_tokens"
    cut = _recorded(
        {
            "content": None,
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": '}}
            ],
        },
        finish="length",
    )
    assert answer.body(cut)["content"] == [
        {"type": "tool_use", "id": "c", "name": "f", "input": {}}
    ]


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (503, "overloaded_error"),
        (422, "invalid_request_error"),
        (502, "api_error"),
    ],
)
def test_error_types(status: int, kind: str) -> None:
    response = messages_api.error_response(APIError(status, "why", type="server_error"))
    assert response.status_code == status
    assert json.loads(bytes(response.body)) == {
        "type": "error",
        "error": {"type": kind, "message": "why"},
    }


def test_translation_of_history() -> None:
    chat = messages_api.translate(
        {
            "model": "m",
            "max_tokens": 5,
            "system": "S",
            "messages": [
                {"role": "system", "content": [{"type": "text", "text": "T"}]},
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "plan", "signature": "sig"},
                        {"type": "text", "text": "Let me check."},
                        {"type": "tool_use", "id": "t1", "name": "f", "input": {"x": "é"}},
                        {"type": "tool_use", "id": "t2", "name": "f", "input": {}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "and then"},
                        {"type": "tool_result", "tool_use_id": "t1", "content": "one"},
                        {
                            "type": "tool_result",
                            "tool_use_id": "t2",
                            "is_error": True,
                            "content": [{"type": "text", "text": "boom"}],
                        },
                    ],
                },
            ],
            "tools": [{"name": "f", "input_schema": {"type": "object"}, "cache_control": {}}],
            "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
        }
    ).chat
    assert chat["messages"] == [
        {"role": "system", "content": "S\n\nT"},
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "reasoning_content": "plan",
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"x": "é"}'},
                },
                {"id": "t2", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "one"},
        {"role": "tool", "tool_call_id": "t2", "content": "Error: boom"},
        {"role": "user", "content": "and then"},
    ]
    assert (chat["tool_choice"], chat["parallel_tool_calls"]) == ("auto", False)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
KEYS = st.sampled_from(
    [
        "type",
        "role",
        "content",
        "text",
        "id",
        "name",
        "input",
        "tool_use_id",
        "is_error",
        "thinking",
        "source",
        "data",
        "input_schema",
        "description",
        "disable_parallel_tool_use",
    ]
)
VALUES = JSON | st.sampled_from(
    [
        "user",
        "assistant",
        "system",
        "text",
        "image",
        "tool_use",
        "tool_result",
        "thinking",
        "redacted_thinking",
        "document",
        "search_result",
        "server_tool_use",
        "web_search_tool_result",
        "custom",
        "auto",
        "any",
        "tool",
        "none",
        "f",
    ]
)
BLOCK = st.dictionaries(KEYS, VALUES, max_size=5)
MESSAGE = (
    st.fixed_dictionaries({"role": VALUES, "content": st.lists(BLOCK, max_size=4) | JSON}) | BLOCK
)


@settings(
    max_examples=250,
    deadline=None,
    derandomize=True,  # the same examples every run: CI cannot turn red by chance
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    messages=st.lists(MESSAGE, max_size=4) | JSON,
    system=JSON | st.lists(BLOCK, max_size=2),
    tools=st.lists(BLOCK, max_size=3) | JSON,
    tool_choice=BLOCK | JSON,
    extra=st.dictionaries(
        st.sampled_from(["temperature", "stop_sequences", "output_config", "metadata", "top_k"]),
        JSON,
        max_size=2,
    ),
)
def test_translate_refuses_whatever_it_cannot_read_with_a_400(
    messages: Any, system: Any, tools: Any, tool_choice: Any, extra: dict[str, Any]
) -> None:
    """Any JSON in any field: a translation, or an APIError 400 naming what was wrong."""
    payload = {
        "model": "m",
        "max_tokens": 4,
        "messages": messages,
        "system": system,
        "tools": tools,
        "tool_choice": tool_choice,
        **extra,
    }
    try:
        translated = messages_api.translate(payload)
    except APIError as exc:
        assert exc.status == 400 and exc.message
    else:
        assert translated.chat["messages"][-1]["role"] != "assistant"
