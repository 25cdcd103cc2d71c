"""``art-core mcp ...``: the command line of art-mcp (loaded by art-core's entry-point group).

art-core mcp tools --server "mcp-server-time"
art-core mcp scenarios --server "mcp-server-time" -n 24 --generator-model gpt-4.1 -o s.jsonl
art-core mcp train --server "mcp-server-time" --scenarios s.jsonl --judge-model gpt-4.1
art-core mcp demo
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import json
import sys
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from art_mcp.train import MCPTrainSettings, TrainReport


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add ``mcp`` and its subcommands to art-core's command line.

    Example:
        >>> parser = argparse.ArgumentParser(); add_parser(parser.add_subparsers())
    """
    mcp = subparsers.add_parser(
        "mcp",
        help="train a model to use an MCP server's tools",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = mcp.add_subparsers(dest="mcp_command", required=True)

    tools = commands.add_parser(
        "tools", help="list a server's tools (as OpenAI tools) and resources"
    )
    _server_args(tools)
    tools.set_defaults(func=_run(_tools))

    scenarios = commands.add_parser("scenarios", help="generate tasks for a server with an LLM")
    _server_args(scenarios)
    scenarios.add_argument("-n", "--num-scenarios", type=int, default=24)
    _generator_args(scenarios)
    scenarios.add_argument("-o", "--output", required=True, help="JSONL file to write")
    scenarios.set_defaults(func=_run(_scenarios))

    train = commands.add_parser("train", help="train a model on a server's tasks (GRPO)")
    _server_args(train)
    source = train.add_mutually_exclusive_group(required=True)
    source.add_argument("--scenarios", help="JSONL file of scenarios (see `mcp scenarios`)")
    source.add_argument("--generate", type=int, metavar="N", help="generate N scenarios first")
    train.add_argument("--val-scenarios", help="JSONL file of validation scenarios")
    _generator_args(train)
    _training_args(train)
    train.set_defaults(func=_run(_train))

    from art_mcp import demo

    demo.add_parser(commands)


# ----------------------------------------------------------------------------- arguments
def _server_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server",
        required=True,
        help='the MCP server: a command line (stdio), e.g. "mcp-server-time", or a URL '
        "(streamable HTTP), e.g. http://127.0.0.1:8000/mcp",
    )
    parser.add_argument(
        "--serve-http",
        action="store_true",
        help="start the --server command once as an HTTP server (it must call "
        "art_mcp.serve_http) instead of one stdio process per rollout",
    )
    parser.add_argument("--server-log", help="file for the server's stderr (default: inherit)")


def _generator_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--generator-model", default="gpt-4.1")
    parser.add_argument("--generator-base-url", default=None)
    parser.add_argument("--generator-api-key", default=None)
    parser.add_argument("--instructions", default=None, help="extra guidance for the generator")


