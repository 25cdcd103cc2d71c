"""Serving benchmark on smollm2-135m: gateway overhead and batching throughput.

Prints, from one run, with the CPU, the device and the dtype the engine chose:
  1. latency of the same short request called in-process on the engine vs through the gateway
     over HTTP on loopback (validation, prompt building, recording to SQLite, the JSON answer),
     calls interleaved, p50/p99 and the overhead (goal: p50 < 1 ms, p99 < 5 ms). The HTTP
     client is a minimal keep-alive one, so the overhead is the gateway's; the same call made
     the usual way (``art.capture`` + the openai client, a new client per rollout) is shown
     beside it;
  2. where the gateway's time goes: the median of each stage of a request inside the gateway
     (``Gateway.stage_log``), an HTTP round trip of ``/health`` (parsing, routing, sending),
     and the top functions of a cProfile of the gateway's event-loop thread;
  3. 8 concurrent requests vs the same 8 sequentially (goal: >= 3x throughput).

Usage: bash run.sh bench serving [--base-model smollm2-135m] [--calls 100] [--max-tokens 64]
       bash run.sh bench serving --smoke   (tiny-random, 8 calls, 2 concurrent requests of 8
                                            tokens: every section of the table in seconds)
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from _machine import machine_line

import art_core as art
from art_core.cpu import cpu_model
from art_core.engines.base import Engine, GenerationRequest, SamplingParams
from art_core.gateway.timing import StageLog


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class RawHTTP:
    """A minimal HTTP/1.1 keep-alive client (so the client's own cost stays out of the
    gateway's overhead: httpx or openai cost ~0.5-2 ms a call by themselves)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = (
            f"{method} {path} HTTP/1.1\r\nhost: {self.host}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        )
        self.writer.write(head.encode() + body)
        status_line = await self.reader.readline()
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            key, _, value = line.decode().partition(":")
            if key.lower() == "content-length":
                length = int(value)
        return int(status_line.split()[1]), await self.reader.readexactly(length)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def main(base_model: str, calls: int, max_tokens: int, concurrency: int) -> None:
    async with art.LocalBackend(path=tempfile.mkdtemp(prefix="art-bench-")) as backend:
        model = art.TrainableModel(name="bench", project="bench", base_model=base_model)
        await model.register(backend)
        engine = backend.engine(model)
        served = backend.gateway.models[model.name]
        client = model.openai_client()
        messages = [{"role": "user", "content": "Name three colors."}]
        short = SamplingParams(temperature=0.0, max_tokens=8)
        body = json.dumps(
            {"model": model.name, "messages": messages, "temperature": 0.0, "max_tokens": 8}
        ).encode()
        http = RawHTTP(backend.server.host, backend.server.port)
        rollout = 0

        async def in_process() -> None:
            ids = served.prompts.build(messages, None, [])
            await backend.server.call(engine.generate(GenerationRequest(ids, short)))

        async def through_gateway() -> None:
            nonlocal rollout
            rollout += 1
            path = f"/rollouts/bench-{rollout}/v1/chat/completions"
            status, answer = await http.request("POST", path, body)
            assert status == 200, answer[:300]
            served.store.release(f"bench-{rollout}")

        async def with_openai_client() -> None:
            async with art.capture(model) as run:
                await run.openai_client().chat.completions.create(
                    model=model.name, messages=messages, temperature=0.0, max_tokens=8
                )

        async def health() -> None:
            await http.request("GET", "/health")

        for fn in (in_process, through_gateway, with_openai_client, health):
            for _ in range(3):
                await fn()  # warm-up
        stage_log = StageLog()
        backend.gateway.stage_log = stage_log
        direct, gateway, usual = await _latencies(
            calls, in_process, through_gateway, with_openai_client
        )
        backend.gateway.stage_log = None
        health_ms = [await _timed_ms(health) for _ in range(max(20, calls))]
        stages = stage_log.medians_ms()

        profile = await _profiled(backend, through_gateway, calls)
        await http.close()

        long = dict(
            model=model.name,
            messages=[{"role": "user", "content": "Write a short poem about the sea."}],
            temperature=1.0,
            max_tokens=max_tokens,
            seed=0,
        )

        async def one(i: int) -> int:
            r = await client.chat.completions.create(**{**long, "seed": i})  # type: ignore[call-overload]
            return r.usage.completion_tokens if r.usage else 0

        start = time.perf_counter()
        sequential_tokens = 0
        for i in range(concurrency):
            sequential_tokens += await one(i)
        sequential = time.perf_counter() - start
        start = time.perf_counter()
        concurrent_tokens = sum(await asyncio.gather(*(one(i) for i in range(concurrency))))
        concurrent = time.perf_counter() - start

    _print_latency(base_model, engine, direct, gateway, usual)
    _print_gateway_stages(health_ms, stages)
    _print_profile(profile, calls)

    _print_throughput(
        concurrency, max_tokens, (sequential_tokens, sequential), (concurrent_tokens, concurrent)
    )


async def _timed_ms(fn: Callable[[], Awaitable[None]]) -> float:
    start = time.perf_counter()
    await fn()
    return (time.perf_counter() - start) * 1000


async def _latencies(
    calls: int,
    in_process: Callable[[], Awaitable[None]],
    through_gateway: Callable[[], Awaitable[None]],
    with_openai_client: Callable[[], Awaitable[None]],
) -> tuple[list[float], list[float], list[float]]:
    """Milliseconds per call in each way, interleaved (drift in machine load hits all
    alike); the openai client's every fourth call."""
    direct: list[float] = []
    gateway: list[float] = []
    usual: list[float] = []
    for i in range(calls):
        direct.append(await _timed_ms(in_process))
        gateway.append(await _timed_ms(through_gateway))
        if i % 4 == 0:
            usual.append(await _timed_ms(with_openai_client))
    return direct, gateway, usual


async def _profiled(
    backend: art.LocalBackend, through_gateway: Callable[[], Awaitable[None]], calls: int
) -> cProfile.Profile:
    """A profile of the gateway's event-loop thread over ``calls`` calls through it."""
    profile = cProfile.Profile()

    async def profiling(on: bool) -> None:
        profile.enable() if on else profile.disable()

    await backend.server.call(profiling(True))
    for _ in range(calls):
        await through_gateway()
    await backend.server.call(profiling(False))
    return profile


def _print_throughput(
    concurrency: int,
    max_tokens: int,
    sequential_run: tuple[int, float],
    concurrent_run: tuple[int, float],
) -> None:
    """Tokens per second of the requests one after the other and all at once (batched):
    each run as (tokens, wall seconds)."""
    sequential_tokens, sequential = sequential_run
    concurrent_tokens, concurrent = concurrent_run
    seq_tps = sequential_tokens / sequential
    con_tps = concurrent_tokens / concurrent
    print(f"\n{f'{concurrency} requests x {max_tokens} tokens':<40}{'wall s':>10}{'tok/s':>10}")
    print(f"{'sequential':<40}{sequential:>10.2f}{seq_tps:>10.1f}")
    print(f"{'concurrent (batched)':<40}{concurrent:>10.2f}{con_tps:>10.1f}")
    print(f"{'throughput ratio (goal >= 3x)':<40}{con_tps / seq_tps:>19.2f}x")


def _print_latency(
    base_model: str, engine: Engine, direct: list[float], gateway: list[float], usual: list[float]
) -> None:
    """The latency of one call in each way, and the gateway's overhead."""
    print(
        f"\nserving benchmark: {base_model}, engine=transformers, device={engine.device}, dtype={engine.dtype}"
    )  # type: ignore[attr-defined]
    print(f"CPU: {cpu_model()}")
    print(f"\n{'latency of one call (8 tokens)':<40}{'p50 ms':>10}{'p99 ms':>10}")
    rows = [
        ("engine, in-process", direct),
        ("gateway (HTTP + record)", gateway),
        ("capture + openai client (the usual way)", usual),
    ]
    for name, values in rows:
        print(f"{name:<40}{statistics.median(values):>10.2f}{percentile(values, 0.99):>10.2f}")
    p50 = statistics.median(gateway) - statistics.median(direct)
    p99 = percentile(gateway, 0.99) - percentile(direct, 0.99)
    print(f"{'gateway overhead (goal < 1 / < 5 ms)':<40}{p50:>10.2f}{p99:>10.2f}")


def _print_gateway_stages(health_ms: list[float], stages: dict[str, float]) -> None:
    """Where the gateway's time goes: an HTTP round trip, then each stage's median."""
    print("\nwhere the gateway's time goes (median ms per request)")
    print(f"  {'HTTP round trip (GET /health)':<38}{statistics.median(health_ms):>8.3f}")
    for name, ms in stages.items():
        label = {
            "parse": "parse + validate the body",
            "prepare": "model, prompt ids, grammar",
            "queue+engine": "queue + engine (in-process row above)",
            "record": "record to SQLite (committed)",
            "respond": "build the JSON answer",
        }.get(name, name)
        print(f"  {label:<38}{ms:>8.3f}")
    own = statistics.median(health_ms) + sum(
        ms for name, ms in stages.items() if name != "queue+engine"
    )
    print(f"  {'gateway work (all but queue + engine)':<38}{own:>8.3f}")


def _print_profile(profile: cProfile.Profile, calls: int) -> None:
    """The gateway thread's profile: CPU per call and the top functions by own time."""
    stats = pstats.Stats(profile)
    entries: list[tuple[float, int, str]] = []
    for (file, line, func), (_, ncalls, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        if func in ("<method 'poll' of 'select.epoll' objects>",):
            continue  # waiting, not working
        entries.append((tottime, ncalls, f"{Path(file).name}:{line}({func})"))
    entries.sort(reverse=True)
    total = sum(e[0] for e in entries)
    print(
        f"\ncProfile of the gateway's event-loop thread, {calls} calls: "
        f"{total / calls * 1000:.3f} ms of CPU per call (profiled); top functions by own time"
    )
    print(f"  {'function':<70}{'calls/req':>10}{'us/req':>9}")
    for tottime, ncalls, where in entries[:12]:
        print(f"  {where[:70]:<70}{ncalls / calls:>10.1f}{tottime / calls * 1e6:>9.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base-model", default="smollm2-135m")
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--smoke", action="store_true", help="tiny-random, a few calls: every section in seconds"
    )
    args = parser.parse_args()
    print(machine_line(), flush=True)  # the figures below depend on it
    if args.smoke:
        args.base_model, args.calls, args.max_tokens, args.concurrency = "tiny-random", 8, 8, 2
    asyncio.run(main(args.base_model, args.calls, args.max_tokens, args.concurrency))
