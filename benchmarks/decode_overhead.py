"""Decoding through the gateway against the engine alone, and where a decode step goes.

For 1, 8 and 32 concurrent requests of ``--max-tokens`` tokens (tiny-random by default: its
forward pass costs about a millisecond, so per-step overhead shows as it does on a GPU), it
prints decode tokens/s of:

- ``engine``: the same requests handed to the engine directly (``engine.generate``);
- ``gateway``: chat completions over HTTP on loopback, from a client in its own process
  (``_decode_client.py``, raw keep-alive HTTP: an agent's process, not ours, parses);
- ``streamed``: the same with ``stream: true`` (server-sent events);

the ratio to the engine alone (goal: >= 0.9 at 1, 8 and 32 rows; each run is divided by the
engine's run of the same round, and the median of those ratios is shown with their range: this
machine's speed moves between rounds by more than the gap measured), and per decode step, in
milliseconds: the forward pass, sampling, logprobs, grammar masks, recording the sampled
tokens (with the streaming callbacks), rows joining a running batch and their prefill
(``TransformersEngine.step_times``), then the CPU time of the engine's thread and of the
gateway's event-loop thread (HTTP, validation, prompts, the stream loop, recording), of this
whole process (every thread: torch's intra-op workers too) and of the client's process, and
the cores all of it kept busy on average (their CPU over the wall time: on a machine of two
cores, a path near 2.0 has no core left for anything else, so every millisecond the gateway
and its client spend is a millisecond less for the engine). The median of ``--repeats``
runs, interleaved.

On a GPU (``bash run.sh gpu-check`` runs it on the 0.5B-shaped model) the split waits for
the device at each mark, so each part is charged its own kernels. ``--profile DIR`` also
writes a ``torch.profiler`` trace of one gateway run at the smallest and the largest level
(``DIR/trace-gateway-ROWS.json``, Chrome's trace format, and the top operators by self time
in ``DIR/ops-gateway-ROWS.txt``). ``--compile-decode`` serves from a compiled decode step
(``TransformersEngine(compile_decode=True)``; its compile is paid before the first round).

Usage: bash run.sh bench decode_overhead [--base-model tiny-random] [--max-tokens 64]
                                         [--repeats 7] [--rows 1,8,32] [--profile DIR]
                                         [--compile-decode]
       bash run.sh bench decode_overhead --smoke   (2 rows of 8 tokens, one run each)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _machine import machine_line

import art_core as art
from art_core.engines.base import GenerationRequest, SamplingParams
from art_core.engines.step_times import StepTimes

CLIENT = Path(__file__).with_name("_decode_client.py")
PATHS = ("engine", "gateway", "streamed")
PARTS = ("forward", "sampling", "logprobs", "grammar", "record", "join", "prefill")
GOAL = 0.9


@dataclass
class Run:
    """One measured run: tokens/s and the per-step split."""

    tokens_per_s: float
    steps: int
    parts_ms: dict[str, float]  # per step
    engine_cpu_ms: float  # per step
    loop_cpu_ms: float  # per step
    # Per step: this process's CPU (every thread: the engine's, torch's intra-op workers, the
    # loop's) and the client process's (0 for the engine alone: no client).
    process_cpu_ms: float = 0.0
    client_cpu_ms: float = 0.0
    step_ms: float = 0.0  # wall time per step

    def cores_busy(self) -> float:
        """The cores this process and the client kept busy on average while it ran.

        Example:
            >>> Run(1.0, 1, {}, 0.0, 0.0, 1.5, 0.3, 1.0).cores_busy()
            1.8
        """
        return (self.process_cpu_ms + self.client_cpu_ms) / self.step_ms if self.step_ms else 0.0


@dataclass
class Cell:
    runs: list[Run] = field(default_factory=list)

    def median(self) -> Run:
        ordered = sorted(self.runs, key=lambda r: r.tokens_per_s)
        return ordered[len(ordered) // 2]


def paired_ratios(cell: Cell, engine: Cell) -> list[float]:
    """Each run's tokens/s over the engine alone's in the same round (runs are interleaved:
    a round is one run of each path), so a change of the machine's speed between rounds
    cancels.

    Example:
        >>> def runs(*speeds):
        ...     return Cell([Run(s, 1, {}, 0.0, 0.0) for s in speeds])
        >>> paired_ratios(runs(90.0, 45.0), runs(100.0, 50.0))
        [0.9, 0.9]
    """
    return [
        run.tokens_per_s / base.tokens_per_s
        for run, base in zip(cell.runs, engine.runs, strict=True)
    ]


def thread_cpu(*name_prefixes: str) -> Callable[[], float]:
    """The CPU seconds of the running thread whose name starts with one of
    ``name_prefixes``."""
    thread = next(t for t in threading.enumerate() if t.name.startswith(name_prefixes))
    assert thread.ident is not None
    clock = time.pthread_getcpuclockid(thread.ident)
    return lambda: time.clock_gettime(clock)


class Client:
    """A ``_decode_client.py`` process holding ``rows`` warm connections."""

    def __init__(self, port: int, model: str, rows: int, max_tokens: int, stream: bool) -> None:
        args = [str(port), model, str(rows), str(max_tokens), "stream" if stream else "json"]
        self.process = subprocess.Popen(
            [sys.executable, str(CLIENT), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None and self.process.stdin is not None
        self.stdin, self.stdout = self.process.stdin, self.process.stdout
        if self.stdout.readline().strip() != "ready":
            raise RuntimeError("the load client did not start")

    def run(self) -> tuple[float, int, float]:
        """One round of requests: its seconds, tokens and the client's CPU seconds."""
        self.stdin.write("go\n")
        self.stdin.flush()
        result = json.loads(self.stdout.readline())
        return result["seconds"], result["tokens"], result["cpu"]

    def close(self) -> None:
        self.stdin.close()
        self.process.wait(timeout=30)