def _training_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model and training")
    group.add_argument("--base-model", default="smollm2-135m")
    group.add_argument("--name", default="mcp-agent", help="the trained model's name")
    group.add_argument("--project", default="mcp")
    group.add_argument("--path", default=".art", help="where models are stored")
    group.add_argument("--steps", type=int, default=10, help="train until this step (resumes)")
    group.add_argument("--groups-per-step", type=int, default=4)
    group.add_argument("--rollouts-per-group", type=int, default=8)
    group.add_argument("--val-rollouts", type=int, default=2, help="runs per validation task")
    group.add_argument("--learning-rate", type=float, default=1e-4)
    group.add_argument("--lora-rank", type=int, default=8)
    group.add_argument("--seed", type=int, default=0)
    group.add_argument(
        "--minutes",
        type=float,
        default=None,
        help="stop starting steps after this many minutes of training (warm start included; "
        "validation excluded)",
    )
    warm_start_args(parser)
    sparse = parser.add_argument_group("sparse rewards (see docs/training/sparse-rewards.md)")
    sparse.add_argument(
        "--dynamic-sampling",
        action="store_true",
        help="discard groups whose rewards are all equal and sample more, until "
        "--groups-per-step have a signal",
    )
    sparse.add_argument(
        "--max-rollouts-per-step",
        type=int,
        default=None,
        help="the most rollouts a step may spend (default: 4x a plain step with "
        "--dynamic-sampling or --max-group-size, else a plain step)",
    )
    sparse.add_argument(
        "--max-group-size",
        type=int,
        default=None,
        help="grow an all-equal group by --rollouts-per-group runs at a time up to this size",
    )
    sparse.add_argument(
        "--curriculum",
        action="store_true",
        help="prefer scenarios solved about half the time (from their recent runs)",
    )
    sparse.add_argument(
        "--success-threshold",
        type=float,
        default=1.0,
        help="a run solved its scenario when its reward >= this (curriculum, never-solved share)",
    )
    agent = parser.add_argument_group("agent loop")
    agent.add_argument("--max-turns", type=int, default=6)
    agent.add_argument("--max-tokens", type=int, default=256, help="per model call")
    agent.add_argument("--temperature", type=float, default=1.0)
    agent.add_argument("--tool-choice", choices=["auto", "required"], default="auto")
    agent.add_argument("--tool-timeout", type=float, default=30.0, help="seconds per tool call")
    agent.add_argument("--system-prompt", default=None)
    agent.add_argument(
        "--one-call-per-turn", action="store_true", help="ask for one tool call per model turn"
    )
    agent.add_argument(
        "--max-answer-chars", type=int, default=None, help="bound complete_task's answer"
    )
    reward = parser.add_argument_group("reward")
    reward.add_argument(
        "--reward",
        default=None,
        help="'answer' (check scenarios' expected answers) or MODULE:FUNCTION taking "
        "(scenario, trajectory); default: RULER with --judge-model, else 'answer'",
    )
    reward.add_argument("--judge-model", default=None, help="RULER judge (OpenAI-compatible)")
    reward.add_argument("--judge-base-url", default=None)
    reward.add_argument("--judge-api-key", default=None)


def warm_start_args(parser: argparse.ArgumentParser) -> None:
    """``--warm-start N`` and its options (SFT on successful runs before GRPO)."""
    warm = parser.add_argument_group(
        "warm start (SFT on successful runs first, see docs/training/warm-start.md)"
    )
    warm.add_argument(
        "--warm-start",
        type=int,
        metavar="N",
        default=None,
        help="before GRPO, SFT a fresh model on N runs that reached the full reward: a "
        "teacher's (--teacher-model), else the best run of each of the model's own groups",
    )
    warm.add_argument("--teacher-model", default=None, help="OpenAI-compatible teacher model")
    warm.add_argument("--teacher-base-url", default=None, help="default: OpenAI's API")
    warm.add_argument("--teacher-api-key", default=None, help="default: $OPENAI_API_KEY")
    warm.add_argument(
        "--warm-start-max-rollouts",
        type=int,
        default=None,
        help="the most runs spent looking for the N traces (default 8 x N)",
    )
    warm.add_argument(
        "--warm-start-min-reward",
        type=float,
        default=1.0,
        help="a run is a trace to learn from when its reward is at least this",
    )
    warm.add_argument("--sft-epochs", type=int, default=3)
    warm.add_argument("--sft-learning-rate", type=float, default=5e-4)
    warm.add_argument("--sft-batch-size", type=int, default=4)


def warm_start_from_args(args: argparse.Namespace) -> Any:
    """The ``art_mcp.WarmStart`` the arguments ask for, or None."""
    import os

    import art_core as art
    from art_mcp.warm_start import WarmStart

    traces = getattr(args, "warm_start", None)
    if traces is None:
        return None
    teacher = None
    if getattr(args, "teacher_model", None):
        teacher = art.Model(
            name="teacher",
            inference_base_url=args.teacher_base_url or "https://api.openai.com/v1",
            inference_model_name=args.teacher_model,
            inference_api_key=args.teacher_api_key or os.environ.get("OPENAI_API_KEY"),
        )
    return WarmStart(
        traces=traces,
        teacher=teacher,
        rollouts_per_scenario=max(args.rollouts_per_group, 1),
        max_rollouts=getattr(args, "warm_start_max_rollouts", None),
        min_reward=getattr(args, "warm_start_min_reward", 1.0),
        config=art.SFTConfig(
            learning_rate=args.sft_learning_rate,
            epochs=args.sft_epochs,
            batch_size=args.sft_batch_size,
            seed=args.seed,
        ),
        seed=args.seed,
    )


