"""Serving benchmark on smollm2-135m: gateway overhead and batching throughput.

Prints, from one run:
  1. latency of the same short request called in-process on the engine vs through the gateway
     (HTTP + validation + prompt building + recording to SQLite), p50/p99 and the overhead;
  2. 8 concurrent requests vs the same 8 sequentially (goal: >= 3x throughput).

Usage: bash run.sh bench serving [--base-model smollm2-135m] [--calls 30] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

import art_core as art
from art_core.engines.base import GenerationRequest, SamplingParams


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def main(base_model: str, calls: int, max_tokens: int, concurrency: int) -> None:
    async with art.LocalBackend(path=tempfile.mkdtemp(prefix="art-bench-")) as backend:
        model = art.TrainableModel(name="bench", project="bench", base_model=base_model)
        await model.register(backend)
        engine = backend.engine(model)
        served = backend.gateway.models[model.name]
        client = model.openai_client()
        messages = [{"role": "user", "content": "Name three colors."}]
        short = SamplingParams(temperature=0.0, max_tokens=8)

        async def in_process() -> None:
            ids = served.prompts.build(messages, None, [])
            await backend.server.call(engine.generate(GenerationRequest(ids, short)))

        async def through_gateway() -> None:
            async with art.capture(model) as run:
                await run.openai_client().chat.completions.create(
                    model=model.name, messages=messages, temperature=0.0, max_tokens=8
                )

        async def timed(fn, n: int) -> list[float]:  # type: ignore[no-untyped-def]
            out = []
            for _ in range(n):
                start = time.perf_counter()
                await fn()
                out.append((time.perf_counter() - start) * 1000)
            return out

        await timed(in_process, 3)
        await timed(through_gateway, 3)  # warm-up
        direct = await timed(in_process, calls)
        gateway = await timed(through_gateway, calls)

        long = dict(
            model=model.name,
            messages=[{"role": "user", "content": "Write a short poem about the sea."}],
            temperature=1.0,
            max_tokens=max_tokens,
            seed=0,
        )

        async def one(i: int) -> int:
            r = await client.chat.completions.create(**{**long, "seed": i})
            return r.usage.completion_tokens if r.usage else 0

        start = time.perf_counter()
        sequential_tokens = 0
        for i in range(concurrency):
            sequential_tokens += await one(i)
        sequential = time.perf_counter() - start
        start = time.perf_counter()
        concurrent_tokens = sum(await asyncio.gather(*(one(i) for i in range(concurrency))))
        concurrent = time.perf_counter() - start

    print(
        f"\nserving benchmark: {base_model}, engine=transformers, device={engine.device}, dtype={engine.dtype}"
    )
    print(f"\n{'latency of one call (8 tokens)':<34}{'p50 ms':>10}{'p99 ms':>10}")
    print(
        f"{'engine, in-process':<34}{statistics.median(direct):>10.1f}{percentile(direct, 0.99):>10.1f}"
    )
    print(
        f"{'gateway (HTTP + record)':<34}{statistics.median(gateway):>10.1f}{percentile(gateway, 0.99):>10.1f}"
    )
    print(
        f"{'gateway overhead':<34}{statistics.median(gateway) - statistics.median(direct):>10.1f}"
        f"{percentile(gateway, 0.99) - percentile(direct, 0.99):>10.1f}"
    )
    seq_tps = sequential_tokens / sequential
    con_tps = concurrent_tokens / concurrent
    print(f"\n{f'{concurrency} requests x {max_tokens} tokens':<34}{'wall s':>10}{'tok/s':>10}")
    print(f"{'sequential':<34}{sequential:>10.2f}{seq_tps:>10.1f}")
    print(f"{'concurrent (batched)':<34}{concurrent:>10.2f}{con_tps:>10.1f}")
    print(f"{'throughput ratio (goal >= 3x)':<34}{con_tps / seq_tps:>19.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base-model", default="smollm2-135m")
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    asyncio.run(main(args.base_model, args.calls, args.max_tokens, args.concurrency))
