"""``art-core tracing``: install and run the local tracing servers (MLflow, Phoenix)."""

from __future__ import annotations

import argparse
import signal
import time
from pathlib import Path

from art_core.tracing.servers import SERVERS, TracingServer, install_tracing_server


def install(names: list[str]) -> int:
    """Create each named server's venv (idempotent) and print where it is.

    Example:
        >>> install(["mlflow"])  # needs an install: this is the install (a venv from PyPI)  # doctest: +SKIP
    """
    for name in names:
        print(f"{name}: {install_tracing_server(name, quiet=False)}")
    return 0


def serve(name: str, host: str, port: int | None, data_dir: Path) -> int:
    """Run one server in the foreground until Ctrl-C, its data kept in ``data_dir``.

    Example:
        >>> serve("phoenix", "127.0.0.1", 6006, Path(".art/phoenix"))  # starts a server: until Ctrl-C  # doctest: +SKIP
    """
    server = TracingServer(
        name, host=host, port=port or SERVERS[name].default_port, data_dir=data_dir
    )
    with server:
        print(f"{name} at {server.url} (OTLP: {server.url}/v1/traces); log: {server.log_path}")
        stop = False

        def _stop(*_: object) -> None:
            nonlocal stop
            stop = True

        signal.signal(signal.SIGTERM, _stop)
        try:
            while not stop and server.process is not None and server.process.poll() is None:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "tracing", help="install and run local tracing servers (MLflow, Phoenix)"
    )
    actions = parser.add_subparsers(dest="action", required=True)
    install_parser = actions.add_parser("install", help="create a server's own venv")
    install_parser.add_argument("names", nargs="+", choices=sorted(SERVERS))
    install_parser.set_defaults(func=lambda args: install(args.names))
    serve_parser = actions.add_parser("serve", help="run a server in the foreground")
    serve_parser.add_argument("name", choices=sorted(SERVERS))
    serve_parser.add_argument("--host", default="127.0.0.1")
    serve_parser.add_argument(
        "--port", type=int, default=None, help="default: 5000 (mlflow), 6006 (phoenix)"
    )
    serve_parser.add_argument(
        "--data",
        type=Path,
        default=None,
        help="where its database lives (default: .art/tracing/NAME)",
    )
    serve_parser.set_defaults(
        func=lambda args: serve(
            args.name, args.host, args.port, args.data or Path(".art/tracing") / args.name
        )
    )
