"""The PyPI ``mcp-server-calculator`` (0.2.0), served by this venv's mcp 2.x over stdio.

The package imports ``mcp.server.fastmcp``, which mcp 2.x renamed to ``MCPServer``; its
usual home is a venv of its own with mcp 1.x (``bash examples/mcp/setup_calculator.sh``).
``sparse_rewards.py --smoke`` runs the package's own ``calculate`` tool here instead, where
that venv was not set up: the old name is pointed at the new class, nothing else changes.

    python benchmarks/_calculator_server.py          # an MCP server on stdin/stdout
    python benchmarks/_calculator_server.py --http   # over HTTP on a free port (one process
                                                     # for every rollout: art_mcp.serve_http)
"""

from __future__ import annotations

import sys
import types

from mcp.server.mcpserver import MCPServer


def main() -> None:
    shim = types.ModuleType("mcp.server.fastmcp")
    shim.FastMCP = MCPServer  # type: ignore[attr-defined]
    sys.modules["mcp.server.fastmcp"] = shim
    from mcp_server_calculator import calculator

    if "--http" in sys.argv[1:]:
        from art_mcp import serve_http

        serve_http(calculator.mcp)
    else:
        calculator.main()


if __name__ == "__main__":
    main()
