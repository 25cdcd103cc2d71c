"""Inside an agent's own network namespace: the gateway's address, and nothing else.

The sandbox starts the agent in a new network namespace (``unshare --net``), where only a
loopback device exists, down. This program runs first in it: it brings ``lo`` up, listens on
the gateway's own address (``127.0.0.1:PORT``, so the rollout's URLs need no change), and
forwards every connection to a Unix socket that the sandbox serves outside, which connects to
the gateway. Unix sockets are files: they cross network namespaces, TCP does not. Then it
runs the agent's command in its place (the forwarder goes on in a forked child, in the same
namespace, and dies with it).

The sandbox's launcher (``confine``) uses these functions; on its own:
``python -m art_cli_agents.bridge SOCKET HOST PORT -- COMMAND...``
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import socket
import struct
import sys

from art_cli_agents.forwarding import pipe

SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def loopback_up() -> None:
    """Bring ``lo`` up (a new network namespace starts with it down)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | IFF_UP))


async def forward(listener: socket.socket, unix_path: str) -> None:
    """Forward each connection accepted on ``listener`` to the Unix socket ``unix_path``."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_unix_connection(unix_path)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    server = await asyncio.start_server(handle, sock=listener)
    async with server:
        await server.serve_forever()


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (the gateway's own address, inside)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(128)
    return listener


def start_forwarder(
    listener: socket.socket, unix_path: str, close_fds: tuple[int, ...] = ()
) -> int:
    """Fork the forwarder of ``listener``'s connections to ``unix_path`` and return its pid;
    it lives as long as the namespace. ``close_fds``: descriptors it must not keep."""
    pid = os.fork()
    if pid == 0:
        try:
            for fd in close_fds:
                os.close(fd)
            asyncio.run(forward(listener, unix_path))
        finally:
            os._exit(0)
    listener.close()
    return pid


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if "--" not in args or args.index("--") != 3 or len(args) < 5:
        raise SystemExit("usage: python -m art_cli_agents.bridge SOCKET HOST PORT -- COMMAND...")
    unix_path, host, port = args[0], args[1], int(args[2])
    command = args[4:]
    loopback_up()
    start_forwarder(listen(host, port), unix_path)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
