"""Shared pieces of the Agents SDK tests: agents and checks (fixtures: ``conftest.py``).

With tiny-random, free text is noise, so every test that needs a tool call forces it
(``tool_choice`` set to the tool's name) on a bounded schema (a ``Literal`` argument), and
runs end through ``tool_use_behavior="stop_on_first_tool"`` or a short final turn.
"""

from __future__ import annotations

from typing import Any, Literal

from agents import Agent, ModelSettings, function_tool

import art_core as art
from art_core.testing import checks

CITIES = ("Paris", "Tokyo", "Lima")
# A forced call to get_weather / transfer_to_weather takes 30-40 tiny-random tokens.
TOOL_TOKENS = 48


@function_tool
def get_weather(city: Literal["Paris", "Tokyo", "Lima"]) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def weather_agent(*, stop_on_tool: bool = True, **settings: Any) -> Agent[Any]:
    """An agent forced to call get_weather; it stops there or answers in a short last turn."""
    return Agent(
        name="weather",
        instructions="Answer weather questions with the get_weather tool.",
        tools=[get_weather],
        model_settings=ModelSettings(tool_choice="get_weather", max_tokens=TOOL_TOKENS, **settings),
        tool_use_behavior="stop_on_first_tool" if stop_on_tool else "run_llm_again",
    )


def triage_agent(target: Agent[Any], **settings: Any) -> Agent[Any]:
    """An agent forced to hand off to ``target`` (handoffs are tools: transfer_to_<name>)."""
    return Agent(
        name="triage",
        instructions="Route the user to the right agent.",
        handoffs=[target],
        model_settings=ModelSettings(
            tool_choice=f"transfer_to_{target.name}", max_tokens=TOOL_TOKENS, **settings
        ),
    )


def assert_token_exact(
    backend: art.LocalBackend, model: art.TrainableModel, trajectory: art.Trajectory
) -> None:
    """Every call's recorded ids decode to its text, with one logprob per sampled id (an agent
    run may hold several agents, whose prompts do not chain: see ``checks.assert_prefix_chain``)."""
    checks.assert_token_exact(trajectory, backend.engine(model).tokenizer, prefix_chain=False)


def tool_call_of(call: art.LLMCall) -> tuple[str, str]:
    """(tool name, JSON arguments) of a call that made exactly one tool call."""
    [tool_call] = call.response_message["tool_calls"]
    return tool_call["function"]["name"], tool_call["function"]["arguments"]
