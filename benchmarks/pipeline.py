"""Lock-step GRPO vs ``PipelineTrainer``: wall time to a train reward, and rollouts per second.

The task of ``grpo_vs_trl.py`` (answer arithmetic questions with the number only; reward =
share of the answer's non-space characters that are digits) on the embedded
SmolLM2-135M-Instruct, the same prompts, group size, LoRA shape and learning rate in both:

- **lock-step**: gather ``groups_per_step`` groups, then ``model.train`` (the engine pauses
  while the trainer runs on every core), repeat;
- **pipelined**: ``art.PipelineTrainer(overlap=True)`` (rollouts keep sampling on the
  adapter served while the trainer trains on its share of the cores; groups more than
  ``--max-steps-off-policy`` steps old are dropped; truncated importance sampling on);
- **pipeline default**: ``art.PipelineTrainer()`` as a user gets it (``overlap=None``): it
  trains its first steps lock-step, predicts from their split (sampling and training, wall
  and CPU seconds) whether overlap would at least double the rate of steps, and tries it only
  then; the table says what it chose and why.

Both are measured the same way, from the rollouts themselves: every finished rollout's reward
and time is recorded; the *train reward* is the mean over the last ``--window`` finished
rollouts. The table gives rollouts/s, the wall time until the train reward first reached
``--target``, and the ratio lock-step / pipelined (> 1: the pipeline is faster).

On one GPU the two share the device: there the default pipeline trains lock-step, and
``overlap=True`` refuses to start (``serve_while_training`` needs other cores or a device).

Run (on a quiet machine: a second heavy process distorts every figure):
    bash run.sh bench pipeline                      # smollm2-135m, 600 s budget per mode
    bash run.sh bench pipeline --smoke              # tiny-random, every path, ~30 s
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _machine import machine_line

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

QUESTIONS = [
    (a, op, b)
    for a, b in [(12, 7), (9, 8), (25, 4), (31, 6), (14, 3), (48, 2), (17, 5), (66, 9), (23, 11)]
    for op in ("+", "*")
]
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def prompt_text(index: int) -> str:
    a, op, b = QUESTIONS[index % len(QUESTIONS)]
    return f"What is {a} {op} {b}? Answer with the number only."


def digit_fraction(text: str) -> float:
    chars = [c for c in text if not c.isspace()]
    return sum(c.isdigit() for c in chars) / len(chars) if chars else 0.0


def scenarios(flat: int = 0) -> Iterator[dict[str, Any]]:
    """Endless: the questions in turn, each scenario with its own seed. The first ``flat``
    (``--smoke``) score 0 whatever the answer: groups without a signal, which lock-step
    trains nothing on and the pipeline drops."""
    for index in itertools.count():
        yield {"index": index, "prompt": prompt_text(index), "flat": index < flat}


@dataclass
class Run:
    """What one mode did: (seconds since start, reward) per finished rollout, and steps."""

    name: str
    started: float = field(default_factory=time.perf_counter)
    finished: list[tuple[float, float]] = field(default_factory=list)
    completion_tokens: int = 0
    steps: int = 0
    dropped: int = 0
    wall: float = 0.0
    choice: str = ""  # what the default pipeline chose, and why

    def record(self, reward: float, tokens: int) -> None:
        self.finished.append((time.perf_counter() - self.started, reward))
        self.completion_tokens += tokens

    def train_reward(self, window: int) -> float:
        recent = [r for _, r in self.finished[-window:]]
        return statistics.fmean(recent) if recent else 0.0

    def time_to(self, target: float, window: int) -> float | None:
        for end in range(window, len(self.finished) + 1):
            part = self.finished[end - window : end]
            if statistics.fmean(r for _, r in part) >= target:
                return part[-1][0]
        return None


def train_config(args: argparse.Namespace) -> Any:
    from art_core.training import TrainConfig

    return TrainConfig(
        learning_rate=args.lr,
        lora_rank=args.lora_rank,
        lora_alpha=2 * args.lora_rank,
        lora_target_modules=TARGET_MODULES,
        adam_betas=(0.9, 0.99),
        epsilon=0.2,
        max_grad_norm=1.0,
        scale_rewards=True,
        truncated_importance_sampling=2.0,
    )


def make_rollout(args: argparse.Namespace, run: Run) -> Any:
    import art_core as art

    seeds = itertools.count(args.seed * 1_000_000)

    async def rollout(model: art.TrainableModel, scenario: dict[str, Any]) -> art.Trajectory:
        async with art.capture(model, metadata={"scenario": scenario["index"]}) as captured:
            response = await captured.openai_client().chat.completions.create(
                model=captured.model_name,
                messages=[{"role": "user", "content": scenario["prompt"]}],
                max_tokens=args.max_tokens,
                temperature=1.0,
                seed=next(seeds),
            )
        answer = response.choices[0].message.content or ""
        reward = 0.0 if scenario["flat"] else digit_fraction(answer)
        run.record(reward, response.usage.completion_tokens if response.usage else 0)
        return captured.trajectory(reward=reward)

    return rollout


def reached(run: Run, args: argparse.Namespace) -> bool:
    return len(run.finished) >= args.window and run.train_reward(args.window) >= args.target


async def lock_step(args: argparse.Namespace, workdir: Path) -> Run:
    import art_core as art

    run = Run("lock-step")
    async with art.LocalBackend(path=workdir / "lock-step") as backend:
        model = art.TrainableModel(name="bench", project="pipeline", base_model=args.model)
        await model.register(backend)
        rollout = make_rollout(args, run)
        config = train_config(args)
        source = scenarios(args.flat_scenarios)
        run.started = time.perf_counter()
        while (
            time.perf_counter() - run.started < args.max_seconds
            and not reached(run, args)
            and (args.max_steps is None or run.steps < args.max_steps)
        ):
            batch = [next(source) for _ in range(args.groups_per_step)]
            groups = await art.gather_trajectory_groups(
                (
                    art.TrajectoryGroup(rollout(model, s) for _ in range(args.group_size))
                    for s in batch
                ),
                pbar_desc=None,
            )
            result = await model.train(groups, config=config)
            run.steps += 0 if result.nothing_trained else 1
            print(
                f"  lock-step step {run.steps}: train reward {run.train_reward(args.window):.3f}"
                + (
                    f" (trained nothing: {result.nothing_trained})"
                    if result.nothing_trained
                    else ""
                )
            )
        run.wall = time.perf_counter() - run.started
    return run


async def pipelined(args: argparse.Namespace, workdir: Path, overlap: bool | None) -> Run:
    """``PipelineTrainer`` overlapping sampling and training (``overlap=True``), or choosing
    from what it measures on its first steps (``overlap=None``, the default)."""
    import art_core as art
    from art_core.pipeline.trainer import PROBE_STEPS

    name = "pipelined" if overlap else "pipeline default"
    run = Run(name)
    async with art.LocalBackend(path=workdir / name.replace(" ", "-")) as backend:
        model = art.TrainableModel(name="bench", project="pipeline", base_model=args.model)
        await model.register(backend)
        trainer = art.PipelineTrainer(
            model,
            make_rollout(args, run),
            scenarios(args.flat_scenarios),
            group_size=args.group_size,
            groups_per_step=args.groups_per_step,
            max_steps_off_policy=args.max_steps_off_policy,
            max_steps=args.max_steps,
            train_config=train_config(args),
            progress=False,
            resume=False,
            overlap=overlap,
        )
        run.started = time.perf_counter()
        task = asyncio.ensure_future(trainer.train())
        while not task.done():
            await asyncio.sleep(0.5)
            if time.perf_counter() - run.started >= args.max_seconds or reached(run, args):
                task.cancel()
                break
        await asyncio.gather(task, return_exceptions=True)
        run.wall = time.perf_counter() - run.started
        run.steps = trainer.state.steps
        run.dropped = trainer.state.dropped_stale
        print(
            f"  {name}: {run.steps} steps, train reward {run.train_reward(args.window):.3f}, "
            f"{trainer.state.dropped_no_signal} groups without signal dropped"
        )
        if overlap is None:
            run.choice = trainer.overlap_reason or (
                f"still measuring after {run.steps} steps (it decides after {PROBE_STEPS})"
            )
    return run


def table(runs: list[Run], args: argparse.Namespace) -> str:
    rows = [
        "| mode | steps | rollouts | rollouts/s | tokens/s | train reward (last "
        f"{args.window}) | s to reward {args.target} | dropped stale |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        to = run.time_to(args.target, args.window)
        rows.append(
            f"| {run.name} | {run.steps} | {len(run.finished)} | "
            f"{len(run.finished) / run.wall:.2f} | {run.completion_tokens / run.wall:.1f} | "
            f"{run.train_reward(args.window):.3f} | "
            f"{'not reached' if to is None else f'{to:.0f}'} | {run.dropped} |"
        )
    lock, pipe, default = runs
    rows.append("")
    rows.append(f"pipeline default (overlap=None): {default.choice}")
    rate = (len(pipe.finished) / pipe.wall) / max(len(lock.finished) / lock.wall, 1e-9)
    rows.append("")
    rows.append(f"rollouts/s pipelined / lock-step: {rate:.2f}x")
    lock_to, pipe_to = (
        lock.time_to(args.target, args.window),
        pipe.time_to(args.target, args.window),
    )
    if lock_to is not None and pipe_to is not None:
        rows.append(
            f"time to reward {args.target}, lock-step / pipelined: {lock_to / pipe_to:.2f}x"
        )
    return "\n".join(rows)


async def main_async(args: argparse.Namespace) -> None:
    from art_core.cpu import cpu_budget

    print(
        f"model {args.model}, {cpu_budget()} CPU cores, budget {args.max_seconds:.0f} s per mode"
        + ("" if args.max_steps is None else f" or {args.max_steps} trained steps")
    )
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as tmp:
        runs = [
            await lock_step(args, Path(tmp)),
            await pipelined(args, Path(tmp), overlap=True),
            await pipelined(args, Path(tmp), overlap=None),
        ]
    print()
    print(table(runs, args))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--max-seconds", type=float, default=600.0, help="budget per mode")
    parser.add_argument("--target", type=float, default=0.9, help="train reward to reach")
    parser.add_argument("--window", type=int, default=32, help="rollouts in the train reward")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--groups-per-step", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--max-steps-off-policy", type=int, default=1)
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--max-steps", type=int, default=None, help="also stop a mode after this many trained steps"
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny-random, steps of 2 groups x 2 rollouts of 8 tokens, the first step's groups "
        "without signal, target 0 over 12 rollouts (both modes stop on it), 5 steps or 30 s "
        "at most: every path and the same table",
    )
    args = parser.parse_args()
    print(machine_line(), flush=True)  # the figures below depend on it
    args.flat_scenarios = 0
    if args.smoke:
        args.model, args.group_size, args.groups_per_step, args.max_tokens = "tiny-random", 2, 2, 8
        args.flat_scenarios = args.groups_per_step
        args.target, args.window = 0.0, 3 * args.group_size * args.groups_per_step
        # 5 steps: past the default pipeline's choice (after PROBE_STEPS) when the target
        # does not stop it first.
        args.max_steps, args.max_seconds = 5, 30.0
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
