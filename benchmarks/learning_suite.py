"""Learning from cold on tasks nobody in the project wrote, within a fixed wall-clock budget.

Each run: one task source (``_learning_sources.py``: a verifiers environment, a reasoning-gym
generator with a calculator MCP server, two PyPI MCP servers), one model, one recipe, and a
budget of ``--minutes`` of wall time that counts *everything* after the model is loaded: the
cold evaluation, the warm start (the teacher's runs included), GRPO, validation, and the
final test. The figure reported is the held-out **test** split's mean reward (greedy, one run
per task) at step 0 and at the step the **validation** split chose, each with its bootstrap
interval, and the paired change (per task, after minus before) with its interval.

Recipes (``--recipe``):

- ``grpo``: GRPO from the cold model.
- ``self``: best-of-n rejection sampling of the model's own successes (``--warm-runs`` runs of
  each training task at temperature 1, the best run of each task that reached reward 1.0,
  until ``--warm-traces`` traces or ``--warm-budget`` runs), SFT on them
  (``model.train_sft``), then GRPO.
- ``teacher``: the same with a bigger local model's runs (``--teacher``, default the real
  Qwen2.5-Coder-0.5B-Instruct from its PyPI GGUF), re-rendered in the student's chat template
  by ``train_sft``; its loading and its runs count in the budget.

Each finished run appends one JSON line to ``benchmarks/results/learning_suite.jsonl`` (the
machine, the date, the settings, the figures); ``--table`` prints from it the table of
docs/training/cold-start.md.

    python benchmarks/learning_suite.py --source time --recipe teacher --minutes 15
    python benchmarks/learning_suite.py --table
    python benchmarks/learning_suite.py --source time --recipe self --smoke   (tiny-random)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

from _learning_sources import (
    CALCULATOR_SERVER,
    GIT_SERVER,
    MAX_TURNS,
    SOURCES,
    TEST_TASKS,
    TIME_SERVER,
    VAL_TASKS,
    Source,
    calculator_source,
    describe,
    git_source,
    time_source,
    verifiers_source,
)
from _machine import machine_line

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "learning_suite.jsonl"
RECIPES = ("grpo", "self", "teacher")
# Per call: the longest right call fits (git_log's arguments with a path; a short reasoning).
MAX_TOKENS = {"verifiers": 128, "calculator": 64, "time": 64, "git": 128}
TEACHER_QWEN = "qwen2.5-coder-0.5b"


@dataclass
class Figure:
    value: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.value:.3f} [{self.low:.3f}, {self.high:.3f}]"


@dataclass
class RunResult:
    source: str
    model: str
    recipe: str
    minutes: float
    seed: int
    machine: str
    date: str
    start: Figure | None = None
    end: Figure | None = None
    change: Figure | None = None
    best_step: int = 0
    steps: int = 0
    rollouts: int = 0
    warm: dict[str, Any] = field(default_factory=dict)
    val: list[tuple[int, float]] = field(default_factory=list)
    phases_s: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    settings: dict[str, Any] = field(default_factory=dict)


def reserve(val_time: float) -> float:
    """Seconds to keep for the final test: the validation's time scaled to the test's size,
    with a margin."""
    return 1.2 * val_time * TEST_TASKS / VAL_TASKS


def figure(values: list[float]) -> Figure:
    from art_core.evals.stats import estimate

    e = estimate(values)
    return Figure(e.value, e.low, e.high)


def rewards(groups: list[Any]) -> list[float]:
    """One reward per task (the mean of its runs; a task whose runs all failed scores 0)."""
    return [
        statistics.fmean(t.reward for t in g.trajectories) if g.trajectories else 0.0
        for g in groups
    ]


class Clock:
    """The run's wall-clock budget and where the time went."""

    def __init__(self, budget_s: float) -> None:
        self.started = time.perf_counter()
        self.budget_s = budget_s
        self.phases: dict[str, float] = {}

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def left(self) -> float:
        return self.budget_s - self.elapsed()

    def add(self, phase: str, seconds: float) -> None:
        self.phases[phase] = self.phases.get(phase, 0.0) + seconds


