"""Data-parallel training benchmark: 1 rank vs N ranks on the same groups, same run.

Every arm trains a fresh adapter on the same seeded groups (prompts shared within a group,
completions of mixed lengths, real sampler logprobs from the base model), one warm-up step
(it also starts the ranks) and then ``--steps`` timed steps. It prints the seconds per step
of:

- ``1 rank``: the in-process ``Trainer`` with ``--threads`` torch threads (today's path);
- ``world of 1``: the distributed path with one rank (coordinator and process overhead);
- ``N ranks``: ``DistributedTrainer`` with ``--ranks`` processes of ``--threads`` threads,

and the speed-up of N ranks over 1 rank (the goal on 2 cores: >= 1.6x). Run it on a quiet
machine with at least ``ranks * threads`` free cores.

Usage: bash run.sh bench distributed_training [--base-model smollm2-135m] [--ranks 2]
       [--threads 1] [--groups 4] [--rollouts 4] [--steps 2]
       bash run.sh bench distributed_training --smoke   (tiny-random, every arm, ~1 min)
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _machine import machine_line
from transformers import AutoModelForCausalLM

from art_core.cpu import cpu_model
from art_core.device import autocast_dtype
from art_core.embedded import resolve_base_model
from art_core.training import TrainConfig, Trainer
from art_core.training.distributed import DistributedTrainer, TrainingWorld
from art_core.trajectories import LLMCall, Trajectory, TrajectoryGroup


def make_groups(base_path: Path, args: argparse.Namespace) -> list[TrajectoryGroup]:
    """Seeded groups: one prompt per group, completions of 1/4x to 2x ``--completion-tokens``."""
    model = AutoModelForCausalLM.from_pretrained(base_path).eval()
    rng = random.Random(0)
    vocab = model.config.vocab_size
    groups = []
    for _ in range(args.groups):
        prompt = [rng.randrange(vocab) for _ in range(args.prompt_tokens)]
        trajectories = []
        for _ in range(args.rollouts):
            length = rng.randint(args.completion_tokens // 4, args.completion_tokens * 2)
            completion = [rng.randrange(vocab) for _ in range(length)]
            ids = torch.tensor([prompt + completion])
            with torch.no_grad():
                logp = model(ids).logits[0, :-1].float().log_softmax(-1)
            picked = logp.gather(-1, ids[0, 1:, None])[:, 0][len(prompt) - 1 :].tolist()
            call = LLMCall(
                model="bench",
                messages=[],
                prompt_token_ids=prompt,
                completion_token_ids=completion,
                logprobs=picked,
            )
            trajectories.append(Trajectory(calls=[call], reward=rng.random()))
        groups.append(TrajectoryGroup(trajectories))
    return groups


def time_steps(
    trainer: Any, groups: list[TrajectoryGroup], config: TrainConfig, steps: int
) -> tuple[list[float], dict[str, float]]:
    trainer.train_step(groups, config)  # warm-up: loads the model (and starts the ranks)
    seconds = []
    metrics: dict[str, float] = {}
    for _ in range(steps):
        started = time.perf_counter()
        metrics = trainer.train_step(groups, config).metrics
        seconds.append(time.perf_counter() - started)
    return seconds, metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-model", default="smollm2-135m")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--rollouts", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--completion-tokens", type=int, default=96)
    parser.add_argument("--steps", type=int, default=2, help="timed steps after one warm-up")
    parser.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp32"])
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny-random, 2 groups x 2 rollouts of 16 + 4..32 tokens, one timed step per arm "
        "(2 ranks): every arm and the same table",
    )
    args = parser.parse_args()
    print(machine_line(), flush=True)  # the figures below depend on it
    if args.smoke:
        args.base_model, args.ranks, args.steps = "tiny-random", 2, 1
        args.groups, args.rollouts, args.prompt_tokens, args.completion_tokens = 2, 2, 16, 16

    torch.set_num_threads(args.threads)  # the in-process arm: one rank of --threads threads
    base_path = resolve_base_model(args.base_model)
    groups = make_groups(base_path, args)
    config = TrainConfig(learning_rate=1e-5, precision=args.precision)
    tokens = sum(
        len(t.calls[0].prompt_token_ids) + len(t.calls[0].completion_token_ids)
        for g in groups
        for t in g.trajectories
    )
    dtype = autocast_dtype(args.precision, torch.device("cpu")) or torch.float32
    print(f"CPU: {cpu_model()}; precision {args.precision} -> {dtype}; model {args.base_model}")
    print(
        f"{args.groups} groups x {args.rollouts} rollouts, {tokens} tokens per step "
        f"(prompts shared per group); {args.steps} timed steps after a warm-up"
    )
    results: dict[str, tuple[list[float], dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="art-bench-dp-") as root:
        results["1 rank"] = time_steps(
            Trainer(base_path, Path(root) / "one", device="cpu"), groups, config, args.steps
        )
        for name, ranks in (("world of 1", 1), (f"{args.ranks} ranks", args.ranks)):
            world = TrainingWorld(
                ranks=ranks, devices=("cpu",) * ranks, threads_per_rank=args.threads
            )
            trainer = DistributedTrainer(base_path, Path(root) / name.replace(" ", "-"), world)
            try:
                results[name] = time_steps(trainer, groups, config, args.steps)
            finally:
                trainer.unload()

    baseline = statistics.fmean(results["1 rank"][0])
    print()
    print(
        f"| arm ({args.threads} thread(s) per rank) | s/step | speed-up vs 1 rank | all-reduce s |"
    )
    print("|---|---|---|---|")
    for name, (seconds, metrics) in results.items():
        mean = statistics.fmean(seconds)
        allreduce = metrics.get("train/allreduce_seconds")
        shown = "-" if allreduce is None else f"{allreduce:.3f}"
        print(f"| {name} | {mean:.2f} | {baseline / mean:.2f}x | {shown} |")
    metrics = results[f"{args.ranks} ranks"][1]
    per_rank = ", ".join(
        f"rank {r}: {metrics[f'train/rank{r}/tokens']:.0f} tokens in "
        f"{metrics[f'train/rank{r}/seconds']:.2f} s"
        for r in range(args.ranks)
    )
    print(f"\n{args.ranks} ranks, last step: {per_rank}")
    ratio = baseline / statistics.fmean(results[f"{args.ranks} ranks"][0])
    print(f"ratio {args.ranks} ranks / 1 rank: {ratio:.2f}x (goal >= 1.6x with 2 ranks)")


if __name__ == "__main__":
    main()
