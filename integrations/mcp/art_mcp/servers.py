"""Where an MCP server lives: a command line to spawn (stdio) or a URL (streamable HTTP)."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Commands that mean "the Python running art-mcp": a server script started with `python x.py`
# should see the same packages (mcp included) as the process that spawns it.
_PYTHON_ALIASES = {"python", "python3", f"python{sys.version_info.major}.{sys.version_info.minor}"}


class StdioServer(BaseModel):
    """An MCP server spawned as a subprocess, speaking JSON-RPC over its stdin/stdout.

    ``env`` is merged over the MCP SDK's safe default environment (PATH, HOME, ...).
    ``python`` / ``python3`` as the command mean the interpreter running this code, and a
    console script of this virtual environment is found even when it is not activated.

    Example:
        >>> StdioServer(command="mcp-server-time", args=["--local-timezone", "UTC"]).label
        'mcp-server-time'
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    transport: Literal["stdio"] = "stdio"
    command: str = Field(min_length=1)
    args: tuple[str, ...] = ()
    env: dict[str, str] | None = None
    cwd: str | None = None
    name: str | None = None

    @property
    def label(self) -> str:
        """A short name for logs and metadata: ``name``, else the script or command name."""
        if self.name:
            return self.name
        scripts = [a for a in self.args if a.endswith(".py")]
        return Path(scripts[0]).stem if scripts else Path(self.command).name

    def executable(self) -> str:
        """The command to spawn: ``python`` is this interpreter, and a bare name not on PATH
        is looked up next to it (a server installed in this virtual environment, which need
        not be activated)."""
        if self.command in _PYTHON_ALIASES:
            return sys.executable
        if os.sep not in self.command and shutil.which(self.command) is None:
            beside = Path(sys.executable).with_name(self.command)
            if beside.is_file():
                return str(beside)
        return self.command

    def __str__(self) -> str:
        return shlex.join([self.command, *self.args])


class HttpServer(BaseModel):
    """An MCP server reachable over streamable HTTP, e.g. ``http://127.0.0.1:8000/mcp``.

    Example:
        >>> HttpServer(url="http://127.0.0.1:8000/mcp").label
        '127.0.0.1:8000/mcp'
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    transport: Literal["http"] = "http"
    url: str
    headers: dict[str, str] = Field(default_factory=dict)
    name: str | None = None

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(
                f"an MCP server URL must start with http:// or https://, got {value!r}"
            )
        return value

    @property
    def label(self) -> str:
        return self.name or self.url.split("://", 1)[1]

    def __str__(self) -> str:
        return self.url


ServerSpec = StdioServer | HttpServer
ServerLike = StdioServer | HttpServer | str


def parse_server(server: ServerLike, *, name: str | None = None) -> ServerSpec:
    """A server spec from a spec, a URL (streamable HTTP) or a shell-style command line (stdio).

    Example:
        >>> parse_server("mcp-server-time --local-timezone UTC").args
        ('--local-timezone', 'UTC')
        >>> parse_server("http://127.0.0.1:8000/mcp").transport
        'http'
    """
    if isinstance(server, StdioServer | HttpServer):
        return server if name is None else server.model_copy(update={"name": name})
    if not isinstance(server, str):
        raise TypeError(
            f"an MCP server is a command line, a URL or a StdioServer/HttpServer, got {type(server).__name__}"
        )
    text = server.strip()
    if not text:
        raise ValueError("the MCP server command line / URL is empty")
    if text.startswith(("http://", "https://")):
        return HttpServer(url=text, name=name)
    try:
        parts = shlex.split(text, posix=os.name != "nt")
    except ValueError as exc:
        raise ValueError(f"cannot parse the MCP server command line {server!r}: {exc}") from None
    return StdioServer(command=parts[0], args=tuple(parts[1:]), name=name)
