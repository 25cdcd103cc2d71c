"""A real MCP server for the art-mcp tests: well-behaved tools and ones that fail on purpose.

Run over stdio (default) or streamable HTTP on a free port (``--http``, the URL is printed).

Tools: ``lookup`` (enum-bounded, deterministic), ``add``, ``explode`` (raises), ``hang``
(never returns), ``big`` (returns ``size`` characters, 1 MB by default) and ``crash`` (kills
the server process mid-call). Resource: ``notes://readme``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Literal

import anyio
from mcp.server.mcpserver import MCPServer

# CRITICAL: the SDK logs each failing tool with a rich traceback, slow and noisy in tests.
app = MCPServer(
    "faulty", instructions="A test server whose tools misbehave on request.", log_level="CRITICAL"
)

CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Peru": "Lima"}


@app.tool()
def lookup(country: Literal["France", "Japan", "Peru"]) -> str:
    """The capital city of a country."""
    return f"The capital of {country} is {CAPITALS[country]}."


@app.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@app.tool()
def explode(reason: Literal["boom", "bang"]) -> str:
    """A tool that always raises."""
    raise ValueError(f"the tool exploded: {reason}")


@app.tool()
async def hang(mode: Literal["forever"]) -> str:
    """A tool that never returns."""
    await anyio.sleep_forever()
    return "unreachable"


@app.tool()
def big(size: Literal["1mb"]) -> str:
    """A tool that returns one megabyte of text."""
    return "x" * (1024 * 1024)


@app.tool()
def crash(mode: Literal["now"]) -> str:
    """A tool that kills the server process (a crash in the middle of a rollout)."""
    marker = os.environ.get("ART_MCP_CRASH_MARKER")
    if marker:
        Path(marker).write_text("crashed")
    os._exit(3)


@app.resource("notes://readme", name="readme", description="What this server is for")
def readme() -> str:
    return "This server exists to test art-mcp."


if __name__ == "__main__":
    pid_file = os.environ.get("ART_MCP_PID_FILE")
    if pid_file:  # lets a test check that the process is gone after its session closed
        Path(pid_file).write_text(str(os.getpid()))
    if "--http" in sys.argv:
        from art_mcp.local import serve_http

        serve_http(app)
    else:
        app.run()
