"""Copying a forwarded connection, one direction at a time: used inside an agent's network
namespace (``bridge``, run as ``python -m``, so this is a module of its own) and outside it
(``sandbox``)."""

from __future__ import annotations

import asyncio

CHUNK = 64 * 1024


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy ``reader`` to ``writer`` until either side ends, then close ``writer`` (both
    ends of a forwarded connection, inside the namespace and outside it)."""
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()
