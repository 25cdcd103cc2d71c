"""Two Agents SDK agents for the training example: a triage agent hands off to a weather agent.

The agents are plain ``agents.Agent`` definitions: nothing in them knows about training. The
weather agent's tool answers from a made-up table, so a run can be scored by a program: did
the triage agent hand off, and did the weather agent ask about the city the user named?
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any, Literal

from agents import Agent, ModelSettings, function_tool
from agents.items import HandoffOutputItem, ToolCallItem
from agents.result import RunResultBase

City = Literal["Paris", "Tokyo", "Lima", "Oslo", "Cairo"]
# Made up, so the answer can only come from the tool.
WEATHER: dict[str, str] = {
    "Paris": "14°C and drizzle",
    "Tokyo": "22°C and clear",
    "Lima": "18°C and overcast",
    "Oslo": "-3°C and snow",
    "Cairo": "31°C and sunny",
}
QUESTIONS = [
    "What is the weather in {city}?",
    "Is it cold in {city} right now?",
    "Should I take an umbrella in {city} today?",
]


@function_tool
def get_weather(city: City) -> str:
    """The current weather in a city."""
    return f"{city}: {WEATHER[city]}"


def build_agents(*, max_tokens: int, free_first_turn: bool = False) -> Agent[Any]:
    """The triage agent (the run's entry point), which hands off to the weather agent.

    With ``free_first_turn`` the triage agent decides itself whether to hand off; otherwise
    the handoff is forced (``tool_choice``), which a randomly initialised model needs.
    """
    weather = Agent(
        name="weather",
        instructions="You answer weather questions. Call get_weather for the city asked about.",
        tools=[get_weather],
        model_settings=ModelSettings(
            tool_choice="get_weather", max_tokens=max_tokens, temperature=1.0
        ),
        # The tool's answer is the final answer: the run ends after one call of the tool.
        tool_use_behavior="stop_on_first_tool",
    )
    return Agent(
        name="triage",
        instructions="You route questions. Hand weather questions to the weather agent.",
        handoffs=[weather],
        model_settings=ModelSettings(
            tool_choice="auto" if free_first_turn else "transfer_to_weather",
            max_tokens=max_tokens,
            temperature=1.0,
        ),
    )


@dataclass(frozen=True)
class Scenario:
    city: str
    question: str


def scenarios(seed: int = 0) -> list[Scenario]:
    """Every city with every question template, shuffled."""
    pool = [Scenario(c, q.format(city=c)) for c in WEATHER for q in QUESTIONS]
    random.Random(seed).shuffle(pool)
    return pool


def score(scenario: Scenario, result: RunResultBase) -> tuple[float, dict[str, float | bool]]:
    """Reward from what the run did: 0.2 for the handoff, 0.8 for asking about the right city.

    Example:
        >>> score(Scenario("Oslo", "Weather in Oslo?"), result)  # doctest: +SKIP
        (1.0, {'handed_off': True, 'right_city': True})
    """
    handed_off = any(isinstance(item, HandoffOutputItem) for item in result.new_items)
    asked = [
        json.loads(getattr(item.raw_item, "arguments", "{}") or "{}").get("city")
        for item in result.new_items
        if isinstance(item, ToolCallItem) and getattr(item.raw_item, "name", "") == "get_weather"
    ]
    right_city = scenario.city in asked
    return 0.2 * handed_off + 0.8 * right_city, {"handed_off": handed_off, "right_city": right_city}
