"""Train a model to use ``mcp-server-calculator`` (a third-party MCP server from PyPI).

That package imports ``mcp.server.fastmcp`` (gone in mcp 2.x), so it runs from its own venv:
run ``bash examples/mcp/setup_calculator.sh`` once. Tasks are arithmetic questions with a known
answer; the model must pass the expression to ``calculate`` and report the result
(``art_mcp.answer_reward``: 1 for the right number, partial credit for finding it and for
answering at all).

    bash examples/mcp/setup_calculator.sh
    python examples/mcp/calculator_agent.py                # 2 small steps on smollm2-135m
    python examples/mcp/calculator_agent.py --steps 10 --rollouts-per-group 8
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from pathlib import Path

import art_mcp

import art_core as art

DEFAULT_SERVER = (
    Path(__file__).resolve().parent / ".venv-calculator" / "bin" / "mcp-server-calculator"
)
SYSTEM_PROMPT = (
    "You solve arithmetic with the calculate tool: pass it the expression, e.g. 12*7. "
    "Then call complete_task with the number it returned."
)


def arithmetic_scenarios(count: int, seed: int = 0) -> list[art_mcp.Scenario]:
    """Products and sums of two- and three-digit numbers, with their answers."""
    rng = random.Random(seed)
    scenarios = []
    for _ in range(count):
        a, b = rng.randint(12, 99), rng.randint(12, 999)
        if rng.random() < 0.5:
            task, answer = f"What is {a} times {b}?", a * b
        else:
            task, answer = f"What is {a} plus {b}?", a + b
        scenarios.append(art_mcp.Scenario(task=task, difficulty=1, answer=str(answer)))
    return art_mcp.scenarios.dedupe(scenarios)


async def main(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    server = args.server or str(DEFAULT_SERVER)
    if not args.server and not DEFAULT_SERVER.is_file():
        raise SystemExit("run `bash examples/mcp/setup_calculator.sh` first (or pass --server)")
    async with art_mcp.connect(server) as session:
        print("tools:", [t.name for t in session.tools])
    scenarios = arithmetic_scenarios(24)
    settings = art_mcp.RolloutSettings(
        tool_choice="required",
        parallel_tool_calls=False,
        max_turns=3,
        max_tokens=48,
        max_answer_chars=40,
        system_prompt=SYSTEM_PROMPT,
    )
    async with art.LocalBackend(path=args.path) as backend:
        model = art.TrainableModel(
            name=args.name, project="mcp-calculator", base_model=args.base_model
        )
        await model.register(backend)
        report = await art_mcp.train(
            model,
            server,
            scenarios[4:],
            val_scenarios=scenarios[:4],
            steps=args.steps,
            groups_per_step=args.groups_per_step,
            rollouts_per_group=args.rollouts_per_group,
            reward_fn=art_mcp.answer_reward,
            settings=settings,
            config=art.TrainConfig(learning_rate=args.learning_rate, lora_rank=8, lora_alpha=16),
        )
    for record in report.steps:
        print(f"step {record.step}: reward {record.reward:.3f} ({record.rollouts} runs)")
    print(report.table())
    print(f"wall time {(time.perf_counter() - started) / 60:.1f} min")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--server", default=None, help="the calculator server's command")
    parser.add_argument("--base-model", default="smollm2-135m")
    parser.add_argument("--name", default="calculator-agent")
    parser.add_argument("--path", default=".art")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--groups-per-step", type=int, default=2)
    parser.add_argument("--rollouts-per-group", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=5e-4)
    asyncio.run(main(parser.parse_args()))
