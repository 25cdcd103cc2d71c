"""The load of ``decode_overhead.py``, in a process of its own (as an agent is): ROWS
concurrent chat completions over raw HTTP/1.1 keep-alive connections, streamed or not.

Protocol on stdin/stdout: it connects and warms each connection, prints ``ready``; for each
``go`` line it runs the ROWS requests and prints ``{"seconds", "tokens", "cpu"}`` (cpu: this
process's CPU seconds meanwhile); ``quit`` ends it.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

MESSAGES = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]


async def request(
    connection: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    model: str,
    seed: int,
    max_tokens: int,
    stream: bool,
) -> int:
    """One chat completion; the number of tokens it sampled."""
    reader, writer = connection
    body = json.dumps(
        {
            "model": model,
            "messages": MESSAGES,
            "max_tokens": max_tokens,
            "temperature": 1.0,
            "seed": seed,
            "stream": stream,
        }
    ).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    writer.write(head.encode() + body)
    await writer.drain()
    status = await reader.readline()
    if b" 200 " not in status:
        raise RuntimeError(f"the gateway answered {status!r}")
    headers = {}
    while (line := await reader.readline()) != b"\r\n":
        key, _, value = line.decode().partition(":")
        headers[key.strip().lower()] = value.strip()
    if "content-length" in headers:
        answer = json.loads(await reader.readexactly(int(headers["content-length"])))
        return int(answer["usage"]["completion_tokens"])
    events = b""
    while size := int((await reader.readline()).strip(), 16):  # chunked
        events += await reader.readexactly(size)
        await reader.readline()
    await reader.readline()
    tokens = 0
    for line in events.split(b"\n"):
        if line.startswith(b"data: {") and b'"token_ids"' in line:
            tokens += len(json.loads(line[6:])["choices"][0]["token_ids"])
    return tokens


async def main(port: int, model: str, rows: int, max_tokens: int, stream: bool) -> None:
    connections = [await asyncio.open_connection("127.0.0.1", port) for _ in range(rows)]
    await asyncio.gather(*(request(c, model, i, 2, stream) for i, c in enumerate(connections)))
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    while (await loop.run_in_executor(None, sys.stdin.readline)).strip() == "go":
        started, cpu = time.perf_counter(), time.process_time()
        tokens = await asyncio.gather(
            *(request(c, model, i, max_tokens, stream) for i, c in enumerate(connections))
        )
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        print(json.dumps({"seconds": seconds, "tokens": sum(tokens), "cpu": cpu}), flush=True)


if __name__ == "__main__":
    port, model, rows, max_tokens, stream = sys.argv[1:6]
    asyncio.run(main(int(port), model, int(rows), int(max_tokens), stream == "stream"))
