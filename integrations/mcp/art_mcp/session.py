"""One MCP client session (stdio or streamable HTTP) with the guards a training loop needs.

``connect(server)`` opens the transport, initializes the session and lists the tools; it always
closes everything on the way out, even when the body raised or the server died. ``call_tool``
never lets a tool's own failure escape: errors, timeouts and protocol errors come back as a
``ToolOutput`` with ``is_error`` set, and oversize results are truncated with a marker. Only a
broken connection (the server crashed or went away) raises ``ServerConnectionError``.
"""

from __future__ import annotations

import base64
import json
import logging
import sys
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any, TextIO

import anyio
import mcp_types
from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

from art_mcp.servers import HttpServer, ServerLike, ServerSpec, StdioServer, parse_server

logger = logging.getLogger(__name__)

DEFAULT_CONNECT_TIMEOUT_S = 30.0
DEFAULT_TOOL_TIMEOUT_S = 30.0
DEFAULT_MAX_RESULT_CHARS = 8_000
DEFAULT_MAX_HTTP_EVENT_BYTES = 64 * 1024 * 1024


class ServerConnectionError(RuntimeError):
    """The MCP server could not be started / reached, or its connection broke mid-session."""


@dataclass(frozen=True)
class ToolOutput:
    """What a tool call gave back, as the text the model will read.

    ``is_error`` is set for tool errors, timeouts and protocol errors (the text says which);
    ``truncated`` when the text was cut to the size limit (``original_chars`` is its full size).
    """

    text: str
    is_error: bool
    truncated: bool = False
    original_chars: int = 0
    duration_s: float = 0.0
    timed_out: bool = False


def truncate(text: str, max_chars: int) -> tuple[str, bool]:
    """``text`` cut to ``max_chars`` with a marker saying how much was dropped (0 = no limit).

    Example:
        >>> truncate("abcdef", 3)
        ('abc\\n[... truncated: showing 3 of 6 characters]', True)
    """
    if max_chars <= 0 or len(text) <= max_chars:
        return text, False
    return (
        f"{text[:max_chars]}\n[... truncated: showing {max_chars} of {len(text)} characters]",
        True,
    )


def result_text(result: mcp_types.CallToolResult) -> str:
    """The text of a tool result: its text blocks, resources and media as short placeholders.

    Example:
        >>> result_text(mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text="42")]))
        '42'
    """
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        elif isinstance(block, mcp_types.EmbeddedResource):
            resource = block.resource
            if isinstance(resource, mcp_types.TextResourceContents):
                parts.append(resource.text)
            else:
                parts.append(f"[binary resource {resource.uri}]")
        elif isinstance(block, mcp_types.ResourceLink):
            parts.append(f"[resource {block.uri}: {block.name}]")
        elif isinstance(block, mcp_types.ImageContent | mcp_types.AudioContent):
            size = len(base64.b64decode(block.data, validate=False)) if block.data else 0
            parts.append(f"[{block.type} {block.mime_type}, {size} bytes]")
        else:
            parts.append(str(block))
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content))
    return "\n".join(parts)


