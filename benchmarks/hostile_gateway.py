"""A hostile caller against a live ``art-core serve`` (tiny-random): 5xx, hangs and leaks.

Starts ``art-core serve`` on loopback in a temporary art folder, registers a tiny-random model
and sends, per class of input that once hurt the server (issue 14), a few requests as a
hostile caller would, with well-formed requests in flight beside them. Prints one row per
class and the totals:

  5xx      answers with a 5xx status (or a stream that failed with a server error)
  hangs    requests with no answer within the timeout, and stalls of the server: /health
           polled every 20 ms while the class runs, a stall is an answer slower than 200 ms
  leaks    resources a caller grew past the bound: recorded bytes grown by more than twice
           the request size, a broken keep-alive connection after an error, a server path in an
           error body, server memory grown by more than 200 MB over the run
  innocent well-formed requests sent beside the hostile ones that failed

``--smoke`` runs every class at a smaller count (2 huge prompts, 40 unreleased rollouts, 110
idle connections, 2 innocent requests per class): the same rows, in a fraction of the time.

The server runs in its own process group and gets SIGTERM if this script dies; it is stopped
(SIGKILL after 30 s) whatever happens.

Usage: python benchmarks/hostile_gateway.py [--timeout 60] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from _children import LISTENING, spawn, stop
from _machine import machine_line

MODEL = "hostile"
GOOD = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
# An absolute path of this machine in an error body (the art folder, the venv, site-packages).
SERVER_PATH = re.compile(r"(/tmp/|/home/|/work/|/usr/|/root/|site-packages|\.py\b)")
STALL_S = 0.2


@dataclass
class Sizes:
    """How many of each: the full run's, or ``SMOKE``'s."""

    huge_prompts: int = 4
    unreleased_rollouts: int = 400
    idle_connections: int = 1100
    idle_wait_s: float = 3.0
    innocents: int = 4


SIZES = Sizes()
SMOKE = Sizes(2, unreleased_rollouts=40, idle_connections=110, idle_wait_s=1.0, innocents=2)


@dataclass
class Tally:
    name: str
    sent: int = 0
    server_errors: int = 0
    hangs: int = 0
    leaks: int = 0
    innocent_failed: int = 0
    worst_health_ms: float = 0.0
    notes: list[str] = field(default_factory=list)


class Target:
    """The live server: its URL, process and folder."""

    def __init__(self, url: str, process: subprocess.Popen[bytes], folder: Path) -> None:
        self.url, self.process, self.folder = url, process, folder

    def rss_mb(self) -> float:
        try:
            for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return 0.0

    def storage_bytes(self) -> int:
        """Bytes of recorded data in the calls databases (rows, not files: the WAL holds a
        second, temporary copy of recent pages)."""
        total = 0
        for path in self.folder.rglob("calls.sqlite"):
            with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
                tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
                for table in ("calls", "requests"):
                    if table in tables:
                        row = db.execute(f"SELECT COALESCE(SUM(LENGTH(data)), 0) FROM {table}")
                        total += int(row.fetchone()[0])
        return total


def _spawn_server(folder: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}

    def common_fd_limit() -> None:  # 1024 open files, a common default
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))

    with open(folder / "serve.log", "wb") as log:
        # Port 0: the server binds a free port itself and prints it. A port picked here and
        # bound there could be taken in between by another process (another test's server),
        # whose answers this script would then read as ours.
        return spawn(
            [sys.executable, "-m", "art_core.server.cli", "--port", "0", "--path", str(folder)],
            stdout=log,
            env=env,
            before_exec=common_fd_limit,
        )


def log_text(log: Path, last: int = 6000) -> str:
    """The last ``last`` characters of the server's log (a small file, read at once)."""
    return log.read_text(errors="replace")[-last:]


