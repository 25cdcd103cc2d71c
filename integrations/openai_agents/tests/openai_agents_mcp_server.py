"""A tiny MCP server over stdio for the tests: the capital of a few countries.

Run as a separate process by ``MCPServerStdio`` (``python openai_agents_mcp_server.py``).
"""

from typing import Literal

from mcp.server.mcpserver import MCPServer

app = MCPServer("capitals")
CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Peru": "Lima"}


@app.tool()
def capital_of(country: Literal["France", "Japan", "Peru"]) -> str:
    """The capital city of a country."""
    return CAPITALS[country]


if __name__ == "__main__":
    app.run("stdio")
