"""Capture through the gateway with the real openai client: isolation and token exactness."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from rollout_checks import WEATHER_TOOL, assert_rollouts_isolated_and_exact, three_turn_rollout

import art_core as art
from art_core.gateway.store import CallStore


async def test_32_concurrent_rollouts_hold_exactly_their_own_calls(
    backend: art.LocalBackend, tiny_model: art.TrainableModel
) -> None:
    results = await asyncio.gather(*(three_turn_rollout(tiny_model, i) for i in range(32)))
    assert_rollouts_isolated_and_exact(results, backend.engine(tiny_model).tokenizer)


async def test_stream_and_non_stream_record_the_same_call(tiny_model: art.TrainableModel) -> None:
    async def run_once(stream: bool) -> tuple[art.Trajectory, str]:
        async with art.capture(tiny_model) as run:
            client = run.openai_client()
            kwargs = dict(
                model=run.model_name,
                messages=[{"role": "user", "content": "Tell me a story"}],
                max_tokens=24,
                temperature=1.0,
                seed=1234,
                logprobs=True,
            )
            if stream:
                text = ""
                async for chunk in await client.chat.completions.create(stream=True, **kwargs):
                    if chunk.choices and chunk.choices[0].delta.content:
                        text += chunk.choices[0].delta.content
            else:
                response = await client.chat.completions.create(**kwargs)
                text = response.choices[0].message.content or ""
        return run.trajectory(), text

    (plain, plain_text), (streamed, streamed_text) = await run_once(False), await run_once(True)
    a, b = plain.calls[0], streamed.calls[0]
    assert a.prompt_token_ids == b.prompt_token_ids
    assert a.completion_token_ids == b.completion_token_ids
    assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert a.response_message == b.response_message and a.finish_reason == b.finish_reason
    assert plain_text == streamed_text == a.response_message["content"]


async def test_stream_with_forced_tool_call_returns_tool_call_deltas(
    tiny_model: art.TrainableModel,
) -> None:
    async with art.capture(tiny_model) as run:
        stream = await run.openai_client().chat.completions.create(
            model=run.model_name,
            messages=[{"role": "user", "content": "weather?"}],
            tools=[WEATHER_TOOL],
            tool_choice="required",
            max_tokens=60,
            stream=True,
            stream_options={"include_usage": True},
        )
        deltas, usage = [], None
        async for chunk in stream:
            if chunk.usage:
                usage = chunk.usage
            for choice in chunk.choices:
                deltas += choice.delta.tool_calls or []
    [call] = run.trajectory().calls
    assert [d.function.name for d in deltas] == [
        t["function"]["name"] for t in call.response_message["tool_calls"]
    ]
    assert usage is not None and usage.completion_tokens == len(call.completion_token_ids)


async def test_response_format_json_schema_is_enforced(tiny_model: art.TrainableModel) -> None:
    schema = {
        "type": "object",
        "properties": {
            "answer": {"type": "string", "enum": ["yes", "no"]},
            "n": {"type": "integer", "minimum": 0, "maximum": 9},
        },
        "required": ["answer", "n"],
        "additionalProperties": False,
    }
    client = tiny_model.openai_client()
    for _ in range(3):
        response = await client.chat.completions.create(
            model=tiny_model.name,
            messages=[{"role": "user", "content": "yes or no?"}],
            max_tokens=40,
            response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
        )
        payload = json.loads(response.choices[0].message.content)
        assert payload["answer"] in ("yes", "no") and 0 <= payload["n"] <= 9


async def test_tool_choice_none_and_n_choices(tiny_model: art.TrainableModel) -> None:
    async with art.capture(tiny_model) as run:
        response = await run.openai_client().chat.completions.create(
            model=run.model_name,
            messages=[{"role": "user", "content": "hi"}],
            tools=[WEATHER_TOOL],
            tool_choice="none",
            n=3,
            max_tokens=6,
            seed=7,
        )
    assert len(response.choices) == 3
    assert all(c.message.tool_calls is None for c in response.choices)
    calls = run.trajectory().calls
    assert sorted(c.choice_index for c in calls) == [0, 1, 2]
    assert len({tuple(c.completion_token_ids) for c in calls}) > 1  # seeds differ per choice


async def test_calls_are_on_disk_as_they_complete(
    backend: art.LocalBackend, tiny_model: art.TrainableModel
) -> None:
    async with art.capture(tiny_model) as run:
        await run.openai_client().chat.completions.create(
            model=run.model_name, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        # a second reader of the same file, as after a crash, sees the call already
        reader = CallStore(backend.store(tiny_model).path)
        try:
            on_disk = reader.load_rollout(run.rollout_id)
        finally:
            reader.close()
    assert [c.id for c in on_disk] == [c.id for c in run.trajectory().calls]


async def test_plain_v1_calls_match_art_style_trajectories(
    backend: art.LocalBackend, tiny_model: art.TrainableModel
) -> None:
    from art_core.matching import attach_recorded_calls

    client = tiny_model.openai_client()
    messages = [{"role": "user", "content": "manual rollout"}]
    response = await client.chat.completions.create(
        model=tiny_model.name, messages=messages, max_tokens=5
    )
    trajectory = art.Trajectory(messages_and_choices=[*messages, response.choices[0]], reward=1.0)
    trajectory = art.Trajectory.model_validate_json(
        trajectory.model_dump_json()
    )  # as if saved and loaded
    attached = attach_recorded_calls(trajectory, backend.store(tiny_model))
    assert [c.completion_token_ids for c in attached.calls] == [
        response.choices[0].model_extra["token_ids"]
    ]
    stranger = art.Trajectory(
        messages_and_choices=[
            *messages,
            {
                "message": {"role": "assistant", "content": "x"},
                "finish_reason": "stop",
                "index": 0,
                "token_ids": [1, 2, 3],
            },
        ]
    )
    with pytest.raises(ValueError, match=r"messages_and_choices\[1\] matches no call"):
        attach_recorded_calls(stranger, backend.store(tiny_model))


async def test_models_endpoint_lists_the_model(tiny_model: art.TrainableModel) -> None:
    async with httpx.AsyncClient() as http:
        response = await http.get(f"{tiny_model.inference_base_url}/models")
    assert tiny_model.name in [m["id"] for m in response.json()["data"]]
