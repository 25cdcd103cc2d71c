"""Shared SFT test data: a shop's tool and a conversation that uses it."""

from __future__ import annotations

from typing import Any

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_price",
            "description": "Price of an item",
            "parameters": {"type": "object", "properties": {"item": {"type": "string"}}},
        },
    }
]


def tool_call(name: str, arguments: str, call_id: str = "c0") -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        ],
    }


def shop_record() -> dict[str, Any]:
    return {
        "messages": [
            {"role": "system", "content": "You run a shop."},
            {"role": "user", "content": "How much is a pear?"},
            tool_call("get_price", '{"item":"pear"}'),
            {"role": "tool", "tool_call_id": "c0", "content": "3"},
            {"role": "assistant", "content": "A pear costs 3."},
        ],
        "tools": TOOLS,
    }
