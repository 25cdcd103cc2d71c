"""Frameworks whose default speaks OpenAI Responses, unchanged, against the gateway: the
OpenAI Agents SDK's ``OpenAIResponsesModel`` and LangChain's ``ChatOpenAI(use_responses_api=
True)`` inside a LangGraph agent. Their multi-turn tool-calling runs are recorded token-exactly
in their rollout."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

import art_core as art
from art_core.testing.checks import assert_token_exact


def _tokenizer(model: art.TrainableModel) -> Any:
    return model.backend().engine(model).tokenizer


async def test_openai_agents_sdk_responses_model(tiny_model: art.TrainableModel) -> None:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIResponsesModel,
        RunConfig,
        Runner,
        function_tool,
    )

    class Forecast(BaseModel):
        sky: Literal["sunny", "rainy"]

    seen: list[str] = []

    @function_tool
    def get_weather(city: Literal["Paris", "Tokyo"]) -> str:
        """The weather in a city."""
        seen.append(city)
        return f"sunny in {city}"

    async with art.capture(tiny_model) as run:
        agent = Agent(
            name="weather",
            instructions="Use the tool, then answer.",
            model=OpenAIResponsesModel(model=run.model_name, openai_client=run.openai_client()),
            tools=[get_weather],
            # Forced on the first turn (a random model calls nothing by itself); the SDK
            # resets it after a tool call, so the second turn answers, in a schema (so a
            # random model ends its answer: the SDK fails a response cut by max tokens).
            model_settings=ModelSettings(
                tool_choice="required", parallel_tool_calls=False, max_tokens=48
            ),
            output_type=Forecast,
        )
        result = await Runner.run(
            agent,
            "weather in Paris?",
            max_turns=4,
            run_config=RunConfig(tracing_disabled=True),
        )
    calls = run.calls
    assert len(calls) >= 2 and seen
    assert result.final_output.sky in ("sunny", "rainy")
    assert all(c.api == "responses" for c in calls)
    first, second = calls[:2]
    tool_call = first.response_message["tool_calls"][0]
    assert tool_call["function"]["name"] == "get_weather"
    assert {"role": "tool", "tool_call_id": tool_call["id"], "content": f"sunny in {seen[0]}"} in (
        second.messages
    )
    assert_token_exact(run.trajectory(), _tokenizer(tiny_model))


async def test_langgraph_agent_with_chat_openai_responses_api(
    tiny_model: art.TrainableModel,
) -> None:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    @tool
    def get_weather(city: Literal["Paris", "Tokyo"]) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    async with art.capture(tiny_model) as run:
        llm = ChatOpenAI(
            model=run.model_name,
            base_url=run.base_url,
            api_key="art",
            use_responses_api=True,
            max_tokens=48,
        )
        # Strict tools: a forced call names only declared keys, so a random model's call
        # always ends well within max_tokens (its arguments parse, and come back). The agent
        # gets the model with the same tools bound, so its turns continue the first.
        bound = llm.bind_tools([get_weather], strict=True)
        forced = llm.bind_tools(
            [get_weather], tool_choice="get_weather", parallel_tool_calls=False, strict=True
        )
        first = await forced.ainvoke("weather in Paris?")
        assert first.tool_calls and first.tool_calls[0]["name"] == "get_weather"
        # The LangGraph agent continues the conversation: its turns are spliced on the first.
        agent = create_react_agent(bound, [get_weather])
        state = await agent.ainvoke(
            {
                "messages": [
                    ("user", "weather in Paris?"),
                    first,
                    {
                        "role": "tool",
                        "tool_call_id": first.tool_calls[0]["id"],
                        "content": "sunny in Paris",
                    },
                ]
            },
            {"recursion_limit": 4},
        )
        assert state["messages"][-1].type in ("ai", "tool")
    calls = run.calls
    assert len(calls) >= 2 and all(c.api == "responses" for c in calls)
    assert_token_exact(run.trajectory(), _tokenizer(tiny_model))