async def measure(
    times: StepTimes,
    engine_cpu: Callable[[], float],
    loop_cpu: Callable[[], float],
    run: Callable[[], Awaitable[tuple[float, int, float]]],
) -> Run:
    times.clear()
    engine0, loop0, process0 = engine_cpu(), loop_cpu(), time.process_time()
    seconds, tokens, client_cpu = await run()
    process_cpu = time.process_time() - process0
    steps = max(1, times.counts["forward"])
    parts = {part: 1000 * times.seconds[part] / steps for part in PARTS}
    # The loop times sampling with its grammar masks and logprobs; shown apart.
    parts["sampling"] = 1000 * times.seconds["sample"] / steps - parts["logprobs"]
    parts["sampling"] -= parts["grammar"]
    return Run(
        tokens / seconds,
        steps,
        parts,
        1000 * (engine_cpu() - engine0) / steps,
        1000 * (loop_cpu() - loop0) / steps,
        1000 * process_cpu / steps,
        1000 * client_cpu / steps,
        1000 * seconds / steps,
    )


async def main(args: argparse.Namespace) -> None:
    print(machine_line())
    levels = [int(x) for x in args.rows.split(",")]
    with tempfile.TemporaryDirectory() as folder:
        async with art.LocalBackend(path=folder, compile_decode=args.compile_decode) as backend:
            model = art.TrainableModel(name="bench", project="decode", base_model=args.base_model)
            await model.register(backend)
            served = backend.gateway.models[model.name]
            engine: Any = served.engine
            times = engine.step_times = StepTimes()
            messages = [
                {"role": "user", "content": "Write a long story about a lighthouse keeper."}
            ]
            prompt = served.prompts.build(messages, None, [], None)
            port = backend.server.port
            engine_cpu, loop_cpu = thread_cpu("art-torch", "art-engine"), thread_cpu("art-gateway")

            async def on_engine_loop(rows: int) -> tuple[float, int, float]:
                requests = [
                    GenerationRequest(
                        list(prompt),
                        SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=i),
                    )
                    for i in range(rows)
                ]
                started = time.perf_counter()
                results = await asyncio.gather(*(engine.generate(r) for r in requests))
                seconds = time.perf_counter() - started
                return seconds, sum(len(r[0].token_ids) for r in results), 0.0

            async def engine_alone(rows: int) -> tuple[float, int, float]:
                # On the loop the engine's scheduler runs on (the gateway's), as the
                # gateway's own calls are: an engine is called from its own loop.
                return await backend.server.call(on_engine_loop(rows))

            cells: dict[tuple[int, str], Cell] = {}
            for rows in levels:
                clients = {
                    path: Client(port, model.name, rows, args.max_tokens, path == "streamed")
                    for path in PATHS[1:]
                }
                await engine_alone(rows)  # warm: this batch shape
                try:
                    for _ in range(args.repeats):
                        for path in PATHS:
                            if path == "engine":
                                run = await measure(
                                    times, engine_cpu, loop_cpu, lambda r=rows: engine_alone(r)
                                )
                            else:
                                client = clients[path]
                                run = await measure(
                                    times,
                                    engine_cpu,
                                    loop_cpu,
                                    lambda c=client: asyncio.to_thread(c.run),
                                )
                            cells.setdefault((rows, path), Cell()).runs.append(run)
                finally:
                    for client in clients.values():
                        client.close()
            print_table(cells, levels, args)
            if args.profile:
                for rows in sorted({levels[0], levels[-1]}):
                    client = Client(port, model.name, rows, args.max_tokens, stream=False)
                    try:
                        await profiled(engine, client, Path(args.profile), rows)
                    finally:
                        client.close()


