"""An agent with a real MCP server process over stdio (agents.mcp.MCPServerStdio)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import art_openai_agents
from agents import Agent, ModelSettings
from agents.mcp import MCPServerStdio
from art_openai_agents import ArtModelProvider
from openai_agents_support import (
    TOOL_TOKENS,
    assert_token_exact,
    tool_call_of,
)

import art_core as art

SERVER_SCRIPT = Path(__file__).with_name("openai_agents_mcp_server.py")
CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Peru": "Lima"}


async def test_mcp_server_over_stdio_in_concurrent_rollouts(
    backend: art.LocalBackend, agents_model: art.TrainableModel
) -> None:
    server = MCPServerStdio(
        params={"command": sys.executable, "args": [str(SERVER_SCRIPT)]},
        name="capitals",
        client_session_timeout_seconds=30,
    )
    async with server:
        agent = Agent(
            name="geographer",
            instructions="Answer with the capital_of tool.",
            mcp_servers=[server],
            # strict schemas (additionalProperties: false): the forced call always parses
            mcp_config={"convert_schemas_to_strict": True},
            model_settings=ModelSettings(tool_choice="capital_of", max_tokens=TOOL_TOKENS),
            tool_use_behavior="stop_on_first_tool",
        )
        provider = ArtModelProvider(agents_model)
        trajectories = await asyncio.gather(
            *(
                art_openai_agents.rollout(agents_model, agent, f"capital {i}?", provider=provider)
                for i in range(4)
            )
        )
        await provider.aclose()
    for i, trajectory in enumerate(trajectories):
        [call] = trajectory.calls
        assert call.messages[-1]["content"] == f"capital {i}?"
        assert call.metadata["agent"] == "geographer"
        assert call.metadata["mcp_servers"] == ["capitals"]
        assert [t["function"]["name"] for t in call.tools or []] == ["capital_of"]
        name, arguments = tool_call_of(call)
        country = json.loads(arguments)["country"]
        assert name == "capital_of" and country in CAPITALS
        assert_token_exact(backend, agents_model, trajectory)

        summary = trajectory.metadata["openai_agents"]
        assert summary["mcp_servers"] == ["capitals"]
        [tool_call] = summary["tool_calls"]
        assert tool_call["mcp_server"] == "capitals" and tool_call["agent"] == "geographer"
        # the output came back from the server process
        assert CAPITALS[country] in tool_call["output"]
        assert CAPITALS[country] in summary["final_output"]