async def listening_url(process: subprocess.Popen[bytes], log: Path, timeout_s: float) -> str:
    """The URL the server prints in its log once it listens; ``RuntimeError`` with the log
    if it exits or says nothing within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = LISTENING.search(log_text(log, last=1 << 20))
        if found:
            return found.group(1)
        if process.poll() is not None:
            break
        await asyncio.sleep(0.1)
    state = "exited" if process.poll() is not None else f"said nothing in {timeout_s:.0f} s"
    raise RuntimeError(f"art-core serve {state}:\n{log_text(log)}")


async def start_server(folder: Path) -> Target:
    # Spawned from the main thread, which lives as long as the server must (see _children).
    process = _spawn_server(folder)
    log = folder / "serve.log"
    try:
        url = await listening_url(process, log, timeout_s=120)
        async with httpx.AsyncClient(timeout=5) as http:
            register = await http.post(
                f"{url}/api/models/register",
                json={"name": MODEL, "project": "hostile", "base_model": "tiny-random"},
                timeout=300,
            )
            if register.status_code != 200:
                # The server's own reason (the body names it; its log has the traceback).
                raise RuntimeError(
                    f"registering {MODEL!r} answered {register.status_code}: "
                    f"{register.text[:2000]}\n--- serve.log (tail) ---\n" + log_text(log)
                )
    except BaseException:
        stop(process)
        raise
    return Target(url, process, folder)


class HealthProbe:
    """Polls /health on its own connection; the slowest answer while a class runs."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.worst = 0.0
        self.stalls = 0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> HealthProbe:
        self._task = asyncio.create_task(self._poll())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass

    async def _poll(self) -> None:
        async with httpx.AsyncClient(timeout=60) as http:
            while True:
                start = time.perf_counter()
                try:
                    await http.get(f"{self.url}/health")
                except httpx.HTTPError:
                    pass
                took = time.perf_counter() - start
                self.worst = max(self.worst, took)
                self.stalls += took > STALL_S
                await asyncio.sleep(0.02)


async def post(
    http: httpx.AsyncClient,
    url: str,
    body: Any,
    tally: Tally,
    *,
    headers: dict[str, str] | None = None,
    innocent: bool = False,
) -> httpx.Response | None:
    """POST and count: 5xx, hangs (timeouts), server paths in error bodies."""
    tally.sent += 1
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        response = await http.post(
            url,
            content=content,
            headers={"content-type": "application/json", **(headers or {})},
        )
    except httpx.TimeoutException:
        tally.hangs += 1
        tally.notes.append("timeout")
        return None
    except httpx.HTTPError as exc:
        tally.server_errors += 1
        tally.notes.append(f"connection error: {type(exc).__name__}")
        return None
    if response.status_code >= 500:
        tally.server_errors += 1
        tally.notes.append(f"{response.status_code}: {response.text[:80]}")
    elif b"data: " in response.content[:6] and b'"server_error"' in response.content:
        tally.server_errors += 1
        tally.notes.append("stream ended with a server error")
    if response.status_code >= 400 and SERVER_PATH.search(response.text):
        tally.leaks += 1
        tally.notes.append("server path in the error body")
    if innocent and response.status_code != 200:
        tally.innocent_failed += 1
    return response


async def run_class(
    target: Target,
    name: str,
    hostile: Callable[[httpx.AsyncClient, str, Tally], Awaitable[None]],
    request_timeout: float,
    innocents: int,
) -> Tally:
    """Run one class: the hostile requests, with well-formed ones beside them."""
    tally = Tally(name)
    url = f"{target.url}/v1/chat/completions"
    async with HealthProbe(target.url) as probe:
        async with httpx.AsyncClient(timeout=request_timeout) as http:

            async def innocent(i: int) -> None:
                await post(http, url, {**GOOD, "seed": i}, tally, innocent=True)

            await asyncio.gather(
                hostile(http, url, tally), *(innocent(i) for i in range(innocents))
            )
    tally.worst_health_ms = probe.worst * 1000
    tally.hangs += probe.stalls
    if probe.stalls:
        tally.notes.append(f"/health stalled {probe.stalls}x (worst {probe.worst * 1000:.0f} ms)")
    return tally


# ------------------------------------------------------------------------------- the classes
async def engine_failing_value(http: httpx.AsyncClient, url: str, tally: Tally) -> None:
    for seed in (2**64, 2**64 + 5, -(2**64)):
        await post(http, url, {**GOOD, "seed": seed}, tally)


def _allof_schema(target_bytes: int) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    size = 0
    while size < target_bytes:
        part = {
            "type": "object",
            "properties": {f"p{len(parts)}": {"type": "string", "minLength": 1}},
        }
        parts.append(part)
        size += len(json.dumps(part)) + 2
    return {"type": "object", "allOf": parts}


async def large_schema(http: httpx.AsyncClient, url: str, tally: Tally) -> None:
    schema = _allof_schema(200_000)
    await post(
        http,
        url,
        {
            **GOOD,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": schema},
            },
        },
        tally,
    )
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    await post(http, url, {**GOOD, "tools": [tool]}, tally)


async def huge_prompts(http: httpx.AsyncClient, url: str, tally: Tally) -> None:
    body = {**GOOD, "messages": [{"role": "user", "content": "word " * 1_000_000}]}  # 5 MB
    await asyncio.gather(*(post(http, url, body, tally) for _ in range(SIZES.huge_prompts)))