async def profiled(engine: Any, client: Client, folder: Path, rows: int) -> None:
    """One gateway run under ``torch.profiler``, started on the engine's model thread (the
    profiler sees the torch calls of the thread it starts on; the gateway's loop makes none,
    its time shows as the gaps between steps), its trace and top operators into ``folder``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    await asyncio.to_thread(folder.mkdir, parents=True, exist_ok=True)
    trace = profile(activities=activities)
    await engine.run_in_model_thread(trace.start)
    try:
        seconds, tokens, _cpu = await asyncio.to_thread(client.run)
    finally:
        await engine.run_in_model_thread(trace.stop)
    await asyncio.to_thread(trace.export_chrome_trace, str(folder / f"trace-gateway-{rows}.json"))
    table = trace.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
    header = f"{rows} rows through the gateway: {tokens} tokens in {seconds:.3f} s\n"
    await asyncio.to_thread((folder / f"ops-gateway-{rows}.txt").write_text, header + table)
    print(f"profile of {rows} rows: {folder / f'trace-gateway-{rows}.json'}")


def print_table(cells: dict[tuple[int, str], Cell], levels: list[int], args: Any) -> None:
    step = "compiled decode step" if args.compile_decode else "eager decode step"
    print(
        f"\n{args.base_model} ({step}), {args.max_tokens} tokens a request, median of "
        f"{args.repeats} interleaved rounds; vs engine: the median of each round's ratio "
        "[lowest, highest]; per decode step in ms"
    )
    head = ["rows", "path", "tok/s", "vs engine", *PARTS, "engine CPU", "loop CPU"]
    head += ["process CPU", "client CPU", "cores busy"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    worst = {"gateway": float("inf"), "streamed": float("inf")}
    for rows in levels:
        engine = cells[(rows, "engine")]
        for path in PATHS:
            run = cells[(rows, path)].median()
            ratios = paired_ratios(cells[(rows, path)], engine)
            ratio = statistics.median(ratios)
            if path in worst:
                worst[path] = min(worst[path], ratio)
            parts = [f"{run.parts_ms[p]:.2f}" for p in PARTS]
            print(
                f"| {rows} | {path} | {run.tokens_per_s:,.0f} | {ratio:.2f}x "
                f"[{min(ratios):.2f}, {max(ratios):.2f}] | "
                + " | ".join(parts)
                + f" | {run.engine_cpu_ms:.2f} | {run.loop_cpu_ms:.2f}"
                + f" | {run.process_cpu_ms:.2f} | {run.client_cpu_ms:.2f}"
                + f" | {run.cores_busy():.2f} |"
            )
    print()
    for path, ratio in worst.items():
        verdict = "meets" if ratio >= GOAL else "misses"
        print(f"{path} at worst {ratio:.2f}x the engine alone: {verdict} {GOAL}x")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-model", default="tiny-random")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--rows", default="1,8,32", help="concurrent requests, comma-separated")
    parser.add_argument("--profile", help="a folder for torch.profiler traces of the gateway")
    parser.add_argument(
        "--compile-decode", action="store_true", help="serve from a compiled decode step"
    )
    parser.add_argument("--smoke", action="store_true", help="2 rows of 8 tokens, one run")
    args = parser.parse_args()
    if args.smoke:
        args.max_tokens, args.repeats, args.rows = 8, 1, "2"
    return args


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
