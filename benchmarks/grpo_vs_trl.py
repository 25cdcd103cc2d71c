"""Our GRPO loop vs TRL's ``GRPOTrainer``: seconds per step and reward, side by side.

Both train a LoRA on the embedded SmolLM2-135M-Instruct for the same task (answer arithmetic
questions with the number only; reward = share of the answer's non-space characters that are
digits), with the same prompts in the same order, group size, max tokens, LoRA shape,
learning rate, clip range and loss normalization (TRL's ``loss_type="grpo"`` is the same
per-rollout mean as ours for one-call rollouts). A step is everything: sampling the group
and training on it.

- ours: the full public loop: ``LocalBackend`` (gateway + transformers engine), ``capture``
  with the ``openai`` client, ``gather_trajectory_groups``, ``model.train`` (engine paused,
  GRPO step, adapter hot-swapped).
- TRL: ``GRPOTrainer`` (HF ``generate``), in fp32 without gradient checkpointing: its
  fastest CPU settings here (``--trl-defaults`` keeps bf16 autocast + checkpointing).

After training, both final adapters are scored by the same evaluator (HF sampling on
held-out prompts, fixed seeds), so the reward comparison does not depend on either loop.

Steps get cheaper as a policy learns (answers shrink to a few digits; our trainer skips groups
whose rewards are all equal), so a loop that learns faster also looks faster per step. The
table therefore also gives the median over the first half of the steps, where neither loop has
converged, and the wall time each loop needed to reach a train reward of 0.9.

A step whose groups all have equal rewards (a policy that has converged) carries no signal:
``model.train`` trains nothing (``TrainResult.nothing_trained``, no checkpoint, the adapter
stays), TRL runs its backward pass and optimizer step on a zero loss. Both count in the
``no-signal steps`` column. Where trl is not installed, the TRL row says the baseline is
missing and our loop still runs.

Run (trl is a benchmark-only dependency; pin torch so pip keeps the CPU build):
    pip install -e ".[bench]" "torch==2.13.0"
    bash run.sh bench grpo_vs_trl          # or: python benchmarks/grpo_vs_trl.py --steps 20
    bash run.sh bench grpo_vs_trl --smoke  # tiny-random, every path, ~40 s
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import os
import statistics
import tempfile
import time
from collections.abc import Callable
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
INSTRUCTION = "Answer with the number only."
TRL_NAME = "TRL GRPOTrainer"
TRL_NOT_INSTALLED = 'trl is not installed (pip install -e ".[bench]")'
TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def prompt_text(question: tuple[int, str, int]) -> str:
    a, op, b = question
    return f"What is {a} {op} {b}? {INSTRUCTION}"


def digit_fraction(text: str) -> float:
    """The reward: share of non-space characters that are digits (0 for an empty answer)."""
    chars = [c for c in text if not c.isspace()]
    return sum(c.isdigit() for c in chars) / len(chars) if chars else 0.0


def letter_fraction(text: str) -> float:
    """The ``--smoke`` reward: tiny-random's answers are noise, rarely with a digit, but their
    share of letters differs from answer to answer, so groups carry a signal."""
    chars = [c for c in text if not c.isspace()]
    return sum(c.isalpha() for c in chars) / len(chars) if chars else 0.0


# The reward of an answer at a step (0-based, warm-up included), the same for both loops.
Reward = Callable[[int, str], float]


def make_reward(args: argparse.Namespace) -> Reward:
    """``digit_fraction``; with ``--smoke``, ``letter_fraction`` and, on the last step, 1.0
    for every answer: a converged policy, whose groups all have equal rewards (the step that
    trains nothing)."""
    if not args.smoke:
        return lambda _step, text: digit_fraction(text)
    flat_step = args.warmup + args.steps - 1
    return lambda step, text: 1.0 if step == flat_step else letter_fraction(text)


@dataclass
class RunStats:
    name: str
    step_seconds: list[float] = field(default_factory=list)
    # CPU seconds of this process (all threads): less sensitive than wall time to other
    # processes on the cores (though OpenMP spin-waits inflate it under contention).
    step_cpu_seconds: list[float] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    completion_tokens: list[float] = field(default_factory=list)
    parts: dict[str, list[float]] = field(default_factory=dict)
    adapter_dir: Path | None = None
    eval_reward: float | None = None
    # Steps whose groups all had equal rewards: ours trained nothing on them (the reasons
    # ``TrainResult.nothing_trained`` gave), TRL took its optimizer step on a zero loss.
    no_signal_steps: int = 0
    nothing_trained: list[str] = field(default_factory=list)

    def measured(self, warmup: int, cpu: bool = False) -> list[float]:
        values = self.step_cpu_seconds if cpu else self.step_seconds
        return values[warmup:] or values


# ----------------------------------------------------------------------------------- ours


async def run_ours(
    args: argparse.Namespace, batches: list[list[str]], workdir: Path, reward: Reward
) -> RunStats:
    import art_core as art
    from art_core.training import TrainConfig

    stats = RunStats("art_core")
    config = TrainConfig(
        learning_rate=args.lr,
        lora_rank=args.lora_rank,
        lora_alpha=2 * args.lora_rank,
        lora_target_modules=tuple(TARGET_MODULES),
        adam_betas=(0.9, 0.99),
        epsilon=0.2,
        max_grad_norm=1.0,
        scale_rewards=True,
    )

    async def rollout(
        model: art.TrainableModel, step: int, prompt: str, seed: int | None
    ) -> art.Trajectory:
        async with art.capture(model) as run:
            response = await run.openai_client().chat.completions.create(
                model=run.model_name,
                messages=[{"role": "user", "content": prompt}],
                max_tokens=args.max_tokens,
                temperature=1.0,
                seed=seed,
            )
        answer = response.choices[0].message.content or ""
        return run.trajectory(reward=reward(step, answer))

    def rollout_seed(step: int, prompt: int, rollout: int) -> int | None:
        # Seeded like TRL's run (GRPOConfig(seed=...)): the same command gives the same curve.
        if args.seed is None:
            return None
        return args.seed * 1_000_000 + step * 1000 + prompt * 100 + rollout

    async with art.LocalBackend(path=workdir / "ours", dtype=args.engine_dtype) as backend:
        model = art.TrainableModel(name="bench", project="bench", base_model=args.base_model)
        await model.register(backend)
        checkpoint: str | None = None
        for step, prompts in enumerate(batches):
            started, cpu_started = time.perf_counter(), time.process_time()
            groups = await art.gather_trajectory_groups(
                (
                    art.TrajectoryGroup(
                        rollout(model, step, p, rollout_seed(step, index, i))
                        for i in range(args.group_size)
                    )
                    for index, p in enumerate(prompts)
                ),
                pbar_desc=None,
            )
            sampled = time.perf_counter()
            result = await model.train(groups, config=config)
            done = time.perf_counter()
            stats.step_seconds.append(done - started)
            stats.step_cpu_seconds.append(time.process_time() - cpu_started)
            stats.parts.setdefault("sample", []).append(sampled - started)
            stats.parts.setdefault("train", []).append(done - sampled)
            # A step with no signal trains nothing: no trainer time in its metrics, the
            # served adapter (result.checkpoint_path, None before any step) stays.
            trained = result.nothing_trained is None
            if not trained:
                stats.no_signal_steps += 1
                stats.nothing_trained.append(result.nothing_trained)
            stats.parts.setdefault("trainer", []).append(
                result.metrics["train/seconds"] if trained else 0.0
            )
            checkpoint = result.checkpoint_path
            trajectories = [t for g in groups for t in g.trajectories]
            stats.rewards.append(statistics.fmean(t.reward for t in trajectories))
            stats.completion_tokens.append(
                statistics.fmean(t.num_completion_tokens for t in trajectories)
            )
            outcome = (
                f"logprob mismatch {result.metrics['train/logprob_mismatch']:.4f}"
                if trained
                else f"trained nothing ({result.nothing_trained})"
            )
            print(
                f"  ours step {step + 1}: {done - started:5.1f} s, cpu {stats.step_cpu_seconds[-1]:5.1f} s "
                f"(sample {sampled - started:4.1f}, "
                f"train {done - sampled:4.1f}), reward {stats.rewards[-1]:.3f}, {outcome}",
                flush=True,
            )
        stats.adapter_dir = Path(checkpoint) if checkpoint is not None else None
    return stats


# ------------------------------------------------------------------------------------ TRL


def trl_missing() -> str | None:
    """Why the TRL baseline cannot run here (None: it can)."""
    return TRL_NOT_INSTALLED if importlib.util.find_spec("trl") is None else None


def run_trl(
    args: argparse.Namespace, batches: list[list[str]], base: Path, workdir: Path, reward: Reward
) -> RunStats:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    stats = RunStats(TRL_NAME)
    rows = [{"prompt": [{"role": "user", "content": p}]} for prompts in batches for p in prompts]

    def trl_reward(completions: list[Any], trainer_state: Any = None, **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        # global_step counts the steps done: the step sampling now, 0-based as ours.
        step = trainer_state.global_step if trainer_state is not None else -1
        return [reward(step, t) for t in texts]

    class StepTimer(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            self.started, self.cpu_started = time.perf_counter(), time.process_time()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            stats.step_seconds.append(time.perf_counter() - self.started)
            stats.step_cpu_seconds.append(time.process_time() - self.cpu_started)

        def on_log(
            self, _args: Any, state: Any, _control: Any, logs: Any = None, **__: Any
        ) -> None:
            if logs and "reward" in logs:
                stats.rewards.append(float(logs["reward"]))
                stats.completion_tokens.append(float(logs.get("completions/mean_length", 0.0)))
                # The share of groups whose rewards were all equal (zero advantage).
                no_signal = float(logs.get("frac_reward_zero_std", 0.0)) >= 1.0
                stats.no_signal_steps += int(no_signal)
                print(
                    f"  TRL  step {state.global_step}: {stats.step_seconds[-1]:5.1f} s, "
                    f"cpu {stats.step_cpu_seconds[-1]:5.1f} s, "
                    f"reward {stats.rewards[-1]:.3f}"
                    + (", no signal (all groups had equal rewards)" if no_signal else ""),
                    flush=True,
                )

    config = GRPOConfig(
        output_dir=str(workdir / "trl"),
        use_cpu=True,
        per_device_train_batch_size=args.prompts_per_step * args.group_size,
        gradient_accumulation_steps=1,
        num_generations=args.group_size,
        max_completion_length=args.max_tokens,
        max_steps=len(batches),
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        adam_beta2=0.99,
        max_grad_norm=1.0,
        beta=0.0,
        epsilon=0.2,
        loss_type="grpo",
        scale_rewards="group",
        num_iterations=1,
        temperature=1.0,
        shuffle_dataset=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=args.seed if args.seed is not None else 0,
        # TRL's own defaults on CPU (bf16 autocast, gradient checkpointing) measured ~2x
        # slower here: HF generate under bf16 autocast re-casts every weight each token.
        # Give TRL its fastest CPU settings unless --trl-defaults is passed.
        **({} if args.trl_defaults else {"bf16": False, "gradient_checkpointing": False}),
    )
    trainer = GRPOTrainer(
        model=str(base),
        reward_funcs=trl_reward,
        args=config,
        train_dataset=Dataset.from_list(rows),
        peft_config=LoraConfig(
            r=args.lora_rank,
            lora_alpha=2 * args.lora_rank,
            target_modules=TARGET_MODULES,
            task_type="CAUSAL_LM",
        ),
        callbacks=[StepTimer()],
    )
    # Time TRL's sampling (HF generate) separately, to compare the training parts too.
    generate = trainer._generate
    step_sampling: list[float] = []

    def timed_generate(*a: Any, **kw: Any) -> Any:
        started = time.perf_counter()
        try:
            return generate(*a, **kw)
        finally:
            step_sampling.append(time.perf_counter() - started)

    trainer._generate = timed_generate
    trainer.train()
    stats.parts["sample"] = step_sampling
    stats.parts["train"] = [
        total - s for total, s in zip(stats.step_seconds, step_sampling, strict=False)
    ]
    stats.adapter_dir = workdir / "trl-adapter"
    trainer.model.save_pretrained(stats.adapter_dir)
    del trainer
    gc.collect()
    return stats


# ------------------------------------------------------------------------------ evaluation


def evaluate(
    base: Path,
    adapter: Path | None,
    prompts: list[str],
    samples: int,
    max_tokens: int,
    score: Callable[[str], float] = digit_fraction,
) -> float:
    """Mean ``score`` of ``samples`` temperature-1 answers per prompt, with fixed seeds."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base)
    model: Any = AutoModelForCausalLM.from_pretrained(base)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    model.eval()
    rewards = []
    for index, prompt in enumerate(prompts):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt"
        )
        input_ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        torch.manual_seed(index)
        with torch.no_grad():
            out = model.generate(
                input_ids.repeat(samples, 1),
                attention_mask=torch.ones_like(input_ids).repeat(samples, 1),
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=max_tokens,
                pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
            )
        for row in out[:, input_ids.shape[1] :]:
            rewards.append(score(tokenizer.decode(row, skip_special_tokens=True)))
    return statistics.fmean(rewards)


