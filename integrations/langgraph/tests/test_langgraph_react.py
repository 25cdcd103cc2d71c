"""Acceptance 1: 16 concurrent rollouts of a ReAct graph with two tools, captured exactly.

The prebuilt ReAct agent (``langgraph.prebuilt.create_react_agent``) and LangChain's
``create_agent`` run unchanged; only the chat model is ours. With the tiny random model, tool
calls are forced (a named ``tool_choice`` per round, strict schemas) so that every rollout makes
the same, checkable sequence: weather tool, time tool, final answer.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import art_langgraph
from langchain.agents import create_agent
from langchain.agents.middleware import ModelRequest, ModelResponse, wrap_model_call
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langgraph.prebuilt import create_react_agent
from langgraph_support import TOOLS, tool_names

import art_core as art
from art_core.testing.checks import assert_token_exact

# One chat model, built once, shared by every rollout below.
LLM = art_langgraph.init_chat_model(max_tokens=64, temperature=1.0)
ROUNDS = ["lookup_weather", "lookup_time", "none"]


def tool_rounds(messages: Sequence[Any]) -> int:
    return sum(1 for m in messages if isinstance(m, AIMessage) and m.tool_calls)


def choose_model(state: Any, runtime: Any) -> Any:
    """The prebuilt agent's dynamic model: force the tool of this round, then answer."""
    choice = ROUNDS[min(tool_rounds(state["messages"]), len(ROUNDS) - 1)]
    # A short final answer: the random model's free text is noise.
    limit: dict[str, Any] = {"max_tokens": 8} if choice == "none" else {}
    return LLM.bind_tools(TOOLS, tool_choice=choice, strict=True, **limit)


def check_react_trajectory(
    trajectory: art.Trajectory, i: int, final: list[BaseMessage], node: str, tokenizer: Any
) -> None:
    calls = trajectory.calls
    assert [c.index for c in calls] == [0, 1, 2]
    assert all(c.rollout_id == trajectory.id for c in calls)
    assert [c.metadata["langgraph_node"] for c in calls] == [node, node, node]
    assert [tool_names(c) for c in calls] == [["lookup_weather"], ["lookup_time"], []]
    # every call saw this rollout's task, and only it
    assert all(f"task {i}:" in c.messages[0]["content"] for c in calls)
    # the tool calls and their results, in order, as the graph ran them
    tool_messages = [m for m in final if isinstance(m, ToolMessage)]
    assert [m.name for m in tool_messages] == ["lookup_weather", "lookup_time"]
    for call, result in zip(calls[1:], tool_messages, strict=True):
        assert call.messages[-1] == {
            "role": "tool",
            "tool_call_id": result.tool_call_id,
            "content": result.content,
        }
        assert f"[{trajectory.id}]" in result.content  # the tool ran inside this rollout
    for call, message in zip(
        calls[:2], [m for m in final if isinstance(m, AIMessage)], strict=False
    ):
        [sent] = message.tool_calls
        [recorded] = call.response_message["tool_calls"]
        assert sent["args"] == json.loads(recorded["function"]["arguments"])
        assert sent["args"]["city"] in ("Paris", "Tokyo", "Lima")
    assert calls[2].finish_reason in ("stop", "length")
    assert trajectory.messages()[-1]["role"] == "assistant"
    assert_token_exact(trajectory, tokenizer)


async def run_concurrently(
    model: art.TrainableModel,
    invoke: Callable[[dict[str, Any]], Awaitable[Any]],
    count: int,
) -> tuple[list[art.Trajectory], dict[int, list[BaseMessage]]]:
    finals: dict[int, list[BaseMessage]] = {}

    async def play(i: int) -> float:
        state = await invoke({"messages": [("user", f"task {i}: weather and time in Lima?")]})
        finals[i] = state["messages"]
        return float(i)

    rollout = art_langgraph.wrap_rollout(model, play)
    trajectories = await asyncio.gather(*(rollout(i) for i in range(count)))
    return list(trajectories), finals


async def test_16_concurrent_react_rollouts_hold_exactly_their_own_calls(
    langgraph_model: art.TrainableModel, langgraph_tokenizer: Any
) -> None:
    agent = create_react_agent(choose_model, TOOLS)
    trajectories, finals = await run_concurrently(langgraph_model, agent.ainvoke, 16)
    assert len({t.id for t in trajectories}) == 16
    for i, trajectory in enumerate(trajectories):
        assert trajectory.reward == float(i)
        check_react_trajectory(trajectory, i, finals[i], "agent", langgraph_tokenizer)


@wrap_model_call
async def force_tool_rounds(
    request: ModelRequest, handler: Callable[[ModelRequest], Awaitable[ModelResponse]]
) -> ModelResponse:
    """``create_agent`` middleware: the same forced rounds as the prebuilt agent above."""
    choice = ROUNDS[min(tool_rounds(request.messages), len(ROUNDS) - 1)]
    settings: dict[str, Any] = {"strict": True}
    if choice == "none":
        settings["max_tokens"] = 8
    return await handler(request.override(tool_choice=choice, model_settings=settings))


async def test_langchain_create_agent_rollouts_are_captured(
    langgraph_model: art.TrainableModel, langgraph_tokenizer: Any
) -> None:
    agent: Any = create_agent(LLM, TOOLS, middleware=[force_tool_rounds])
    trajectories, finals = await run_concurrently(langgraph_model, agent.ainvoke, 4)
    for i, trajectory in enumerate(trajectories):
        check_react_trajectory(trajectory, i, finals[i], "model", langgraph_tokenizer)
