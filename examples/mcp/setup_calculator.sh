#!/usr/bin/env bash
# mcp-server-calculator 0.2.0 (PyPI) imports `mcp.server.fastmcp`, which mcp 2.x removed, so it
# cannot run in the project's venv (mcp 2.3). An MCP server is just a process: give it its own
# small venv with mcp 1.x; our mcp 2.3 client talks to it over stdio all the same.
set -euo pipefail
cd "$(dirname "$0")"
VENV="${1:-.venv-calculator}"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q "mcp-server-calculator==0.2.0" "mcp>=1.4.1,<2"
echo "server command: $(pwd)/$VENV/bin/mcp-server-calculator"
