"""Train an OpenAI Agents SDK agent (triage -> handoff -> weather tool) with GRPO, on CPU.

    python examples/openai_agents/train.py                              # tiny-random, 2 steps
    python examples/openai_agents/train.py --base-model smollm2-135m --steps 4
    python examples/openai_agents/train.py --train-agents weather       # train one agent only

Each step: every scenario of the step is run ``--rollouts-per-group`` times through the
unchanged agents (``art_openai_agents.rollout`` serves them from the trainable model and
captures every call token-exactly, tagged with its agent), scored from the run (handoff made,
right city asked), and ``model.train`` runs one GRPO step on the groups and hot-swaps the new
LoRA adapter in. The trajectories trained on are saved under
``{path}/{project}/models/{name}/trajectories/train/``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import art_openai_agents
from agents.result import RunResultBase
from art_openai_agents import ArtModelProvider

import art_core as art
from art_core.training.config import TrainConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from weather_agents import Scenario, build_agents, scenarios, score


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--base-model", default="tiny-random", help="tiny-random | smollm2-135m")
    parser.add_argument("--path", default=".art", help="where models, checkpoints and logs go")
    parser.add_argument("--project", default="openai-agents-example")
    parser.add_argument("--name", default="weather-triage")
    parser.add_argument("--steps", type=int, default=2, help="training steps to run")
    parser.add_argument("--groups-per-step", type=int, default=2, help="scenarios per step")
    parser.add_argument("--rollouts-per-group", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64, help="per model call")
    parser.add_argument(
        "--train-agents",
        nargs="+",
        default=None,
        metavar="AGENT",
        help="train only these agents' calls (triage, weather); default: all",
    )
    parser.add_argument(
        "--free-first-turn",
        action="store_true",
        help="let the triage agent decide whether to hand off (tool_choice=auto)",
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

    triage = build_agents(max_tokens=args.max_tokens, free_first_turn=args.free_first_turn)
    provider = ArtModelProvider(model)  # one provider for every rollout, export to OpenAI off

    async def rollout(scenario: Scenario) -> art.Trajectory:
        found: dict[str, float | bool] = {}

        def reward(result: RunResultBase) -> float:
            # computed from what the run did: its handoffs and tool calls
            value, metrics = score(scenario, result)
            found.update(metrics)
            return value

        trajectory = await art_openai_agents.rollout(
            model,
            triage,
            scenario.question,
            reward=reward,
            provider=provider,
            max_turns=4,
            train_agents=args.train_agents,
            metadata={"city": scenario.city, "question": scenario.question},
        )
        trajectory.metrics.update(found)
        return trajectory

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
            summary = example.metadata["openai_agents"]
            print(
                f"  e.g. {example.metadata['question']!r}: agents {summary['agents']}, "
                f"tool calls {[(c['tool'], c['input']) for c in summary['tool_calls']]}, "
                f"answer {summary.get('final_output')!r}, trained calls "
                f"{[c.metadata['agent'] for c in example.calls]}"
            )
            result = await model.train(
                groups,
                config=TrainConfig(learning_rate=args.learning_rate, lora_rank=args.lora_rank),
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
        await provider.aclose()
        await backend.close()
    return means


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
