"""``art-core ui [PATH]``: serve the viewer of an art folder on this machine.

    art-core ui .art                      # http://127.0.0.1:7998/
    art-core ui .art --host 0.0.0.0       # off loopback: a token is required (printed)

Read-only: it never writes into the folder. Off loopback it requires a token as
``art-core serve`` does (``--token`` or ``$ART_CORE_TOKEN``, else one is generated and
printed with the address to open).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from art_core.access import is_loopback, new_token

TOKEN_ENV = "ART_CORE_TOKEN"


def _say(message: str) -> None:
    print(f"art-core ui: {message}", flush=True)


def run(path: str, host: str, port: int, token: str | None) -> int:
    """Serve the viewer until interrupted. Example: ``run(".art", "127.0.0.1", 7998, None)``."""
    # The server side (uvicorn, starlette) loads only when the viewer runs, not for `--help`.
    import uvicorn

    from art_core.ui.app import build_ui_app
    from art_core.ui.auth import BrowserTokenAuth

    folder = Path(path).resolve()
    if not folder.is_dir():
        _say(f"{folder} is not a folder (pass the art folder, e.g. .art)")
        return 2
    if token is not None and not token.strip():
        _say("the token must not be empty")
        return 2
    generated = token is None and not is_loopback(host)
    if generated:
        token = new_token()
    app = build_ui_app(folder)
    if token is not None:
        app = BrowserTokenAuth(app, token)
    shown = host if ":" not in host else f"[{host}]"
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    _say(f"art folder {folder} (read-only)")
    address = f"http://{shown}:{port}/"

    async def announce() -> None:
        await server.serve()

    # The real port (``--port 0`` picks one) is known once the socket is bound.
    original_startup = server.startup

    async def startup(sockets: list | None = None) -> None:
        await original_startup(sockets=sockets)
        bound = port
        for listener in getattr(server, "servers", []):
            for sock in listener.sockets:
                bound = sock.getsockname()[1]
        url = address.replace(f":{port}/", f":{bound}/")
        _say(f"listening on {url.rstrip('/')}")
        if token is not None:
            if generated:
                _say("token generated (choose one with --token or $ART_CORE_TOKEN)")
            _say(f"open {url}?token={token}")
        else:
            _say(f"open {url}")

    server.startup = startup  # type: ignore[method-assign]
    import asyncio

    try:
        asyncio.run(announce())
    except KeyboardInterrupt:
        pass
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``ui`` with the ``art-core`` command line."""
    parser = subparsers.add_parser(
        "ui", help="view runs, rollouts and the training signal in a browser (read-only)"
    )
    parser.add_argument("path", nargs="?", default=".art", help="the art folder (default .art)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    parser.add_argument("--port", type=int, default=7998, help="0 picks a free port")
    parser.add_argument("--token", default=None, help=f"required off loopback (or ${TOKEN_ENV})")
    parser.set_defaults(
        func=lambda args: run(
            args.path,
            args.host,
            args.port,
            args.token if args.token is not None else os.environ.get(TOKEN_ENV) or None,
        )
    )
