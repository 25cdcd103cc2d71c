"""A forced tool call to an MCP tool whose argument is a nested pydantic model (``$defs`` /
``$ref`` in its input schema): the call validates on the server and its result comes back."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from art_mcp import Scenario, rollout
from mcp_support import forced, tool_messages

import art_core as art

ORDERS = f"{sys.executable} {Path(__file__).resolve().parent / 'mcp_orders_server.py'}"


async def test_forced_call_with_a_nested_pydantic_argument(
    mcp_model: art.TrainableModel,
) -> None:
    trajectory = await rollout(
        mcp_model,
        Scenario(task="Order two pens for Ana in Lima.", answer="ORDER OK"),
        ORDERS,
        settings=forced("place_order", max_turns=2, max_tokens=120, extra_body={"seed": 3}),
        reward_fn=lambda s, t: 1.0,
    )
    schema = trajectory.calls[0].tools[0]["function"]["parameters"]  # type: ignore[index]
    assert "$defs" in json.dumps(schema) and "$ref" in json.dumps(schema)
    assert trajectory.metrics["tool_calls"] == 2 and trajectory.metrics["tool_errors"] == 0
    for call in trajectory.calls:
        [tool_call] = call.response_message["tool_calls"]
        assert tool_call["function"]["name"] == "place_order"
        order = json.loads(tool_call["function"]["arguments"])["order"]
        assert order["customer"]["address"]["city"] in ("Paris", "Lima", "Tokyo")
    # the server validated the nested model and ran the tool; the second turn read its answer
    [result] = tool_messages(trajectory)
    assert result.startswith("ORDER OK: ")
    assert trajectory.metadata["tools_used"] == ["place_order", "place_order"]