async def non_ascii_digits(http: httpx.AsyncClient, url: str, tally: Tally) -> None:
    for model in (f"{MODEL}@²", f"{MODEL}@١", f"{MODEL}@𝟙"):
        await post(http, url, {**GOOD, "model": model}, tally)


async def deep_nesting(http: httpx.AsyncClient, url: str, tally: Tally) -> None:
    depth = 100_000
    deep = b"[" * depth + b"]" * depth
    await post(http, url, b'{"model": "hostile", "messages": ' + deep + b"}", tally)
    meta = b'{"a":' * depth + b"1" + b"}" * depth
    body = json.dumps(GOOD).encode()[:-1] + b', "metadata": ' + meta + b"}"
    await post(http, url, body, tally)
    header = "[" * 3000 + "]" * 3000
    await post(http, url, GOOD, tally, headers={"x-art-metadata": header})
    header = '{"a":' * 1500 + "1" + "}" * 1500
    await post(http, url, GOOD, tally, headers={"x-art-metadata": header})


async def lone_surrogates(http: httpx.AsyncClient, url: str, tally: Tally) -> None:
    base = json.dumps(GOOD)[:-1]
    for extra in (
        ', "metadata": {"k": "\\ud800"}',
        ', "stop": ["\\udc00"]',
        ', "user": "\\ud83d"',
        ', "metadata": {"\\udfff": 1}',
    ):
        await post(http, url, (base + extra + "}").encode(), tally)
    await post(
        http,
        url,
        {**GOOD, "messages": [{"role": "user", "content": "x"}]},
        tally,
        headers={"x-art-metadata": '{"k": "\\ud800"}'},
    )


async def keep_alive_after_errors(http: httpx.AsyncClient, url: str, tally: Tally) -> None:
    """Each error class on one keep-alive connection, then a good request on it."""
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    base = json.dumps(GOOD)[:-1]
    bad_bodies: list[bytes] = [
        json.dumps({**GOOD, "model": f"{MODEL}@²"}).encode(),
        (base + ', "metadata": {"k": "\\ud800"}}').encode(),
        json.dumps({**GOOD, "seed": 2**64}).encode(),
        b'{"model": "hostile", "messages": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
    ]
    async with httpx.AsyncClient(timeout=http.timeout, limits=limits) as one:
        for body in bad_bodies:
            await post(one, url, body, tally)
            response = await post(one, url, GOOD, tally)
            if response is None or response.status_code != 200:
                tally.leaks += 1
                tally.notes.append("keep-alive connection lost after an error")
            elif response.headers.get("connection", "").lower() == "close":
                tally.leaks += 1
                tally.notes.append("server closed the keep-alive connection")


def storage_amplification(
    target: Target,
) -> Callable[[httpx.AsyncClient, str, Tally], Awaitable[None]]:
    async def run(http: httpx.AsyncClient, url: str, tally: Tally) -> None:
        for blob in (60_000, 1_000_000):  # under and over the metadata bound
            before = target.storage_bytes()
            body = {**GOOD, "n": 16, "max_tokens": 2, "metadata": {"blob": "x" * blob}}
            size = len(json.dumps(body))
            response = await post(http, url, body, tally)
            grown = target.storage_bytes() - before
            if response is not None and response.status_code == 200 and grown > 2 * size:
                tally.leaks += 1
                tally.notes.append(f"storage grew {grown / size:.1f}x the request size")
            elif response is not None and response.status_code >= 400:
                tally.notes.append(f"{blob} B metadata: {response.status_code}, grew {grown} B")
        # metadata over the header too
        header = json.dumps({"blob": "y" * 60_000})
        await post(
            http,
            url,
            {**GOOD, "n": 16, "max_tokens": 2},
            tally,
            headers={"x-art-metadata": header},
        )

    return run


async def unreleased_rollouts(http: httpx.AsyncClient, url: str, tally: Tally) -> None:
    root = url.removesuffix("/v1/chat/completions")
    body = {**GOOD, "max_tokens": 1, "metadata": {"pad": "z" * 20_000}}

    async def one(i: int) -> None:
        await post(http, f"{root}/rollouts/leak-{i}/v1/chat/completions", body, tally)

    total = SIZES.unreleased_rollouts
    for start in range(0, total, 20):
        await asyncio.gather(*(one(i) for i in range(start, min(start + 20, total))))


