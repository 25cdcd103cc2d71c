"""Rollouts and token-exactness checks shared by the gateway and engine-parity suites."""

from __future__ import annotations

import json
from typing import Any

import art_core as art
from art_core.testing.checks import assert_prefix_chain
from art_core.testing.tools import WEATHER_TOOL


async def three_turn_rollout(model: art.TrainableModel, i: int) -> tuple[art.Trajectory, list[Any]]:
    """A forced tool call, the tool result sent back, a final answer, then one more turn."""
    async with art.capture(model, metadata={"i": i}) as run:
        client = run.openai_client()
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": f"task {i}: weather in Paris?"}
        ]
        first = await client.chat.completions.create(
            model=run.model_name,
            messages=messages,
            tools=[WEATHER_TOOL],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            max_tokens=40,
            temperature=1.0,
        )
        assistant = first.choices[0].message
        messages.append(assistant.model_dump(exclude_none=True))
        messages.append(
            {"role": "tool", "tool_call_id": assistant.tool_calls[0].id, "content": f"sunny {i}"}
        )
        second = await client.chat.completions.create(
            model=run.model_name,
            messages=messages,
            tools=[WEATHER_TOOL],
            max_tokens=12,
        )
        messages.append(second.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "user", "content": "thanks, anything else?"})
        third = await client.chat.completions.create(
            model=run.model_name,
            messages=messages,
            tools=[WEATHER_TOOL],
            tool_choice="none",
            max_tokens=8,
        )
    return run.trajectory(reward=float(i)), [first, second, third]


def assert_rollouts_isolated_and_exact(
    results: list[tuple[art.Trajectory, list[Any]]], tokenizer: Any
) -> None:
    """Each trajectory holds exactly its own calls, in order, with exact token ids."""
    assert len({t.id for t, _ in results}) == len(results)
    for i, (trajectory, responses) in enumerate(results):
        assert [c.index for c in trajectory.calls] == [0, 1, 2]
        assert all(c.rollout_id == trajectory.id for c in trajectory.calls)
        assert f"task {i}:" in trajectory.calls[0].messages[0]["content"]
        assert trajectory.calls[1].messages[-1]["content"] == f"sunny {i}"
        assert trajectory.metadata == {"i": i} and trajectory.reward == float(i)
        tool_calls = trajectory.calls[0].response_message["tool_calls"]
        assert tool_calls[0]["function"]["name"] == "get_weather"
        assert json.loads(tool_calls[0]["function"]["arguments"])["city"] in {
            "Paris",
            "Tokyo",
            "Lima",
        }
        assert trajectory.calls[0].finish_reason == "tool_calls"
        for call, response in zip(trajectory.calls, responses, strict=True):
            assert (
                tokenizer.decode(call.completion_token_ids, skip_special_tokens=False)
                == call.completion_text
            )
            assert len(call.logprobs) == len(call.completion_token_ids)
            assert all(lp <= 0.0 for lp in call.logprobs)
            choice = response.choices[0]
            assert choice.model_extra["token_ids"] == call.completion_token_ids
            assert response.model_extra["prompt_token_ids"] == call.prompt_token_ids
            assert (choice.message.content or None) == (
                call.response_message.get("content") or None
            )
        assert_prefix_chain(trajectory.calls)
        assert trajectory.messages()[-1]["role"] == "assistant"
