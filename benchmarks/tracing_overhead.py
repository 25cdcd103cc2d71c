"""Tracing overhead: wall time of a gather of 64 rollouts with tracing off vs on.

Each rollout is a small agent turn through the gateway (tiny-random, CPU): a forced tool
call, the tool's result, a short answer: 2 LLM calls, 4 spans. Modes:

- ``off``            tracing disabled (the baseline)
- ``otlp-down``      tracing to an OTLP endpoint on a closed loopback port (the acceptance
                     case: the backend is down)
- ``otlp-up``        tracing to a live OTLP/HTTP collector on loopback (for reference)

Rounds alternate the modes (off, down, up, off, down, up, ...) so load drift on a shared
machine hits each mode alike; the table shows the median per mode. Wall-time ratios on a
busy 2-core machine carry a few percent of noise, so the table also shows what tracing
costs directly: time spent in the tracing hooks on the event loop, and time the export
thread was busy (measured, both summed over the gather).

Run:  .venv/bin/python benchmarks/tracing_overhead.py [--rounds 3] [--rollouts 64]
      .venv/bin/python benchmarks/tracing_overhead.py --smoke   (1 round of 8 rollouts: each
                                                                mode once, the same table)
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import socket
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _machine import machine_line

os.environ.setdefault(
    "ART_CORE_MODELS_DIR", str(Path(tempfile.gettempdir()) / "art-core-test-models")
)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import art_core as art
from art_core import tracing
from art_core.testing.standins import OtlpCollector
from art_core.testing.tools import WEATHER_TOOL as TOOL
from art_core.tracing import hooks
from art_core.tracing.exporters import GuardedExporter

GROUP_SIZE = 8
HOOKS = ("run_started", "trajectory_built", "gathering", "group_finished", "run_failed")


class HookTimer:
    """Wraps the core's tracing hooks to sum the time they take on the caller's thread."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        for name in HOOKS:
            setattr(hooks, name, self._wrap(getattr(hooks, name)))

    def _wrap(self, hook: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(hook)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return hook(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started
                self.calls += 1

        return timed

    def reset(self) -> None:
        self.seconds, self.calls = 0.0, 0


class ExportTimer:
    """Sums the CPU time the OpenTelemetry export thread spends in exports (serializing
    spans, HTTP): retries' sleeps on a dead endpoint cost no CPU and are not counted."""

    def __init__(self) -> None:
        self.seconds = 0.0
        export = GuardedExporter.export

        def timed(exporter: GuardedExporter, spans: Any) -> Any:
            started = time.thread_time()
            try:
                return export(exporter, spans)
            finally:
                self.seconds += time.thread_time() - started

        GuardedExporter.export = timed  # type: ignore[method-assign]


async def rollout(model: art.TrainableModel, index: int) -> art.Trajectory:
    async with art.capture(model, metadata={"scenario": f"s{index % 8}"}) as run:
        client = run.openai_client()
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": f"Weather, please ({index})?"}
        ]
        first = await client.chat.completions.create(
            model=run.model_name,
            messages=messages,
            tools=[TOOL],  # type: ignore[arg-type, list-item]
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            max_tokens=48,
        )
        message = first.choices[0].message
        messages.append(message.model_dump(exclude_none=True, exclude={"token_ids"}))
        for call in message.tool_calls or []:
            city = json.loads(call.function.arguments)["city"]
            messages.append({"role": "tool", "tool_call_id": call.id, "content": f"12°C in {city}"})
        await client.chat.completions.create(
            model=run.model_name,
            messages=messages,
            tools=[TOOL],
            max_tokens=8,  # type: ignore[arg-type, list-item]
        )
    return run.trajectory(reward=float(index % 2))


async def gather(model: art.TrainableModel, rollouts: int) -> tuple[float, float]:
    """Wall time and process CPU time of one gather."""
    started, cpu = time.perf_counter(), time.process_time()
    groups = await art.gather_trajectory_groups(
        (
            art.TrajectoryGroup(rollout(model, g * GROUP_SIZE + i) for i in range(GROUP_SIZE))
            for g in range(rollouts // GROUP_SIZE)
        ),
        pbar_desc=None,
    )
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    done = sum(len(g.trajectories) for g in groups)
    if done != rollouts or any(g.exceptions for g in groups):
        raise RuntimeError(f"only {done}/{rollouts} rollouts finished")
    return elapsed, cpu


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def main(rounds: int, rollouts: int) -> None:
    timer, export_timer = HookTimer(), ExportTimer()
    results: dict[str, list[dict[str, float]]] = {"off": [], "otlp-down": [], "otlp-up": []}
    with tempfile.TemporaryDirectory() as folder, OtlpCollector() as collector:
        async with art.LocalBackend(path=folder) as backend:
            model = art.TrainableModel(name="bench", project="tracing", base_model="tiny-random")
            await model.register(backend)
            await gather(model, rollouts)  # warm-up at full concurrency: first batches, grammars
            modes = list(results)
            for round_ in range(rounds):
                # Rotate the order each round so no mode always runs first (or last).
                for mode in modes[round_ % 3 :] + modes[: round_ % 3]:
                    if mode == "otlp-down":
                        tracing.enable(
                            "otlp", endpoint=f"http://127.0.0.1:{closed_port()}/v1/traces"
                        )
                    elif mode == "otlp-up":
                        tracing.enable("otlp", endpoint=collector.endpoint)
                    timer.reset()
                    export_timer.seconds = 0.0
                    wall, cpu = await gather(model, rollouts)
                    tracing.flush(10)  # after the timed gather: count what the exporters did
                    stats = tracing.stats()
                    tracing.disable(timeout_s=5)
                    sink = stats.get("otlp", {})
                    results[mode].append(
                        {
                            "wall": wall,
                            "cpu": cpu,
                            "hooks_ms": timer.seconds * 1000,
                            # our worker (span trees, wall time) + the OTel export thread (CPU)
                            "export_ms": (stats.get("busy_s", 0.0) + export_timer.seconds) * 1000,
                            "exported": sink.get("exported", 0),
                            "failed": sink.get("failed", 0) + sink.get("dropped", 0),
                        }
                    )
                    print(
                        f"round {round_ + 1} {mode:10s} {wall:7.2f} s wall {cpu:7.2f} s CPU",
                        flush=True,
                    )
    base = statistics.median(r["wall"] for r in results["off"])
    base_cpu = statistics.median(r["cpu"] for r in results["off"])
    print(
        f"\ngather of {rollouts} rollouts (2 LLM calls + 1 tool call each, 4 spans), "
        f"tiny-random on CPU, median of {rounds} rounds"
    )
    print(
        "| mode | wall s (median) | vs off | CPU s (median) | vs off | hooks on the loop, ms "
        "| export threads, ms | spans exported | spans failed/dropped |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for mode, runs in results.items():
        wall = statistics.median(r["wall"] for r in runs)
        cpu = statistics.median(r["cpu"] for r in runs)
        hooks_ms = statistics.median(r["hooks_ms"] for r in runs)
        export_ms = statistics.median(r["export_ms"] for r in runs)
        print(
            f"| {mode} | {wall:.2f} | {wall / base:.3f} | {cpu:.2f} | {cpu / base_cpu:.3f} "
            f"| {hooks_ms:.1f} | {export_ms:.1f} "
            f"| {int(sum(r['exported'] for r in runs))} | {int(sum(r['failed'] for r in runs))} |"
        )
    down = results["otlp-down"]
    direct = statistics.median((r["hooks_ms"] + r["export_ms"]) / 1000 / r["wall"] for r in down)
    print(
        f"\nendpoint down: tracing work (hooks + export threads) = {direct:.2%} of the gather's "
        f"wall time; wall-time ratio {statistics.median(r['wall'] for r in down) / base:.3f}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rollouts", type=int, default=64)
    parser.add_argument("--smoke", action="store_true", help="1 round of 8 rollouts")
    args = parser.parse_args()
    print(machine_line(), flush=True)  # the figures below depend on it
    if args.smoke:
        args.rounds, args.rollouts = 1, GROUP_SIZE
    if args.rollouts % GROUP_SIZE:
        parser.error(f"--rollouts must be a multiple of {GROUP_SIZE}")
    asyncio.run(main(args.rounds, args.rollouts))
