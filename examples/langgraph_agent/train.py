"""Train the LangGraph weather agent with GRPO, end to end, on this machine.

    python examples/langgraph_agent/train.py                           # tiny-random, 2 steps (~1 min)
    python examples/langgraph_agent/train.py --base-model smollm2-135m --steps 4

Each step: every scenario of the step is run ``--rollouts-per-group`` times through the
unchanged graph (``wrap_rollout`` captures every LLM call token-exactly), scored, and
``model.train`` runs one GRPO step on the groups and hot-swaps the new LoRA adapter in. The
trajectories trained on are saved under ``{path}/{project}/models/{name}/trajectories/train/``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import art_langgraph

import art_core as art

sys.path.insert(0, str(Path(__file__).resolve().parent))
from weather_agent import Scenario, build_graph, reward, scenarios, transcript


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-model", default="tiny-random", help="tiny-random | smollm2-135m")
    parser.add_argument("--path", default=".art", help="where models, checkpoints and logs go")
    parser.add_argument("--project", default="langgraph-example")
    parser.add_argument("--name", default="weather-agent")
    parser.add_argument("--steps", type=int, default=2, help="training steps to run")
    parser.add_argument("--groups-per-step", type=int, default=2, help="scenarios per step")
    parser.add_argument("--rollouts-per-group", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64, help="per model call")
    parser.add_argument(
        "--seed",
        type=int,
        help="seed the rollouts (each its own seed, derived from this one): a rerun replays them",
    )
    parser.add_argument(
        "--free-first-turn",
        action="store_true",
        help="let the model decide whether to call a tool on its first turn (tool_choice=auto)",
    )
    args = parser.parse_args(argv)
    for flag in ("steps", "groups_per_step", "rollouts_per_group", "max_tokens"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")
    return args


async def main(args: argparse.Namespace) -> list[float]:
    """Train; returns the mean reward of each step's rollouts."""
    backend = art.LocalBackend(path=args.path)
    model = art.TrainableModel(name=args.name, project=args.project, base_model=args.base_model)
    await model.register(backend)

    # Built once: each call goes to the rollout of the task that makes it.
    llm = art_langgraph.init_chat_model(temperature=1.0, max_tokens=args.max_tokens)
    graph = build_graph(llm, force_first_tool=not args.free_first_turn)

    async def run_agent(scenario: Scenario) -> art.Trajectory:
        state = await graph.ainvoke(
            {"messages": [("user", scenario.question)]}, config={"recursion_limit": 12}
        )
        score, metrics = reward(scenario, state["messages"])
        return art.Trajectory(
            reward=score,
            metrics=metrics,
            metadata={"question": scenario.question},
            logs=[transcript(state["messages"])],
        )

    sampling = art.RolloutSampling(seed=args.seed) if args.seed is not None else None
    rollout = art_langgraph.wrap_rollout(model, run_agent, sampling=sampling)
    pool = scenarios()
    means: list[float] = []
    started = time.time()
    try:
        for i in range(args.steps):
            step = await model.get_step()
            batch = [
                pool[(i * args.groups_per_step + k) % len(pool)]
                for k in range(args.groups_per_step)
            ]
            groups = await art.gather_trajectory_groups(
                (
                    art.TrajectoryGroup(rollout(s) for _ in range(args.rollouts_per_group))
                    for s in batch
                ),
                pbar_desc=f"rollouts (step {step})",
            )
            rewards = [t.reward for g in groups for t in g]
            means.append(sum(rewards) / len(rewards))
            example = groups[0].trajectories[0]
            print(f"  e.g. {example.metadata['question']!r}: {example.logs[0]}")
            result = await model.train(
                groups,
                config=art.TrainConfig(learning_rate=args.learning_rate, lora_rank=args.lora_rank),
            )
            loss = result.metrics.get("train/loss")
            print(
                f"step {result.step}: mean reward {means[-1]:.3f} over {len(rewards)} rollouts"
                + (f", loss {loss:.4f}" if loss is not None else "")
                + f" ({time.time() - started:.0f}s)"
            )
            for diagnosis in result.diagnoses:  # why the step learned little, if it did
                print(f"  why: {diagnosis.line()}")
        folder = backend.model_folder(model) / "trajectories" / "train"
        print(f"trained on: {sorted(p.name for p in folder.glob('*.jsonl'))} in {folder}")
    finally:
        await backend.close()
    return means


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
