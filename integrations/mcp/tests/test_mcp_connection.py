"""Connecting to real MCP server processes over stdio and streamable HTTP."""

from __future__ import annotations

import socket

import mcp_types
import pytest
from art_mcp import (
    HttpServer,
    ServerConnectionError,
    StdioServer,
    ToolSet,
    connect,
    input_schema_to_parameters,
    parse_server,
)
from mcp_support import FAULTY_STDIO

EXPECTED_TOOLS = ["lookup", "add", "explode", "hang", "big", "crash"]


async def check_session(server: object) -> None:
    async with connect(server) as session:  # type: ignore[arg-type]
        assert [t.name for t in session.tools] == EXPECTED_TOOLS
        resources = await session.list_resources()
        assert [str(r.uri) for r in resources] == ["notes://readme"]
        assert (
            await session.read_resource("notes://readme") == "This server exists to test art-mcp."
        )

        toolset = ToolSet.from_mcp(session.tools, complete_task=True, strict=True)
        assert toolset.names == [*EXPECTED_TOOLS, "complete_task"]
        lookup = toolset.definitions[0]["function"]
        assert lookup == {
            "name": "lookup",
            "description": "The capital city of a country.",
            "parameters": {
                "type": "object",
                "properties": {"country": {"enum": ["France", "Japan", "Peru"], "type": "string"}},
                "required": ["country"],
                "additionalProperties": False,
            },
        }
        output = await session.call_tool("lookup", {"country": "Peru"})
        assert (output.text, output.is_error) == ("The capital of Peru is Lima.", False)
        bad = await session.call_tool("lookup", {"country": "Spain"})
        assert bad.is_error and "Input should be 'France', 'Japan' or 'Peru'" in bad.text
        assert (await session.call_tool("add", {"a": 2, "b": 40})).text == "42"


async def test_stdio_server_lists_converts_and_calls_tools() -> None:
    await check_session(FAULTY_STDIO)


async def test_streamable_http_server_lists_converts_and_calls_tools(
    faulty_http: HttpServer,
) -> None:
    assert faulty_http.url.startswith("http://127.0.0.1:") and faulty_http.url.endswith("/mcp")
    await check_session(faulty_http)


async def test_third_party_time_server_from_pypi() -> None:
    async with connect("mcp-server-time --local-timezone Etc/UTC") as session:
        names = [t.name for t in session.tools]
        assert names == ["get_current_time", "convert_time"]
        parameters = ToolSet.from_mcp(session.tools).definitions[0]["function"]["parameters"]
        assert parameters["required"] == ["timezone"] and "title" not in parameters
        output = await session.call_tool("get_current_time", {"timezone": "Asia/Tokyo"})
        assert not output.is_error and '"timezone": "Asia/Tokyo"' in output.text
        wrong = await session.call_tool("get_current_time", {"timezone": "Mars/Olympus"})
        assert wrong.is_error and "Invalid timezone" in wrong.text


async def test_a_command_that_does_not_exist_is_a_clear_error() -> None:
    with pytest.raises(
        ServerConnectionError, match="could not start MCP server 'no-such-mcp-server'"
    ):
        async with connect("no-such-mcp-server --flag"):
            pass


async def test_a_process_that_is_not_an_mcp_server_is_a_clear_error() -> None:
    with pytest.raises(ServerConnectionError, match="could not initialize MCP server"):
        async with connect("python -c 'print(1)'", connect_timeout_s=20):
            pass


async def test_a_url_with_nothing_listening_is_a_clear_error() -> None:
    with socket.socket() as sock:  # a port that was free a moment ago
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(ServerConnectionError, match="could not connect to MCP server"):
        async with connect(f"http://127.0.0.1:{port}/mcp", connect_timeout_s=20):
            pass


def test_parse_server_takes_command_lines_and_urls() -> None:
    stdio = parse_server("python server.py --port 3 'a b'")
    assert isinstance(stdio, StdioServer)
    assert (stdio.command, stdio.args, stdio.label) == (
        "python",
        ("server.py", "--port", "3", "a b"),
        "server",
    )
    http = parse_server("https://example.com/mcp", name="remote")
    assert isinstance(http, HttpServer) and http.label == "remote"
    with pytest.raises(ValueError, match="empty"):
        parse_server("   ")
    with pytest.raises(ValueError, match="http:// or https://"):
        HttpServer(url="ftp://example.com")


def test_schema_conversion_keeps_property_names_and_sanitizes_tool_names() -> None:
    schema = {
        "type": "object",
        "title": "Args",
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "properties": {
            "title": {"type": "string", "title": "Title"},
            "tags": {"type": "array", "items": {"type": "string", "title": "Tag"}},
            "where": {
                "anyOf": [
                    {"type": "object", "properties": {"x": {"type": "integer"}}},
                    {"type": "null"},
                ]
            },
        },
    }
    parameters = input_schema_to_parameters(schema, strict=True)
    assert set(parameters["properties"]) == {
        "title",
        "tags",
        "where",
    }  # a *property* named title stays
    assert parameters["properties"]["title"] == {"type": "string"}
    assert parameters["properties"]["tags"]["items"] == {"type": "string"}
    assert parameters["properties"]["where"]["anyOf"][0]["additionalProperties"] is False
    assert "$schema" not in parameters and parameters["additionalProperties"] is False
    with pytest.raises(ValueError, match="type 'object'"):
        input_schema_to_parameters({"type": "string"})

    tools = [
        mcp_types.Tool(name="files/read file", inputSchema={"type": "object"}),
        mcp_types.Tool(name="files_read_file", inputSchema={"type": "object"}),
    ]
    toolset = ToolSet.from_mcp(tools)
    assert toolset.names == ["files_read_file", "files_read_file_2"]
    assert toolset.mcp_names == {
        "files_read_file": "files/read file",
        "files_read_file_2": "files_read_file",
    }
    with pytest.raises(ValueError, match="no tool named"):
        ToolSet.from_mcp(tools, include=["nope"])