def _run(command: Callable[[argparse.Namespace], Any]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return int(asyncio.run(command(args)) or 0)
        except (ValueError, FileNotFoundError, RuntimeError) as exc:
            print(f"art-core mcp: error: {exc}", file=sys.stderr)
            return 1

    return run


# ----------------------------------------------------------------------------- helpers
async def open_server(args: argparse.Namespace, stack: AsyncExitStack) -> Any:
    """The server spec the command should use (spawning an HTTP server if asked)."""
    from art_mcp.local import spawn_http_server
    from art_mcp.servers import parse_server

    errlog = _errlog(args, stack)
    if getattr(args, "serve_http", False):
        return await stack.enter_async_context(spawn_http_server(args.server, errlog=errlog))
    return parse_server(args.server)


def open_log(path: str | Path) -> TextIO:
    """A log file (appended to) for an MCP server's stderr; its folder is created."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return open(path, "a", encoding="utf-8")  # the caller's exit stack closes it


def _errlog(args: argparse.Namespace, stack: AsyncExitStack) -> Any:
    path = getattr(args, "server_log", None)
    return stack.enter_context(open_log(path)) if path else None


def load_reward(spec: str | None) -> Any:
    """``'answer'`` -> ``answer_reward``; ``'pkg.module:function'`` -> that function."""
    from art_mcp.rewards import answer_reward

    if spec is None or spec == "answer":
        return answer_reward
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"--reward must be 'answer' or MODULE:FUNCTION, got {spec!r}")
    sys.path.insert(0, str(Path.cwd()))
    function = getattr(importlib.import_module(module_name), attribute, None)
    if not callable(function):
        raise ValueError(f"--reward {spec!r}: {attribute!r} is not a function of {module_name}")
    return function


# ----------------------------------------------------------------------------- commands
async def _tools(args: argparse.Namespace) -> int:
    from art_mcp.session import connect
    from art_mcp.tools import ToolSet

    async with AsyncExitStack() as stack:
        server = await open_server(args, stack)
        async with connect(server, errlog=_errlog(args, stack)) as session:
            resources = await session.list_resources()
            print(json.dumps(ToolSet.from_mcp(session.tools).definitions, indent=2))
            for resource in resources:
                print(f"resource {resource.uri}: {resource.description or resource.name}")
    return 0


async def _scenarios(args: argparse.Namespace) -> int:
    from art_mcp.generate import generate_scenarios
    from art_mcp.scenarios import save_scenarios

    async with AsyncExitStack() as stack:
        server = await open_server(args, stack)
        scenarios = await generate_scenarios(
            server,
            args.num_scenarios,
            generator_model=args.generator_model,
            generator_base_url=args.generator_base_url,
            generator_api_key=args.generator_api_key,
            instructions=args.instructions,
        )
    path = save_scenarios(scenarios, args.output)
    print(f"wrote {len(scenarios)} scenarios to {path}")
    return 0


async def _train(args: argparse.Namespace) -> int:
    from art_mcp.generate import generate_scenarios
    from art_mcp.scenarios import load_scenarios, save_scenarios

    async with AsyncExitStack() as stack:
        server = await open_server(args, stack)
        if args.scenarios:
            scenarios = load_scenarios(args.scenarios)
        else:
            scenarios = await generate_scenarios(
                server,
                args.generate,
                generator_model=args.generator_model,
                generator_base_url=args.generator_base_url,
                generator_api_key=args.generator_api_key,
                instructions=args.instructions,
            )
            saved = save_scenarios(
                scenarios, Path(args.path) / args.project / f"{args.name}-scenarios.jsonl"
            )
            print(f"generated {len(scenarios)} scenarios -> {saved}")
        val = load_scenarios(args.val_scenarios) if args.val_scenarios else None
        await train_from_args(args, server, scenarios, val, errlog=_errlog(args, stack))
    return 0


async def train_from_args(
    args: argparse.Namespace, server: Any, scenarios: list[Any], val: list[Any] | None, **kw: Any
) -> Any:
    """Register the model, train it as the arguments say, print the report; return it."""
    import art_core as art
    from art_mcp.train import train

    options = _train_settings_from_args(args, scenarios, val)
    started = time.perf_counter()
    async with art.LocalBackend(path=args.path) as backend:
        model = art.TrainableModel(name=args.name, project=args.project, base_model=args.base_model)
        print(f"loading {args.base_model} ...", flush=True)
        await model.register(backend)
        print(
            f"model {args.project}/{args.name} at step {await model.get_step()}; "
            f"{len(scenarios)} training scenarios; server {server}",
            flush=True,
        )
        report = await train(model, server, scenarios, options, **kw)
    _print_report(report, time.perf_counter() - started)
    return report


def _train_settings_from_args(
    args: argparse.Namespace, scenarios: list[Any], val: list[Any] | None
) -> MCPTrainSettings:
    """``train``'s settings (an ``MCPTrainSettings``) as the arguments say: the reward or
    judge, the rollouts' settings, the GRPO config and the sparse-reward options."""
    from art_core.training.config import TrainConfig
    from art_mcp.rollout import RolloutSettings
    from art_mcp.train import Judge, MCPTrainSettings

    judge = (
        Judge(model=args.judge_model, base_url=args.judge_base_url, api_key=args.judge_api_key)
        if args.judge_model
        else None
    )
    reward_fn = None
    if judge is None or args.reward:
        reward_fn = load_reward(args.reward)
        if reward_fn.__name__ == "answer_reward":
            missing = [s.id for s in scenarios if s.answer is None]
            if missing:
                raise ValueError(
                    f"{len(missing)} scenarios have no expected answer for the 'answer' reward: "
                    "give --judge-model (RULER) or --reward MODULE:FUNCTION"
                )
    settings = RolloutSettings(
        max_turns=args.max_turns,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        tool_choice=args.tool_choice,
        tool_timeout_s=args.tool_timeout,
        system_prompt=args.system_prompt,
        parallel_tool_calls=False if getattr(args, "one_call_per_turn", False) else None,
        max_answer_chars=getattr(args, "max_answer_chars", None),
    )
    settings = dataclasses.replace(settings, **getattr(args, "extra_settings", {}))
    config = TrainConfig(
        learning_rate=args.learning_rate, lora_rank=args.lora_rank, lora_alpha=2 * args.lora_rank
    )
    return MCPTrainSettings(
        steps=args.steps,
        groups_per_step=args.groups_per_step,
        rollouts_per_group=args.rollouts_per_group,
        reward_fn=reward_fn if judge is None else None,
        judge=judge,
        val_scenarios=val,
        val_rollouts_per_scenario=args.val_rollouts,
        settings=settings,
        val_settings=getattr(args, "val_settings", None),
        config=config,
        seed=args.seed,
        dynamic_sampling=getattr(args, "dynamic_sampling", False),
        max_rollouts_per_step=getattr(args, "max_rollouts_per_step", None),
        max_group_size=getattr(args, "max_group_size", None),
        curriculum=getattr(args, "curriculum", False),
        success_threshold=getattr(args, "success_threshold", 1.0),
        warm_start=warm_start_from_args(args),
        time_budget_s=None if getattr(args, "minutes", None) is None else args.minutes * 60,
    )


def _print_report(report: TrainReport, wall: float) -> None:
    """Each step's line, then the before/after table, the warm start and the wall time."""
    print()
    print("step  reward  (runs)  signal  all-equal  spent  never solved  why")
    for record in report.steps:
        print(
            f"{record.step:>4}  {record.reward:6.3f}  ({record.rollouts:>4})  "
            f"{record.groups_with_signal:>6}  {record.groups_all_equal:>9}  "
            f"{record.rollouts_spent:>5}  {record.never_solved:>12.0%}  "
            + (", ".join(d.code for d in record.diagnoses) or "-")
        )
    print()
    print(report.table())
    if report.warm_start is not None:
        print(report.warm_start.line())
    print(f"\nwall time {wall / 60:.1f} min (training {report.training_s / 60:.1f} min)")
