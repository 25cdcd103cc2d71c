"""Run an MCP server over streamable HTTP on a free local port, and spawn such a server.

A training run opens one MCP session per rollout. Spawning a stdio server per rollout costs a
Python start-up (~0.6 CPU-s with the MCP SDK imported) each time; one HTTP server process
serving a session per rollout costs milliseconds. ``serve_http`` (server side) binds a free
port and announces its URL on stdout; ``spawn_http_server`` (client side) starts such a
script and waits for that line.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any, TextIO

from art_mcp.servers import HttpServer, StdioServer, parse_server

URL_LINE = "art-mcp: MCP server listening on "
_WATCH_PARENT = "ART_MCP_EXIT_WITH_PARENT"
_URL_RE = re.compile(re.escape(URL_LINE) + r"(http://\S+)")


def serve_http(app: Any, *, host: str = "127.0.0.1", port: int = 0, path: str = "/mcp") -> None:
    """Serve ``app`` (an ``MCPServer``) over streamable HTTP; print its URL once listening.

    ``port=0`` takes a free port; the socket is bound before the URL is printed, so a client
    that reads the line can connect at once. Blocks until the process is stopped.

    Example:
        >>> app = MCPServer("shop")  # starts a server: `serve_http` blocks until the process is stopped  # doctest: +SKIP
        >>> serve_http(app)  # prints "art-mcp: MCP server listening on http://127.0.0.1:PORT/mcp"  # starts a server  # doctest: +SKIP
    """
    import anyio
    import uvicorn

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    bound = sock.getsockname()[1]
    starlette_app = app.streamable_http_app(streamable_http_path=path, host=host)
    config = uvicorn.Config(starlette_app, log_level="warning", access_log=False)
    server = uvicorn.Server(config)

    async def run() -> None:
        print(f"{URL_LINE}http://{host}:{bound}{path}", flush=True)
        async with anyio.create_task_group() as tasks:
            if os.environ.get(_WATCH_PARENT) == "1":
                tasks.start_soon(_exit_when_stdin_closes, server)
            await server.serve(sockets=[sock])
            tasks.cancel_scope.cancel()

    anyio.run(run)


async def _exit_when_stdin_closes(server: Any) -> None:
    # Spawned by spawn_http_server: stdin is a pipe from the parent, which closes when the
    # parent exits, even when it is killed without a chance to stop us.
    import anyio

    await anyio.to_thread.run_sync(sys.stdin.buffer.read, abandon_on_cancel=True)
    server.should_exit = True


@asynccontextmanager
async def spawn_http_server(
    command: str | StdioServer,
    *,
    start_timeout_s: float = 60.0,
    errlog: TextIO | None = None,
) -> AsyncIterator[HttpServer]:
    """Start a server script that calls ``serve_http`` and yield its URL as an ``HttpServer``.

    The process is stopped (SIGTERM, then SIGKILL) when the block exits; it also exits by
    itself if this process dies (its stdin, a pipe from us, closes).

    Example:
        >>> async with spawn_http_server("python examples/mcp/shop_server.py --http") as server:  # starts a server: the repository's example MCP server  # doctest: +SKIP
        ...     async with connect(server) as session: ...
    """
    spec = parse_server(command)
    if not isinstance(spec, StdioServer):
        raise ValueError(f"spawn_http_server needs a command line, got the URL {spec}")
    env = {**os.environ, **(spec.env or {}), "PYTHONUNBUFFERED": "1", _WATCH_PARENT: "1"}
    process = await asyncio.create_subprocess_exec(
        spec.executable(),
        *spec.args,
        stdout=asyncio.subprocess.PIPE,
        stderr=errlog if errlog is not None else None,
        stdin=asyncio.subprocess.PIPE,
        cwd=spec.cwd,
        env=env,
        start_new_session=True,
    )
    try:
        url = await asyncio.wait_for(_read_url(process), start_timeout_s)
    except BaseException as exc:
        await _stop(process)
        if isinstance(exc, TimeoutError):
            raise RuntimeError(
                f"the MCP server `{spec}` did not print its URL within {start_timeout_s:g} s"
            ) from None
        raise
    drain = asyncio.ensure_future(_drain(process))
    try:
        yield HttpServer(url=url, name=spec.label)
    finally:
        await _stop(process)
        drain.cancel()
        with suppress(asyncio.CancelledError):
            await drain


async def _read_url(process: asyncio.subprocess.Process) -> str:
    assert process.stdout is not None
    seen: list[str] = []
    while True:
        line = await process.stdout.readline()
        if not line:
            code = await process.wait()
            tail = "".join(seen[-5:])
            raise RuntimeError(f"the MCP server exited with code {code} before serving:\n{tail}")
        text = line.decode(errors="replace")
        match = _URL_RE.search(text)
        if match:
            return match.group(1)
        seen.append(text)


async def _drain(process: asyncio.subprocess.Process) -> None:
    # Keep reading stdout so a chatty server never blocks on a full pipe.
    assert process.stdout is not None
    while await process.stdout.read(65536):
        pass


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is not None:
        return
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM) if sys.platform != "win32" else process.terminate()
    try:
        await asyncio.wait_for(process.wait(), 5)
    except TimeoutError:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL) if sys.platform != "win32" else process.kill()
        await process.wait()
