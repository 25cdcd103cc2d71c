"""LangChain's ``ChatAnthropic`` inside a LangGraph agent, unchanged, against the gateway's
Anthropic Messages route: its multi-turn tool-calling run is recorded token-exactly in its
rollout."""

from __future__ import annotations

from typing import Literal

import art_core as art
from art_core.testing.checks import assert_token_exact


async def test_langgraph_agent_with_chat_anthropic(tiny_model: art.TrainableModel) -> None:
    from langchain_anthropic import ChatAnthropic
    from langchain_core.tools import tool
    from langgraph.prebuilt import create_react_agent

    @tool
    def get_weather(city: Literal["Paris", "Tokyo"]) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    async with art.capture(tiny_model) as run:
        llm = ChatAnthropic(
            model=run.model_name,
            base_url=run.anthropic_base_url,
            api_key="art",
            max_tokens=48,
            max_retries=0,
        )
        # Strict tools: a forced call names only declared keys, so a random model's call
        # always ends well within max_tokens (its arguments parse, and come back). The agent
        # gets the model with the same tools bound, so its turns continue the first.
        bound = llm.bind_tools([get_weather], strict=True)
        forced = llm.bind_tools(
            [get_weather],
            tool_choice={"type": "tool", "name": "get_weather"},
            parallel_tool_calls=False,
            strict=True,
        )
        first = await forced.ainvoke("weather in Paris?")
        assert first.tool_calls and first.tool_calls[0]["name"] == "get_weather"
        # The LangGraph agent continues the conversation: its turn is spliced on the first.
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
    assert len(calls) >= 2 and all(c.api == "messages" for c in calls)
    assert calls[1].messages[-1]["role"] == "tool"
    assert_token_exact(run.trajectory(), tiny_model.backend().engine(tiny_model).tokenizer)
