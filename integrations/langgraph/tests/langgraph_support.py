"""Helpers of the LangGraph integration tests: tools that report the rollout they ran in.

The fixtures are in ``conftest.py`` (the gateway itself comes from art_core's pytest plugin).
"""

from __future__ import annotations

from typing import Literal

from langchain_core.tools import StructuredTool, tool

import art_core as art

City = Literal["Paris", "Tokyo", "Lima"]


def rollout_tag() -> str:
    """The current rollout's id as a tool sees it (proves the context reached the tool)."""
    run = art.current_run()
    return run.rollout_id if run is not None else "no-rollout"


@tool
def lookup_weather(city: City) -> str:
    """The weather in a city."""
    return f"weather in {city}: sunny [{rollout_tag()}]"


def _time(city: City) -> str:
    return f"time in {city}: 12:00 [{rollout_tag()}]"


async def _time_async(city: City) -> str:
    return _time(city)


# Sync and async implementations: ToolNode runs the one that matches how the graph is run.
lookup_time = StructuredTool.from_function(
    func=_time, coroutine=_time_async, name="lookup_time", description="The local time in a city."
)


TOOLS = [lookup_weather, lookup_time]


def tool_names(call: art.LLMCall) -> list[str]:
    """The names of the tools a recorded call asked for."""
    return [c["function"]["name"] for c in call.response_message.get("tool_calls") or []]