class McpSession:
    """An initialized MCP client session and the server's tools.

    Example:
        >>> async with connect("mcp-server-time") as session:  # starts a server: `mcp-server-time`, a subprocess  # doctest: +SKIP
        ...     [t.name for t in session.tools]
        ...     output = await session.call_tool("get_current_time", {"timezone": "UTC"})
        ['get_current_time', 'convert_time']
    """

    def __init__(
        self, client: ClientSession, server: ServerSpec, tools: list[mcp_types.Tool]
    ) -> None:
        self.client = client
        self.server = server
        self.tools = tools
        self.closed = False

    @property
    def label(self) -> str:
        return self.server.label

    async def list_tools(self) -> list[mcp_types.Tool]:
        """Every tool of the server (all pages)."""
        tools: list[mcp_types.Tool] = []
        cursor: str | None = None
        while True:
            params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await self._guard("tools/list", self.client.list_tools(params=params))
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return tools

    async def list_resources(self) -> list[mcp_types.Resource]:
        """Every resource of the server (all pages); empty if it serves none."""
        capabilities = self.client.server_capabilities
        if capabilities is not None and capabilities.resources is None:
            return []
        resources: list[mcp_types.Resource] = []
        cursor: str | None = None
        while True:
            params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await self._guard("resources/list", self.client.list_resources(params=params))
            resources.extend(page.resources)
            cursor = page.next_cursor
            if not cursor:
                return resources

    async def read_resource(self, uri: str) -> str:
        """The text of a resource (binary parts as placeholders)."""
        result = await self._guard("resources/read", self.client.read_resource(uri))
        parts = []
        for item in result.contents:
            if isinstance(item, mcp_types.TextResourceContents):
                parts.append(item.text)
            else:
                parts.append(f"[binary resource {item.uri}]")
        return "\n".join(parts)

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
        max_result_chars: int = DEFAULT_MAX_RESULT_CHARS,
    ) -> ToolOutput:
        """Call a tool; its failure comes back as an error ``ToolOutput``, never an exception.

        Raises ``ServerConnectionError`` only if the connection itself broke.
        """
        started = time.perf_counter()
        timed_out = False
        try:
            result = await self.client.call_tool(
                name, arguments or {}, read_timeout_seconds=timeout_s
            )
            text, is_error = result_text(result), bool(result.is_error)
        except MCPError as exc:
            # Over HTTP one failed response stream (e.g. an event over the size limit) is also
            # reported as CONNECTION_CLOSED while the session lives on: a ping tells them apart.
            if exc.code == CONNECTION_CLOSED and not await self.alive():
                self.closed = True
                raise ServerConnectionError(
                    f"MCP server {self.label!r} closed the connection during tool call {name!r} "
                    "(did it crash? see its stderr)"
                ) from exc
            timed_out = exc.code == REQUEST_TIMEOUT
            text = (
                f"tool {name!r} timed out after {timeout_s:g} s"
                if timed_out
                else f"tool {name!r} failed: {exc.message} (MCP error {exc.code})"
            )
            is_error = True
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            self.closed = True
            raise ServerConnectionError(
                f"MCP server {self.label!r}: connection lost during tool call {name!r}: {exc!r}"
            ) from exc
        duration = time.perf_counter() - started
        if is_error and not text.lower().startswith(("error", "tool ")):
            text = f"Error: {text}" if text else f"Error: tool {name!r} failed"
        cut, truncated = truncate(text, max_result_chars)
        return ToolOutput(cut, is_error, truncated, len(text), duration, timed_out)

    async def alive(self, timeout_s: float = 5.0) -> bool:
        """Whether the server still answers a ping."""
        if self.closed:
            return False
        try:
            with anyio.fail_after(timeout_s):
                await self.client.send_ping()
        except (MCPError, TimeoutError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            return False
        return True

    async def _guard(self, what: str, request: Any) -> Any:
        try:
            return await request
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                self.closed = True
                raise ServerConnectionError(
                    f"MCP server {self.label!r} closed the connection during {what}"
                ) from exc
            raise


@asynccontextmanager
async def connect(
    server: ServerLike,
    *,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    errlog: TextIO | None = None,
    max_http_event_bytes: int = DEFAULT_MAX_HTTP_EVENT_BYTES,
) -> AsyncIterator[McpSession]:
    """Open a session to ``server`` (command line, URL or spec) and list its tools.

        A stdio server's stderr goes to ``errlog`` (default: this process's stderr). The transport
        and the server process are shut down when the block exits, whatever happened inside it.
    Over HTTP, one server-sent event may hold up to ``max_http_event_bytes`` (a large tool result
    arrives whole and is truncated for the model, instead of failing the stream).

        Example:
            >>> async with connect("python examples/mcp/shop_server.py") as session:  # starts a server: the repository's example MCP server  # doctest: +SKIP
            ...     print([tool.name for tool in session.tools])
    """
    spec = parse_server(server)
    state = {"connected": False}
    try:
        async with AsyncExitStack() as stack:
            # The transport's and session's task groups are entered outside the deadline's
            # cancel scope: anyio scopes must exit in the order they were entered.
            read, write = await stack.enter_async_context(
                _transport(spec, errlog, max_http_event_bytes)
            )
            client = await stack.enter_async_context(ClientSession(read, write))
            try:
                with anyio.fail_after(connect_timeout_s):
                    await client.initialize()
                    session = McpSession(client, spec, [])
                    session.tools = await session.list_tools()
            except TimeoutError:
                raise ServerConnectionError(
                    f"MCP server {spec.label!r} ({spec}) did not answer initialize/tools/list "
                    f"within {connect_timeout_s:g} s"
                ) from None
            except MCPError as exc:
                hint = (
                    " (did the process exit? see its stderr)"
                    if exc.code == CONNECTION_CLOSED
                    else ""
                )
                raise ServerConnectionError(
                    f"could not initialize MCP server {spec.label!r} ({spec}): {exc.message}{hint}"
                ) from exc
            state["connected"] = True
            yield session
    except OSError as exc:
        if state["connected"]:
            raise
        raise ServerConnectionError(
            f"could not start MCP server {spec.label!r} ({spec}): {exc}"
        ) from exc
    except BaseExceptionGroup as group:
        raise _unwrap(group, spec, connected=state["connected"]) from group


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


def _is_transport_error(exc: BaseException) -> bool:
    import httpx2

    return isinstance(
        exc,
        httpx2.HTTPError
        | OSError
        | anyio.BrokenResourceError
        | anyio.ClosedResourceError
        | anyio.EndOfStream,
    )


def _unwrap(group: BaseExceptionGroup, spec: ServerSpec, *, connected: bool) -> BaseException:
    """The one exception a caller should see for a task group's failure.

    The body's own exception wins; a transport failure (the server died, the HTTP connection
    broke) becomes a ``ServerConnectionError``; cancellation and interrupts pass through.
    """
    leaves = _leaves(group)
    if any(isinstance(e, KeyboardInterrupt | SystemExit) for e in leaves):
        return group
    real = [e for e in leaves if not isinstance(e, anyio.get_cancelled_exc_class())]
    if not real:
        return group
    for exc in real:
        if isinstance(exc, ServerConnectionError):
            return exc
    for exc in real:
        if not _is_transport_error(exc):
            return exc
    first = real[0]
    what = "lost the connection to" if connected else "could not connect to"
    return ServerConnectionError(
        f"{what} MCP server {spec.label!r} ({spec}): {type(first).__name__}: {first}"
    )


@asynccontextmanager
async def _transport(
    spec: ServerSpec, errlog: TextIO | None, max_http_event_bytes: int
) -> AsyncIterator[tuple[Any, Any]]:
    if isinstance(spec, StdioServer):
        params = StdioServerParameters(
            command=spec.executable(), args=list(spec.args), env=spec.env, cwd=spec.cwd
        )
        async with stdio_client(params, errlog=errlog or sys.stderr) as streams:
            yield streams
    elif isinstance(spec, HttpServer):
        http = create_mcp_http_client(headers=dict(spec.headers) or None)
        async with (
            http,
            streamable_http_client(
                spec.url, http_client=http, max_sse_event_size=max_http_event_bytes
            ) as streams,
        ):
            yield streams
    else:  # pragma: no cover - parse_server returns one of the two
        raise TypeError(f"unknown MCP server spec {spec!r}")