async def unbounded_training(http: httpx.AsyncClient, url: str, tally: Tally) -> None:
    """Training settings that once made a step endless (num_epochs=1e9, lora_rank=20000),
    and ones within TrainConfig's range but beyond the server's limits: each a 4xx at once."""
    root = url.removesuffix("/v1/chat/completions")
    group = {"trajectories": [{"messages_and_choices": [{"role": "user", "content": "x"}]}] * 2}
    for config in (
        {"num_epochs": 10**9},
        {"lora_rank": 20000},
        {"num_epochs": 500},
        {"optimizer_steps_per_epoch": 10**6},
        {"lora_rank": 512},
    ):
        response = await post(
            http,
            f"{root}/api/models/hostile/{MODEL}/train",
            {"groups": [group], "config": config},
            tally,
        )
        if response is not None and response.status_code < 400:
            tally.leaks += 1
            tally.notes.append(f"accepted {config}")


async def idle_connections(http: httpx.AsyncClient, url: str, tally: Tally) -> None:
    """1100 connections that send half a request and wait (the server runs with 1024 file
    descriptors), while the innocent requests beside them must be served."""
    host, _, port = url.removeprefix("http://").partition("/")[0].partition(":")
    writers = []
    total = SIZES.idle_connections
    for start in range(0, total, 100):  # 100 at a time
        opened = await asyncio.gather(
            *(asyncio.open_connection(host, int(port)) for _ in range(min(100, total - start))),
            return_exceptions=True,
        )
        for item in opened:
            tally.sent += 1
            if isinstance(item, tuple):
                item[1].write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
                writers.append(item[1])
    await asyncio.sleep(SIZES.idle_wait_s)  # the innocents run now, among the idle sockets
    for writer in writers:
        writer.close()


async def main(request_timeout: float) -> None:
    folder = Path(tempfile.mkdtemp(prefix="art-hostile-"))
    target = await start_server(folder)
    try:
        rss_start = target.rss_mb()
        classes: list[tuple[str, Callable[[httpx.AsyncClient, str, Tally], Awaitable[None]]]] = [
            ("engine-failing value (seed >= 2^64)", engine_failing_value),
            ("200 KB allOf schema", large_schema),
            (f"{SIZES.huge_prompts} x 5 MB prompts", huge_prompts),
            ("non-ASCII digits in model@step", non_ascii_digits),
            ("deep nesting (body, header)", deep_nesting),
            ("lone surrogates", lone_surrogates),
            ("keep-alive after errors", keep_alive_after_errors),
            ("n=16, 60 KB / 1 MB metadata", storage_amplification(target)),
            (f"{SIZES.unreleased_rollouts} unreleased rollouts", unreleased_rollouts),
            ("training settings beyond bounds", unbounded_training),
            (f"{SIZES.idle_connections} idle connections (ulimit 1024)", idle_connections),
        ]
        tallies = []
        for name, hostile in classes:
            started = time.perf_counter()
            tally = await run_class(target, name, hostile, request_timeout, SIZES.innocents)
            took = time.perf_counter() - started
            print(f"  {name}: {took:.1f} s", file=sys.stderr, flush=True)
            tallies.append(tally)
            if target.process.poll() is not None:
                tally.notes.append("the server died")
                break
        rss_end = target.rss_mb()
        grown = rss_end - rss_start
        if grown > 200:
            tallies[-1].leaks += 1
            tallies[-1].notes.append(f"server memory grew {grown:.0f} MB")
    finally:
        stop(target.process, grace_s=30)

    print(f"\nhostile corpus against art-core serve (tiny-random), {folder}")
    print(f"server memory {rss_start:.0f} MB -> {rss_end:.0f} MB")
    header = f"{'class':<38}{'sent':>6}{'5xx':>6}{'hangs':>7}{'leaks':>7}{'innocent':>10}{'/health max ms':>16}"
    print(header)
    for t in tallies:
        print(
            f"{t.name:<38}{t.sent:>6}{t.server_errors:>6}{t.hangs:>7}{t.leaks:>7}"
            f"{t.innocent_failed:>10}{t.worst_health_ms:>16.0f}"
        )
    totals = [
        sum(getattr(t, k) for t in tallies)
        for k in ("sent", "server_errors", "hangs", "leaks", "innocent_failed")
    ]
    print(f"{'total':<38}{totals[0]:>6}{totals[1]:>6}{totals[2]:>7}{totals[3]:>7}{totals[4]:>10}")
    for t in tallies:
        for note in dict.fromkeys(t.notes):
            print(f"  {t.name}: {note}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per request")
    parser.add_argument(
        "--smoke", action="store_true", help="every class, smaller counts: the same rows, faster"
    )
    args = parser.parse_args()
    print(machine_line(), flush=True)  # the figures below depend on it
    if args.smoke:
        SIZES = SMOKE
    asyncio.run(main(args.timeout))