# ------------------------------------------------------------------------------------ main


def summary(stats: RunStats, warmup: int) -> tuple[float, float]:
    """Median wall seconds and median CPU seconds per measured step."""
    return (
        statistics.median(stats.measured(warmup)),
        statistics.median(stats.measured(warmup, cpu=True)),
    )


def _parse_args() -> argparse.Namespace:
    """The command line, with ``--smoke``'s settings applied and ``--seed -1`` as None."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=20, help="measured steps per loop")
    parser.add_argument("--warmup", type=int, default=1, help="steps run first and not timed")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--prompts-per-step", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--eval-samples", type=int, default=16, help="answers per held-out prompt")
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seeds both loops' sampling (ours: per request); pass -1 for unseeded rollouts",
    )
    parser.add_argument(
        "--reward-threshold", type=float, default=0.9, help="train reward for 'time to reward'"
    )
    parser.add_argument(
        "--engine-dtype", default=None, help="our engine's dtype (default: its own)"
    )
    parser.add_argument("--only", choices=["both", "ours", "trl"], default="both")
    parser.add_argument(
        "--trl-defaults",
        action="store_true",
        help="TRL with its CPU defaults (bf16, checkpointing)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    parser.add_argument("--base-model", default="smollm2-135m", help="both loops' base model")
    parser.add_argument(
        "--no-trl",
        action="store_true",
        help="run as where trl is not installed: the TRL row says the baseline is missing",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny-random, 1 warm-up + 2 steps of 2 prompts x 3 rollouts, 8 tokens, both loops: "
        "every path, including a last step whose rewards are all equal (it trains nothing) "
        "and the table as printed without trl",
    )
    args = parser.parse_args()
    if args.seed is not None and args.seed < 0:
        args.seed = None
    if args.smoke:
        args.base_model, args.warmup, args.steps = "tiny-random", 1, 2
        args.group_size, args.prompts_per_step, args.max_tokens = 3, 2, 8
        args.eval_samples = 2
    return args


def main() -> None:
    args = _parse_args()
    print(machine_line(), flush=True)  # the figures below depend on it

    import torch

    from art_core.embedded import resolve_base_model

    if args.threads:
        torch.set_num_threads(args.threads)

    base = resolve_base_model(args.base_model)
    reward = make_reward(args)
    # The evaluator scores as the training steps do (the --smoke flat step aside).
    score = letter_fraction if args.smoke else digit_fraction
    total = args.warmup + args.steps
    prompts = [prompt_text(q) for q in QUESTIONS]
    needed = total * args.prompts_per_step
    train_prompts = [prompts[i % (len(prompts) - 4)] for i in range(needed)]
    eval_prompts = prompts[-4:]
    batches = [
        train_prompts[i * args.prompts_per_step : (i + 1) * args.prompts_per_step]
        for i in range(total)
    ]
    print(
        f"{args.base_model}, {args.prompts_per_step} prompts x {args.group_size} rollouts per step, "
        f"{args.max_tokens} max tokens, LoRA r{args.lora_rank}, lr {args.lr}, "
        f"{args.warmup} warmup + {args.steps} measured steps, torch threads {torch.get_num_threads()}, "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    results: list[RunStats] = []
    missing: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="grpo-bench-") as tmp:
        workdir = Path(tmp)
        if args.only in ("both", "ours"):
            print("art_core loop:", flush=True)
            results.append(asyncio.run(run_ours(args, batches, workdir, reward)))
            gc.collect()
        if args.only in ("both", "trl"):
            why = "skipped (--no-trl)" if args.no_trl else trl_missing()
            if why is None:
                print("TRL GRPOTrainer:", flush=True)
                results.append(run_trl(args, batches, base, workdir, reward))
            else:
                print(f"TRL GRPOTrainer: baseline missing: {why}", flush=True)
                missing[TRL_NAME] = why
        print(
            "evaluating final adapters on held-out prompts (same sampler, same seeds)...",
            flush=True,
        )
        base_reward = evaluate(base, None, eval_prompts, args.eval_samples, args.max_tokens, score)
        for stats in results:
            stats.eval_reward = evaluate(
                base, stats.adapter_dir, eval_prompts, args.eval_samples, args.max_tokens, score
            )

    print(f"\nload average at the end {os.getloadavg()[0]:.1f} (2 cores; other load skews timings)")
    print_report(results, base_reward, args, missing)
    if args.smoke and not missing:
        # The missing-baseline path of the report, on this run's rows.
        print("\nthe same table where trl is not installed:")
        ours = [stats for stats in results if stats.name != TRL_NAME]
        why = f"{TRL_NOT_INSTALLED}; shown by --smoke"
        print_report(ours, base_reward, args, {TRL_NAME: why})


def first_half(values: list[float], warmup: int) -> list[float]:
    measured = values[warmup:] or values
    return measured[: max(1, len(measured) // 2)]


def seconds_to_reward(stats: RunStats, threshold: float) -> tuple[int, float] | None:
    """(steps, wall seconds incl. warm-up) until the step whose train reward >= threshold."""
    for index, reward in enumerate(stats.rewards):
        if reward >= threshold:
            return index + 1, sum(stats.step_seconds[: index + 1])
    return None


def print_report(
    results: list[RunStats],
    base_reward: float,
    args: argparse.Namespace,
    missing: dict[str, str] | None = None,
) -> None:
    """The table: per-step times (all measured steps, and the first half, where neither loop
    has converged and completions are still full length), steps without signal, time to a
    train reward, rewards; a loop in ``missing`` (name: why) gets a row saying so."""
    threshold = args.reward_threshold
    header = (
        f"{'loop':<18}{'s/step':>8}{'s/step 1st half':>17}{'cpu s/step':>12}{'total s':>9}"
        f"{'no-signal steps':>17}{f'steps, s to r>={threshold}':>22}{'tokens/rollout':>16}"
        f"{'train r (last)':>16}{'eval r':>8}"
    )
    print(header)
    print("-" * len(header))
    print(f"{'base model':<18}{'':>{len(header) - 26}}{base_reward:>8.3f}")
    for stats in results:
        wall, cpu = summary(stats, args.warmup)
        reached = seconds_to_reward(stats, threshold)
        reached_text = f"{reached[0]}, {reached[1]:.1f}" if reached else "not reached"
        print(
            f"{stats.name:<18}{wall:>8.2f}"
            f"{statistics.median(first_half(stats.step_seconds, args.warmup)):>17.2f}"
            f"{cpu:>12.2f}{sum(stats.step_seconds):>9.1f}"
            f"{f'{stats.no_signal_steps}/{len(stats.step_seconds)}':>17}{reached_text:>22}"
            f"{statistics.fmean(stats.completion_tokens):>16.1f}"
            f"{stats.rewards[-1] if stats.rewards else float('nan'):>16.3f}"
            f"{stats.eval_reward:>8.3f}"
        )
    for name, why in (missing or {}).items():
        print(f"{name:<18}  baseline missing: {why}")
    if len(results) == 2:
        ours, trl = results
        (trl_wall, trl_cpu), (our_wall, our_cpu) = (
            summary(trl, args.warmup),
            summary(ours, args.warmup),
        )
        early = statistics.median(first_half(trl.step_seconds, args.warmup)) / statistics.median(
            first_half(ours.step_seconds, args.warmup)
        )
        print(
            f"\nspeedup, TRL / ours: {trl_wall / our_wall:.2f}x per step (median), "
            f"{early:.2f}x per step in the first half, {trl_cpu / our_cpu:.2f}x in CPU time, "
            f"{sum(trl.step_seconds) / sum(ours.step_seconds):.2f}x in total time"
        )
        ours_reached, trl_reached = (
            seconds_to_reward(ours, threshold),
            seconds_to_reward(trl, threshold),
        )
        if ours_reached and trl_reached:
            print(
                f"time to a train reward >= {threshold}: {trl_reached[1] / ours_reached[1]:.2f}x "
                f"faster ({ours_reached[0]} vs {trl_reached[0]} steps)"
            )

    for stats in results:
        if stats.nothing_trained:
            reasons = "; ".join(dict.fromkeys(stats.nothing_trained))
            print(
                f"{stats.name}: {stats.no_signal_steps} of {len(stats.step_seconds)} steps trained "
                f"nothing, no checkpoint, the adapter stayed ({reasons})"
            )
        elif stats.no_signal_steps:
            print(
                f"{stats.name}: {stats.no_signal_steps} of {len(stats.step_seconds)} steps had "
                "all-equal rewards in every group (zero advantage) and still ran backward and an "
                "optimizer step"
            )

    def part(stats: RunStats, name: str) -> float:
        values = stats.parts.get(name, [])
        return statistics.median(first_half(values, args.warmup)) if values else float("nan")

    for stats in results:
        line = f"{stats.name}, first half: sampling {part(stats, 'sample'):.2f} s/step, "
        if "trainer" in stats.parts:
            line += (
                f"training {part(stats, 'trainer'):.2f} s/step + engine pause/hot-swap/bookkeeping "
                f"{part(stats, 'train') - part(stats, 'trainer'):.2f} s/step"
            )
        else:
            line += f"training {part(stats, 'train'):.2f} s/step"
        print(line)


if __name__ == "__main__":
    main()
