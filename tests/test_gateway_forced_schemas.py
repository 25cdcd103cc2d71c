"""Forced tool calls with any parameters schema valid under ``tool_choice="auto"``: pydantic's
``$defs`` / ``$ref`` (openai's ``pydantic_function_tool``), recursion, keywords the grammar
engine cannot enforce. Checked with the real openai client against the gateway."""

from __future__ import annotations

import json
from typing import Any, Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

import art_core as art


class Address(BaseModel):
    city: Literal["Paris", "Lima", "Tokyo"]
    zip_code: Literal[75001, 15001, 100]


class Item(BaseModel):
    sku: Literal["pen", "ink", "pad"]
    quantity: Literal[1, 2, 3]


class Order(BaseModel):
    """Place an order for a customer."""

    customer: str = Field(min_length=1, max_length=6)
    ship_to: Address
    items: list[Item] = Field(min_length=1, max_length=2)
    gift: Address | None


class Node(BaseModel):
    """A tree: pydantic refers to the model from inside itself."""

    label: Literal["a", "b"]
    children: list[Node] = Field(default_factory=list, max_length=1)


USER = [{"role": "user", "content": "Order two pens to Lima."}]


def _arguments(completion: Any) -> tuple[str, dict[str, Any]]:
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    return call.function.name, json.loads(call.function.arguments)


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_pydantic_function_tool_is_forced_and_parses(
    tiny_model: art.TrainableModel, seed: int
) -> None:
    client = tiny_model.openai_client()
    tool = openai.pydantic_function_tool(Order)
    assert "$defs" in tool["function"]["parameters"]  # the case that used to get a 400
    completion = await client.chat.completions.parse(
        model="tiny",
        messages=USER,  # type: ignore[arg-type]
        tools=[tool],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=160,
        seed=seed,
    )
    [call] = completion.choices[0].message.tool_calls or []
    assert call.function.name == "Order"
    order = call.function.parsed_arguments  # the openai SDK validated it against the model
    assert isinstance(order, Order) and isinstance(order.ship_to, Address)
    assert order.items and all(isinstance(item, Item) for item in order.items)


async def test_named_tool_choice_among_tools_with_references(
    tiny_model: art.TrainableModel,
) -> None:
    client = tiny_model.openai_client()
    tools = [openai.pydantic_function_tool(Order), openai.pydantic_function_tool(Node)]
    for name, model in (("Node", Node), ("Order", Order)):
        completion = await client.chat.completions.create(
            model="tiny",
            messages=USER,  # type: ignore[arg-type]
            tools=tools,  # type: ignore[arg-type]
            tool_choice={"type": "function", "function": {"name": name}},
            max_tokens=160,
            seed=5,
        )
        called, arguments = _arguments(completion)
        assert called == name
        model.model_validate(arguments)


async def test_required_with_several_tools_picks_one_and_validates(
    tiny_model: art.TrainableModel,
) -> None:
    client = tiny_model.openai_client()
    tools = [openai.pydantic_function_tool(Order), openai.pydantic_function_tool(Node)]
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    for seed in range(4):
        completion = await client.chat.completions.create(
            model="tiny",
            messages=USER,  # type: ignore[arg-type]
            tools=tools,  # type: ignore[arg-type]
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=160,
            seed=seed,
        )
        name, arguments = _arguments(completion)
        jsonschema.validate(arguments, schemas[name])


# Valid JSON Schema the grammar engine cannot enforce: accepted forced, as with `auto`.
LOOSE_PARAMETERS: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "mode": {"enum": ["fast", "slow"], "not": {"const": "slow"}},
        "tags": {"type": "array", "items": {"$ref": "#/$defs/Tag"}, "maxItems": 2},
    },
    "required": ["mode", "tags"],
    "additionalProperties": False,
    "$defs": {"Tag": {"enum": ["x", "y"], "default": {"$ref": "#/not/a/pointer"}}},
}


async def test_keywords_the_grammar_cannot_enforce_do_not_refuse_the_request(
    tiny_model: art.TrainableModel,
) -> None:
    client = tiny_model.openai_client()
    tool = {"type": "function", "function": {"name": "run", "parameters": LOOSE_PARAMETERS}}
    completion = await client.chat.completions.create(
        model="tiny",
        messages=USER,  # type: ignore[arg-type]
        tools=[tool],  # type: ignore[list-item]
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=200,
        seed=3,
    )
    name, arguments = _arguments(completion)
    assert name == "run"
    # What the grammar can enforce holds: the enum, the referenced items, the bounds.
    assert arguments["mode"] in ("fast", "slow")
    assert set(arguments["tags"]) <= {"x", "y"} and len(arguments["tags"]) <= 2