async def timed(clock: Clock, phase: str, work: Any) -> Any:
    started = time.perf_counter()
    try:
        return await work
    finally:
        clock.add(phase, time.perf_counter() - started)


async def warm_start(
    source: Source, model: Any, agent: Any, args: argparse.Namespace, clock: Clock
) -> dict[str, Any]:
    """Best-of-n: runs of ``agent`` (the model itself, or the teacher) on training tasks, the
    best run of each task that reached 1.0 kept, then SFT of ``model`` on them."""
    import art_core as art

    traces: list[Any] = []
    spent, position = 0, 0
    tasks = source.train
    started = time.perf_counter()
    # Stop looking after a share of the budget: GRPO needs the rest.
    while (
        len(traces) < args.warm_traces
        and spent < args.warm_budget
        and time.perf_counter() - started < args.warm_share * clock.budget_s
    ):
        count = min(args.warm_batch, (args.warm_budget - spent) // args.warm_runs)
        if count < 1:
            break
        chosen = [tasks[(position + i) % len(tasks)] for i in range(count)]
        position += count
        spent += count * args.warm_runs
        groups = await source.groups(agent, chosen, args.warm_runs, args.warm_temperature)
        # A run whose every answer max_tokens cut is no demonstration of a finished turn
        # (train_sft refuses it), even when what it wrote before the cut scored.
        finished = [
            art.TrajectoryGroup(
                [t for t in g.trajectories if any(c.finish_reason != "length" for c in t.calls)]
            )
            for g in groups
        ]
        traces += art.best_trajectories(finished, min_reward=1.0)
        print(f"  warm start: {len(traces)} traces from {spent} runs", flush=True)
    collected = time.perf_counter() - started
    clock.add("warm start runs", collected)
    report: dict[str, Any] = {"traces": len(traces), "runs": spent, "collect_s": collected}
    if not traces:
        return report
    sft = time.perf_counter()
    result = await model.train_sft(
        traces[: args.warm_traces],
        # Batches of several traces: the system prompt and tools they share run once a batch.
        config=art.SFTConfig(
            epochs=args.sft_epochs,
            learning_rate=args.sft_learning_rate,
            batch_size=args.sft_batch_size,
        ),
    )
    clock.add("warm start sft", time.perf_counter() - sft)
    report.update(sft_s=time.perf_counter() - sft, step=result.step)
    return report


async def run(args: argparse.Namespace, workdir: Path, stack: AsyncExitStack) -> RunResult:
    import art_core as art
    from art_core.capture import pin_step

    errlog = stack.enter_context((workdir / "servers.log").open("a"))
    args.max_tokens = args.max_tokens or MAX_TOKENS[args.source]
    source = await build_source(args, workdir, stack, errlog)
    if args.smoke:  # every path, on a few tasks of each split
        source.test, source.val = source.test[:8], source.val[:4]
    print(describe(source), flush=True)
    result = RunResult(
        source=args.source,
        model=args.model,
        recipe=args.recipe,
        minutes=args.minutes,
        seed=args.seed,
        machine=machine_line().removeprefix("machine: "),
        date=date.today().isoformat(),
        settings={
            k: getattr(args, k)
            for k in (
                "groups_per_step",
                "rollouts_per_group",
                "learning_rate",
                "lora_rank",
                "max_tokens",
                "max_turns",
                "warm_runs",
                "warm_temperature",
                "warm_traces",
                "warm_budget",
                "warm_share",
                "sft_epochs",
                "sft_batch_size",
                "sft_learning_rate",
                "teacher",
                "val_every",
            )
        },
    )
    # Every test task's run in one batch (the engine's default is 32 rows).
    backend = await stack.enter_async_context(
        art.LocalBackend(path=workdir / "art", max_batch_size=128)
    )
    model = art.TrainableModel(name="student", project="suite", base_model=cached(args.model))
    await model.register(backend)
    clock = Clock(args.minutes * 60)
    config = art.TrainConfig(
        learning_rate=args.learning_rate,
        lora_rank=args.lora_rank,
        lora_alpha=2 * args.lora_rank,
        seed=args.seed,
    )

    before = await timed(clock, "test", source.groups(model, source.test, 1, 0.0))
    start_rewards = rewards(before)
    result.start = figure(start_rewards)
    print(f"[{clock.elapsed():5.0f} s] test at step 0: {result.start}", flush=True)
    # Until a trained step is validated, a validation's time is guessed from the cold test's:
    # trained runs read tool results (longer prompts) and decode through the adapter, which
    # took up to 2.7x the cold model's time per task here.
    val_time = 2.7 * clock.phases["test"] * len(source.val) / len(source.test)

    if args.recipe in ("self", "teacher"):
        val_time = await warm_phase(args, source, backend, model, clock, result, val_time)

    # GRPO until the final validation and the test would overrun the budget (the test's time
    # estimated from the latest validation's: the model's runs change length as it learns).
    step_s = 0.0
    while clock.left() > reserve(val_time) + step_s and result.steps < args.max_steps:
        step_started = time.perf_counter()
        index = result.steps * args.groups_per_step
        chosen = [
            source.train[(index + i) % len(source.train)] for i in range(args.groups_per_step)
        ]
        groups = await timed(
            clock, "grpo rollouts", source.groups(model, chosen, args.rollouts_per_group, 1.0)
        )
        trained = await timed(clock, "grpo train", model.train(groups, config=config))
        result.steps += 1
        result.rollouts += sum(len(g.trajectories) for g in groups)
        train_reward = statistics.fmean(rewards(groups))
        print(
            f"[{clock.elapsed():5.0f} s] step {trained.step}: train reward {train_reward:.3f}"
            + (
                f"; why: {', '.join(d.code for d in trained.diagnoses)}"
                if trained.diagnoses
                else ""
            ),
            flush=True,
        )
        validated = result.val[-1][0] if result.val else None
        if (
            result.steps % args.val_every == 0
            and trained.step != validated  # a step that trained nothing left the adapter as is
            and clock.left() > reserve(val_time) + val_time
        ):
            val_started = time.perf_counter()
            val = rewards(
                await timed(clock, "validation", source.groups(model, source.val, 1, 0.0))
            )
            val_time = time.perf_counter() - val_started
            result.val.append((await model.get_step(), statistics.fmean(val)))
            print(f"[{clock.elapsed():5.0f} s] validation: {result.val[-1][1]:.3f}", flush=True)
        step_s = time.perf_counter() - step_started
    latest = await validate_latest(source, model, clock, result, val_time)
    # The best validated step (the latest of equals); nothing validated: the latest step.
    result.best_step = max(result.val, key=lambda sv: (sv[1], sv[0]))[0] if result.val else latest
    with pin_step(result.best_step):
        after = await timed(clock, "test", source.groups(model, source.test, 1, 0.0))
    end_rewards = rewards(after)
    result.end = figure(end_rewards)
    result.change = figure([a - b for a, b in zip(end_rewards, start_rewards, strict=True)])
    result.wall_s = clock.elapsed()
    result.phases_s = {k: round(v, 1) for k, v in clock.phases.items()}
    print(
        f"[{clock.elapsed():5.0f} s] test at step {result.best_step} "
        f"({'chosen by validation' if result.val else 'the latest: nothing was validated'}): "
        f"{result.end}; change {result.change}",
        flush=True,
    )
    return result


async def warm_phase(
    args: argparse.Namespace,
    source: Source,
    backend: Any,
    model: Any,
    clock: Clock,
    result: RunResult,
    val_time: float,
) -> float:
    """The recipe's warm start (on the model's own runs, or a teacher's), then a validation
    when GRPO steps can follow; returns the validation time estimate, updated if it ran."""
    import art_core as art

    agent = model
    if args.recipe == "teacher":
        teacher = art.TrainableModel(
            name="teacher", project="suite", base_model=cached(teacher_path(args.teacher))
        )
        await timed(clock, "teacher load", teacher.register(backend))
        agent = teacher
    result.warm = await warm_start(source, model, agent, args, clock)
    print(f"[{clock.elapsed():5.0f} s] warm start: {result.warm}", flush=True)
    # Validated only if GRPO steps follow (then it competes with them for "best").
    if "step" in result.warm and clock.left() > 2 * reserve(val_time):
        val_started = time.perf_counter()
        val = rewards(await timed(clock, "validation", source.groups(model, source.val, 1, 0.0)))
        val_time = time.perf_counter() - val_started
        result.val.append((result.warm["step"], statistics.fmean(val)))
        print(f"[{clock.elapsed():5.0f} s] validation after SFT: {result.val[-1][1]:.3f}")
    return val_time


async def validate_latest(
    source: Source, model: Any, clock: Clock, result: RunResult, val_time: float
) -> int:
    """Validate the latest step too when an earlier one was validated and time is left;
    returns the latest step."""
    latest: int = await model.get_step()
    if result.val and result.val[-1][0] != latest and clock.left() > reserve(val_time):
        val = rewards(await timed(clock, "validation", source.groups(model, source.val, 1, 0.0)))
        result.val.append((latest, statistics.fmean(val)))
    return latest


def cached(name: str) -> str:
    """An embedded model or a GGUF file as a Hugging Face folder, converted once into the
    repository's ``.art/base_models`` (a one-off per machine, like a download): loading it
    then takes a second, inside the budget."""
    from art_core.embedded import is_embedded_name, resolve_base_model

    if name.startswith("tiny-"):  # built in a moment, where the backend keeps its models
        return name
    if is_embedded_name(name) or name.endswith(".gguf"):
        return str(resolve_base_model(name, ROOT / ".art"))
    return name


def teacher_path(name: str) -> str:
    """The teacher's base model: the real Qwen2.5-Coder-0.5B-Instruct, or any model id."""
    if name != TEACHER_QWEN:
        return name
    from art_core.embedded import models_dir
    from art_core.embedded.qwen_gguf import fetch_qwen25_coder

    return str(fetch_qwen25_coder(models_dir()))


async def build_source(
    args: argparse.Namespace, workdir: Path, stack: AsyncExitStack, errlog: Any
) -> Source:
    if args.source == "verifiers":
        from art_verifiers.runtime import install_runtime

        install_runtime(extra=("reasoning-gym==0.1.25",))
        return verifiers_source(args.seed, args.max_tokens)
    import art_mcp

    command = {"calculator": CALCULATOR_SERVER, "time": TIME_SERVER, "git": GIT_SERVER}
    server = await stack.enter_async_context(
        art_mcp.spawn_http_server(command[args.source], errlog=errlog)
    )
    if args.source == "calculator":
        return calculator_source(args.seed, args.max_tokens, server, errlog, args.max_turns)
    if args.source == "time":
        return time_source(args.seed, args.max_tokens, server, errlog, args.max_turns)
    return git_source(args.seed, args.max_tokens, workdir / "repos", server, errlog, args.max_turns)


def table(path: Path = RESULTS) -> str:
    """The table of docs/training/cold-start.md: every recorded run, in the order run
    (failures and overruns too: a wall time over the budget is marked)."""
    lines = [
        "| source | model | recipe | test at step 0 | test after (step) | change | warm start "
        "| GRPO steps | wall / budget | machine, date |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for raw in path.read_text().splitlines() if path.exists() else []:
        r = json.loads(raw)
        warm = r.get("warm") or {}
        epochs = r["settings"].get("sft_epochs")
        warm_text = (
            f"{warm.get('traces', 0)} traces of {warm.get('runs', 0)} runs"
            + (f", SFT {epochs} epochs" if "step" in warm else "")
            if warm
            else "-"
        )
        change = r["change"]
        rose = change["low"] > 0
        bold = "**" if rose else ""
        wall = r["wall_s"] / 60
        over = " (over)" if wall > r["minutes"] else ""
        lines.append(
            f"| {r['source']} | {r['model']} | {r['recipe']} | {Figure(**r['start'])} | "
            f"{Figure(**r['end'])} ({r['best_step']}) | {bold}{change['value']:+.3f}{bold} "
            f"[{change['low']:+.3f}, {change['high']:+.3f}] | {warm_text} | {r['steps']} | "
            f"{wall:.1f} / {r['minutes']:g} min{over} | {r['machine']}, {r['date']} |"
        )
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="art-suite-") as tmp:
        workdir = Path(args.path) if args.path else Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        async with AsyncExitStack() as stack:
            result = await run(args, workdir, stack)
    line = json.dumps(asdict(result))
    if args.record:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        with RESULTS.open("a") as out:
            out.write(line + "\n")
    print(line)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--source", choices=SOURCES)
    parser.add_argument("--recipe", choices=RECIPES, default="teacher")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--teacher", default=TEACHER_QWEN, help="the teacher recipe's model")
    parser.add_argument("--minutes", type=float, default=15.0, help="the whole run's budget")
    parser.add_argument("--max-steps", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--groups-per-step", type=int, default=2)
    parser.add_argument("--rollouts-per-group", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=5e-4)
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument(
        "--max-tokens", type=int, default=None, help="per model call (default: the source's)"
    )
    parser.add_argument(
        "--max-turns",
        type=int,
        default=MAX_TURNS,
        help="model calls per run of an MCP source (verifiers' environment sets its own)",
    )
    parser.add_argument("--warm-runs", type=int, default=2, help="runs per task, warm start")
    parser.add_argument(
        "--warm-temperature", type=float, default=0.7, help="sampling the warm start's runs"
    )
    parser.add_argument("--warm-traces", type=int, default=24)
    parser.add_argument("--warm-budget", type=int, default=256, help="most warm-start runs")
    parser.add_argument(
        "--warm-share",
        type=float,
        default=0.3,
        help="most of the budget the warm start's runs take",
    )
    parser.add_argument("--warm-batch", type=int, default=16, help="tasks per warm-start round")
    parser.add_argument("--sft-epochs", type=int, default=3)
    parser.add_argument("--sft-batch-size", type=int, default=8)
    parser.add_argument("--sft-learning-rate", type=float, default=5e-4)
    parser.add_argument("--val-every", type=int, default=4, help="GRPO steps between validations")
    parser.add_argument("--path", default=None, help="keep the run's files here")
    parser.add_argument("--no-record", dest="record", action="store_false")
    parser.add_argument(
        "--table", action="store_true", help="print docs/training/cold-start.md's table and exit"
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny-random (the teacher too), 1 step, small groups: every path, not recorded",
    )
    args = parser.parse_args(argv)
    if args.table:
        print(table())
        sys.exit(0)
    if args.smoke:
        args.source = args.source or "time"
        args.model, args.teacher, args.max_steps, args.record = (
            "tiny-random",
            "tiny-random",
            1,
            False,
        )
        args.groups_per_step, args.rollouts_per_group, args.max_tokens = 2, 2, 24
        args.warm_runs, args.warm_traces, args.warm_budget, args.warm_batch = 2, 2, 8, 4
        args.sft_epochs, args.sft_batch_size, args.minutes = 1, 2, 30.0
    if args.source is None:
        parser.error("--source is required (or --table)")
    return args


if __name__ == "__main__":
    print(machine_line(), flush=True)
    asyncio.run(main(parse_args()))
