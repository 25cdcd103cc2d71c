"""A PyPI MCP server built by its own ``create_server``, served over HTTP by ``art_mcp``.

``mcp-server-time`` and ``mcp-server-git`` build their ``MCPServer`` in ``create_server`` and
run it over stdio; a training run that opens a session per rollout would start one Python
process per rollout (~0.6 CPU-s each: on 2 cores, 100 at once miss their connect timeout).
Here one process serves every session, the servers' own code unchanged:

    python benchmarks/_mcp_http.py time Etc/UTC     # mcp_server_time.server.create_server
    python benchmarks/_mcp_http.py git              # mcp_server_git.server.create_server(None)
"""

from __future__ import annotations

import sys

from art_mcp import serve_http


def main() -> None:
    name, rest = sys.argv[1], sys.argv[2:]
    if name == "time":
        from mcp_server_time.server import create_server

        serve_http(create_server(rest[0] if rest else "Etc/UTC"))
    elif name == "git":
        from mcp_server_git.server import create_server

        serve_http(create_server(None))
    else:
        raise SystemExit(f"unknown server {name!r}: time or git")


if __name__ == "__main__":
    main()
