"""``art-core mcp demo``: train SmolLM2-135M on CPU to use a shop's MCP tools, in minutes.

The server (``examples/mcp/shop_server.py``) sells fruit at made-up prices: to answer "How much
does a pear cost?" the model must call ``get_price`` (not ``get_stock``) with the right item,
then report the number through ``complete_task``. Every task has a known answer, so rewards
are computed by a program (``art_mcp.answer_reward``: 1 for the right number, else 0.3 for
looking it up plus 0.2 for giving any final answer); with ``--judge-model`` RULER scores the
runs instead. It validates on held-out tasks before and after training and prints the comparison.

With ``--warm-start N`` it trains two fresh models for the same wall time: one first learns
(SFT) from N successful runs (a teacher's with ``--teacher-model``, else the best run of each
of its own groups) and then runs ``--steps`` steps; the other runs GRPO alone for as long as
the first took. The closing note compares their validation rewards.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import shlex
import sys
import time
from contextlib import AsyncExitStack
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

SERVER_SCRIPT = Path("examples/mcp/shop_server.py")
SCENARIO_FILE = Path("examples/mcp/shop_scenarios.jsonl")
MAX_ANSWER_CHARS = 40  # a short sentence: the forced call always closes within max_tokens
SYSTEM_PROMPT = (
    "You are a shop assistant. Look up the answer with a tool, then call complete_task "
    "with the number you found."
)


def find_example(relative: Path) -> Path:
    """``relative`` under the current folder, else under the repository this package is in."""
    for root in (Path.cwd(), Path(__file__).resolve().parents[3]):
        candidate = root / relative
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"cannot find {relative}: run the demo from the art-core repository root "
        "(e.g. `bash run.sh demo`) or pass --server / --scenarios"
    )


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "demo",
        help="train smollm2-135m on CPU to use a shop's MCP tools (the main demo)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--base-model", default="smollm2-135m")
    parser.add_argument("--path", default=".art")
    parser.add_argument(
        "--name", default=None, help="model name (default: a new one per run; reuse to resume)"
    )
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--groups-per-step", type=int, default=4)
    parser.add_argument("--rollouts-per-group", type=int, default=4)
    parser.add_argument("--val-rollouts", type=int, default=2, help="runs per validation task")
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64, help="per model call")
    parser.add_argument("--max-turns", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--server", default=None, help="another MCP server (command or URL)")
    parser.add_argument("--scenarios", default=None, help="JSONL scenarios (with answers)")
    parser.add_argument("--judge-model", default=None, help="score with RULER instead")
    parser.add_argument("--judge-base-url", default=None)
    parser.add_argument("--judge-api-key", default=None)
    from art_mcp.cli import warm_start_args

    warm_start_args(parser)
    parser.set_defaults(func=lambda args: asyncio.run(run_demo(args)))


def viewer_hint(path: str, project: str, name: str | None) -> str:
    """The closing line that says how to look at what the demo just trained (one model's run
    page, or with ``name`` None the list of runs).

    Example:
        >>> print(viewer_hint(".art", "mcp-demo", "shop-1"))
        See every rollout and the tokens it was trained on: art-core ui .art, then open http://127.0.0.1:7998/run/mcp-demo/shop-1
    """
    page = f"run/{quote(project, safe='')}/{quote(name, safe='')}" if name else ""
    return (
        f"See every rollout and the tokens it was trained on: art-core ui {shlex.quote(path)}, "
        f"then open http://127.0.0.1:7998/{page}"
    )


async def run_demo(args: argparse.Namespace) -> int:
    """Run the demo; returns 0 when the trained model's mean validation reward is higher.

    Example:
        >>> # art-core mcp demo --steps 8
    """
    from art_mcp.cli import open_log
    from art_mcp.local import spawn_http_server
    from art_mcp.rollout import RolloutSettings
    from art_mcp.scenarios import load_scenarios

    started = time.perf_counter()
    scenarios = load_scenarios(args.scenarios or find_example(SCENARIO_FILE))
    # Held-out validation tasks are marked in the file (metadata.split == "val").
    val = [s for s in scenarios if s.metadata.get("split") == "val"]
    train_set = [s for s in scenarios if s.metadata.get("split") != "val"]
    if not val:
        val, train_set = train_set[::5], [s for i, s in enumerate(train_set) if i % 5]
    args.name = args.name or datetime.now().strftime("shop-%Y%m%d-%H%M%S")
    args.project = "mcp-demo"
    args.reward = None
    args.temperature = 1.0
    args.tool_choice = "required"
    args.tool_timeout = 10.0
    args.system_prompt = SYSTEM_PROMPT
    # One forced tool call per turn, and a bounded final answer: a 135M model always produces
    # a well-formed call, and what it learns is *which* tool, *which* argument, *what* answer.
    args.extra_settings = {"parallel_tool_calls": False, "max_answer_chars": MAX_ANSWER_CHARS}
    args.val_settings = RolloutSettings(
        max_turns=args.max_turns,
        max_tokens=args.max_tokens,
        temperature=1.0,
        tool_choice="required",
        system_prompt=SYSTEM_PROMPT,
        parallel_tool_calls=False,
        max_answer_chars=MAX_ANSWER_CHARS,
    )
    print(
        f"art-mcp demo: {len(train_set)} training / {len(val)} validation tasks, "
        f"{args.steps} steps x {args.groups_per_step} groups x {args.rollouts_per_group} rollouts",
        flush=True,
    )
    async with AsyncExitStack() as stack:
        errlog = stack.enter_context(open_log(Path(args.path) / args.project / "shop-server.log"))
        if args.server:
            from art_mcp.servers import parse_server

            server: Any = parse_server(args.server)
        else:
            # One server process for the whole run (a session per rollout over HTTP): spawning a
            # stdio server per rollout would cost a Python start-up each time on 2 cores.
            script = find_example(SERVER_SCRIPT)
            server = await stack.enter_async_context(
                spawn_http_server(f"python {script} --http", errlog=errlog)
            )
        if args.warm_start is not None:
            return await _compare_warm_start(args, server, train_set, val, errlog, started)
        from art_mcp.cli import train_from_args

        report = await train_from_args(args, server, train_set, val, errlog=errlog)
    wall = time.perf_counter() - started
    before, after = report.before.mean_reward, report.after.mean_reward
    if report.after.step == report.before.step:
        # Every step's groups had equal rewards: no checkpoint, the same model evaluated twice.
        print(
            f"\nNo step trained anything (every group's rewards were equal; see docs/training/"
            f"sparse-rewards.md): validation reward {before:.3f} -> {after:.3f} is "
            f"sampling noise (step {report.before.step}), total wall time {wall / 60:.1f} min.",
            file=sys.stdout,
        )
        print(viewer_hint(args.path, args.project, args.name))
        return 1
    verdict = "higher" if after > before else "NOT higher"
    print(
        f"\nThe trained model's mean validation reward is {verdict}: {before:.3f} -> {after:.3f} "
        f"(step {report.before.step} -> {report.after.step}), total wall time {wall / 60:.1f} min.",
        file=sys.stdout,
    )
    print(viewer_hint(args.path, args.project, args.name))
    return 0 if after > before else 1


# GRPO steps the arm without a warm start may take: its time budget stops it first.
UNBOUNDED_STEPS = 10_000


async def _compare_warm_start(
    args: argparse.Namespace,
    server: Any,
    train_set: list[Any],
    val: list[Any],
    errlog: Any,
    started: float,
) -> int:
    """Train ``{name}-warm`` (warm start, then ``--steps``), then ``{name}-plain`` (GRPO only)
    for the same training time; print both. 0 when the warm-started model improved."""
    from art_mcp.cli import train_from_args

    if args.judge_model:
        raise ValueError("--warm-start picks runs by the answer reward: drop --judge-model")
    name = args.name
    warm_args = copy.copy(args)
    warm_args.name = f"{name}-warm"
    print(f"\n== {warm_args.name}: warm start on {args.warm_start} traces, then GRPO", flush=True)
    warm = await train_from_args(warm_args, server, train_set, val, errlog=errlog)
    plain_args = copy.copy(args)
    plain_args.name = f"{name}-plain"
    plain_args.warm_start = None
    plain_args.steps = UNBOUNDED_STEPS
    plain_args.minutes = warm.training_s / 60
    print(
        f"\n== {plain_args.name}: GRPO alone for the same {plain_args.minutes:.1f} min", flush=True
    )
    plain = await train_from_args(plain_args, server, train_set, val, errlog=errlog)
    wall = time.perf_counter() - started
    print(f"\n{closing_note(args, warm, plain)}\ntotal wall time {wall / 60:.1f} min.")
    print(viewer_hint(args.path, args.project, None))
    return 0 if warm.after.mean_reward > warm.before.mean_reward else 1


def closing_note(args: argparse.Namespace, warm: Any, plain: Any) -> str:
    """Validation reward after the same training time, with and without the warm start.

    Example:
        >>> print(closing_note(args, warm_report, plain_report))  # fragment: the demo's `args` and two training reports  # doctest: +SKIP
        Same training time (3.2 / 3.3 min, validation excluded), smollm2-135m: ...
    """
    source = warm.warm_start.line() if warm.warm_start else "warm start: not run"
    return "\n".join(
        [
            f"Same training time ({warm.training_s / 60:.1f} / {plain.training_s / 60:.1f} min, "
            f"validation excluded), {args.base_model}, mean validation reward:",
            f"  with --warm-start {args.warm_start}: {warm.before.mean_reward:.3f} -> "
            f"{warm.after.mean_reward:.3f} (step {warm.after.step}, {len(warm.steps)} GRPO steps)",
            f"  without:{' ' * (len(str(args.warm_start)) + 8)} {plain.before.mean_reward:.3f} -> "
            f"{plain.after.mean_reward:.3f} (step {plain.after.step}, {len(plain.steps)} GRPO "
            "steps)",
            f"  {source}",
        ]
    )
