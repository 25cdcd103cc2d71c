"""Replicas benchmark on smollm2-135m: 1 engine replica with 1 CPU thread vs 2 replicas with
1 thread each, behind one gateway, on the same burst of rollouts.

Prints, from one run, with the CPU and the dtype:
  1. for each burst size and topology: rollouts/s, sampled tokens/s and p50/p99 rollout
     latency of a burst of concurrent two-call rollouts (the same seeds in both), and the
     ratio (goal >= 1.8x). Replicas pay off once one engine is full: below its batch size
     (32 rows), one engine decodes a bigger batch at almost the cost of a smaller one, so the
     burst sizes run from one engine's batch (32) to both replicas' batches and beyond;
  2. the router's own cost per call: the time of its routing decision, and a call through the
     router vs the same call sent straight to the replica it picked (interleaved), p50
     (goal < 1 ms).

Both topologies run their replicas as engine workers (``LocalBackend(replicas=N,
threads_per_replica=1)``: a process per replica, pinned to its own core), so the only
difference is the number of replicas.

Usage: bash run.sh bench replicas [--base-model smollm2-135m] [--rollouts 32 64 128]
                                  [--max-tokens 32]
       bash run.sh bench replicas --smoke   (tiny-random, bursts of 2 and 4, 4-token answers,
                                             5 routing-cost calls: both topologies, every row)
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _machine import machine_line

import art_core as art
from art_core.cpu import cpu_model
from art_core.engines.base import GenerationRequest, SamplingParams
from art_core.engines.router import ReplicaRouter

QUESTIONS = [
    "What is the capital of France?",
    "Name a fruit that is yellow.",
    "How many legs does a spider have?",
    "What is 12 times 7?",
    "Which planet is the largest?",
    "What color is the sky on a clear day?",
    "Name an animal that lives in the sea.",
    "What is the boiling point of water in Celsius?",
]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def rollout(model: art.TrainableModel, i: int, max_tokens: int) -> tuple[float, int]:
    """Two calls of one conversation; returns (seconds, tokens sampled)."""
    started = time.perf_counter()
    async with art.capture(model) as run:
        client = run.openai_client()
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}
        ]
        first = await client.chat.completions.create(
            model=run.model_name, messages=messages, max_tokens=max_tokens, seed=i
        )
        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": "Explain briefly."},
        ]
        second = await client.chat.completions.create(
            model=run.model_name, messages=messages, max_tokens=max_tokens, seed=1000 + i
        )
    tokens = sum(r.usage.completion_tokens for r in (first, second) if r.usage)
    return time.perf_counter() - started, tokens


async def burst(model: art.TrainableModel, rollouts: int, max_tokens: int) -> dict[str, float]:
    started = time.perf_counter()
    results = await asyncio.gather(*(rollout(model, i, max_tokens) for i in range(rollouts)))
    wall = time.perf_counter() - started
    latencies = [seconds for seconds, _ in results]
    tokens = sum(t for _, t in results)
    return {
        "wall_s": wall,
        "rollouts_per_s": rollouts / wall,
        "tokens_per_s": tokens / wall,
        "p50_s": percentile(latencies, 0.5),
        "p99_s": percentile(latencies, 0.99),
    }


async def routing_cost(
    backend: art.LocalBackend, router: ReplicaRouter, calls: int
) -> dict[str, float]:
    """The router's decision time, and a call through the router vs straight to the replica
    it picked (same request, interleaved): what routing adds per call."""
    decisions = []
    for i in range(2000):
        request = GenerationRequest([1, 2, 3], SamplingParams(max_tokens=1), route_key=f"r{i}")
        started = time.perf_counter()
        router.route(request)
        decisions.append(time.perf_counter() - started)
    via, direct = [], []
    for i in range(calls):
        params = SamplingParams(max_tokens=4, temperature=0.0, seed=i)
        request = GenerationRequest([1, 2, 3, 4, 5, 6, 7, 8], params, route_key="cost")
        started = time.perf_counter()
        # Both on the gateway's loop, where the engines live (the hop costs both the same).
        [result] = await backend.server.call(router.generate(request))
        via.append(time.perf_counter() - started)
        replica = router.replicas[result.replica or 0]
        started = time.perf_counter()
        await backend.server.call(
            replica.generate(GenerationRequest([1, 2, 3, 4, 5, 6, 7, 8], params))
        )
        direct.append(time.perf_counter() - started)
    overhead = [a - b for a, b in zip(via, direct, strict=True)]
    return {
        "decision_p50_ms": statistics.median(decisions) * 1000,
        "via_router_p50_ms": statistics.median(via) * 1000,
        "direct_p50_ms": statistics.median(direct) * 1000,
        "overhead_p50_ms": statistics.median(overhead) * 1000,
    }


async def topology(
    path: Path,
    base_model: str,
    replicas: int,
    bursts: list[int],
    max_tokens: int,
    calls: int,
) -> tuple[dict[int, dict[str, float]], dict[str, float] | None]:
    """One backend with ``replicas`` engine workers; each burst size measured on it in turn."""
    async with art.LocalBackend(path=path, replicas=replicas, threads_per_replica=1) as backend:
        model = art.TrainableModel(
            name=f"bench-{replicas}", project="replicas", base_model=base_model
        )
        await model.register(backend)
        router = backend.engine(model)
        assert isinstance(router, ReplicaRouter)
        await burst(model, max(2, min(bursts) // 4), max_tokens)  # warm-up
        measured = {rollouts: await burst(model, rollouts, max_tokens) for rollouts in bursts}
        cost = await routing_cost(backend, router, calls) if replicas > 1 else None
        return measured, cost


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-model", default="smollm2-135m")
    parser.add_argument(
        "--rollouts", type=int, nargs="+", default=[32, 64, 128], help="burst sizes"
    )
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--calls", type=int, default=50, help="calls for the routing cost")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny-random, tiny bursts: every path in seconds"
    )
    args = parser.parse_args()
    print(machine_line(), flush=True)  # the figures below depend on it
    if args.smoke:
        args.base_model, args.rollouts, args.max_tokens, args.calls = "tiny-random", [2, 4], 4, 5
    from art_core.device import serving_dtype

    print(
        f"CPU: {cpu_model()}, serving dtype {serving_dtype('cpu')}; base model {args.base_model}; bursts of {args.rollouts} concurrent two-call rollouts, max_tokens {args.max_tokens}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        one, _ = await topology(
            Path(tmp) / "one", args.base_model, 1, args.rollouts, args.max_tokens, args.calls
        )
        two, cost = await topology(
            Path(tmp) / "two", args.base_model, 2, args.rollouts, args.max_tokens, args.calls
        )
    print()
    print(
        f"{'burst':>5}  {'topology':<24} {'rollouts/s':>10} {'tokens/s':>9} {'p50 s':>7} "
        f"{'p99 s':>7} {'wall s':>7}"
    )
    for rollouts in args.rollouts:
        for name, row in (("1 replica x 1 thread", one), ("2 replicas x 1 thread", two)):
            measured = row[rollouts]
            print(
                f"{rollouts:>5}  {name:<24} {measured['rollouts_per_s']:>10.2f} "
                f"{measured['tokens_per_s']:>9.1f} {measured['p50_s']:>7.2f} "
                f"{measured['p99_s']:>7.2f} {measured['wall_s']:>7.1f}"
            )
        print(
            f"{rollouts:>5}  {'ratio (2 / 1)':<24} "
            f"{two[rollouts]['rollouts_per_s'] / one[rollouts]['rollouts_per_s']:>9.2f}x "
            f"{two[rollouts]['tokens_per_s'] / one[rollouts]['tokens_per_s']:>8.2f}x"
            "   (goal >= 1.8x rollouts/s)"
        )
    if cost is not None:
        print()
        print(f"routing decision p50: {cost['decision_p50_ms'] * 1000:.1f} us")
        print(
            f"one 4-token call via the router p50 {cost['via_router_p50_ms']:.2f} ms, straight to "
            f"its replica {cost['direct_p50_ms']:.2f} ms: routing adds "
            f"{cost['overhead_p50_ms']:.3f} ms p50 (goal < 1 ms)"
        )


if __name__ == "__main__":
    asyncio.run(main())
