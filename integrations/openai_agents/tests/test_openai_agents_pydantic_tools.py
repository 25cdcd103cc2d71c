"""A ``function_tool`` whose arguments are pydantic models (``$defs`` / ``$ref`` in its
schema), forced with ``tool_choice="required"``: the SDK validates the arguments and runs the
tool. This used to be a 400 from the grammar ("Pointer '/$defs/...' does not exist")."""

from __future__ import annotations

import json
from typing import Any, Literal

import art_openai_agents
from agents import Agent, ModelSettings, function_tool
from openai_agents_support import assert_token_exact
from pydantic import BaseModel, Field

import art_core as art


class Room(BaseModel):
    kind: Literal["single", "double"]
    nights: Literal[1, 2, 3]


class Guest(BaseModel):
    name: str = Field(min_length=1, max_length=6)
    rooms: list[Room] = Field(min_length=1, max_length=2)


BOOKED: list[Guest] = []


@function_tool
def book_hotel(guest: Guest, city: Literal["Paris", "Lima"]) -> str:
    """Book hotel rooms for a guest."""
    BOOKED.append(guest)
    return f"booked {len(guest.rooms)} rooms in {city}"


def booking_agent(**settings: Any) -> Agent[Any]:
    return Agent(
        name="concierge",
        instructions="Book hotels with the book_hotel tool.",
        tools=[book_hotel],
        model_settings=ModelSettings(
            tool_choice="required", parallel_tool_calls=False, max_tokens=120, **settings
        ),
        tool_use_behavior="stop_on_first_tool",
    )


def test_the_tool_schema_has_references() -> None:
    assert "$defs" in json.dumps(book_hotel.params_json_schema)


async def test_required_tool_call_with_pydantic_arguments_runs_the_tool(
    backend: art.LocalBackend, agents_model: art.TrainableModel
) -> None:
    BOOKED.clear()
    for seed in (1, 2):
        trajectory = await art_openai_agents.rollout(
            agents_model, booking_agent(extra_body={"seed": seed}), "Book me a room.", max_turns=2
        )
        [call] = trajectory.calls
        assert (
            call.finish_reason == "tool_calls" and call.request_params["tool_choice"] == "required"
        )
        [tool_call] = call.response_message["tool_calls"]
        assert tool_call["function"]["name"] == "book_hotel"
        arguments = json.loads(tool_call["function"]["arguments"])
        Guest.model_validate(arguments["guest"])
        # the SDK ran the tool with a validated Guest, and stopped on its output
        summary = trajectory.metadata["openai_agents"]
        [ran] = summary["tool_calls"]
        assert ran["output"].startswith("booked ") and ran["output"].endswith(arguments["city"])
        assert_token_exact(backend, agents_model, trajectory)
    assert len(BOOKED) == 2 and all(isinstance(guest, Guest) for guest in BOOKED)
