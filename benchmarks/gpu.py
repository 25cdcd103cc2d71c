"""GPU benchmark on randomly initialised Qwen2.5-shaped models (``benchmarks/gpu_models.py``).

Prints, with the GPU, torch and transformers versions:
  1. decode tokens/s through the gateway (``LocalBackend``: capture + the openai client, the
     usual rollout path) at 1/8/32/128 concurrent rollouts on the 0.5B-shaped model, beside
     plain ``model.generate`` on the same batch (same prompt, same rows, same token count):
     the ratio gateway / generate (goal: >= 3x at 32), and the speedup over one rollout;
  2. a GRPO step's split: sample (gather the groups), train (the trainer's own seconds) and
     swap (pause, hot-swap of the adapter, bookkeeping: ``model.train``'s wall time less the
     trainer's);
  3. peak GPU memory of each part;
  4. the same decode and GRPO step on the 7B-shaped model, when ``--budget-s`` leaves time.

Random weights sample near-uniformly over the real vocabulary, so each answer runs to its
``max_tokens``: every rollout decodes the same number of tokens.

``--smoke`` runs every code path on the CPU at tiny size (hidden 64, 2 layers, the real
vocabulary) in about a minute; a run without CUDA and without ``--smoke`` stops with an error.

Usage: python benchmarks/gpu.py [--smoke] [--out DIR] [--budget-s 300] [--work /tmp/art-gpu]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from _machine import machine_line
from gpu_models import build_model

import art_core as art
from art_core.training import TrainConfig

PROMPT = "Write a long story about a lighthouse keeper."
GOAL_RATIO = 3.0
GOAL_LEVEL = 32


@dataclass(frozen=True)
class Plan:
    """What one run measures: its sizes, levels and token counts."""

    tiny: bool
    levels: tuple[int, ...]
    max_tokens: int
    grpo_prompts: int
    grpo_group: int
    grpo_tokens: int
    grpo_steps: int
    big_level: int
    big_tokens: int
    # Whether the 7B part also times model.generate (on a GPU: a third load of 15 GB).
    big_baseline: bool
    # Seconds the 7B part needs (build, two loads, decode, a step); skipped when less is left.
    big_seconds: float


GPU_PLAN = Plan(False, (1, 8, 32, 128), 128, 4, 8, 128, 3, 32, 64, False, 200.0)
SMOKE_PLAN = Plan(True, (1, 4), 8, 2, 4, 8, 2, 4, 8, True, 0.0)


@dataclass
class Report:
    """Every number of the run (written as JSON), and the table's lines."""

    device: str
    versions: dict[str, str]
    decode: list[dict[str, Any]] = field(default_factory=list)
    grpo: list[dict[str, Any]] = field(default_factory=list)
    memory_gib: dict[str, float] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def versions(device: str) -> dict[str, str]:
    """torch, CUDA, transformers and the GPU's name."""
    import transformers

    found = {"torch": torch.__version__, "transformers": transformers.__version__}
    found["cuda"] = str(torch.version.cuda)
    if device == "cuda":
        found["gpu"] = torch.cuda.get_device_name(0)
    return found


def reset_peak(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def peak_gib(device: str) -> float:
    """The peak GPU memory allocated since ``reset_peak`` (0 on CPU)."""
    return torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else 0.0


def free_memory(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


async def rollout(model: art.TrainableModel, max_tokens: int, seed: int) -> art.Trajectory:
    """One rollout through the gateway; its reward is random (the step's cost is the same
    whatever the rewards, and random ones always give the group a signal)."""
    async with art.capture(model) as run:
        response = await run.openai_client().chat.completions.create(
            model=run.model_name,
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=max_tokens,
            temperature=1.0,
            seed=seed,
        )
    tokens = response.usage.completion_tokens if response.usage else 0
    return run.trajectory(reward=random.Random(seed).random(), metrics={"tokens": tokens})


async def gateway_tokens_per_s(model: art.TrainableModel, rows: int, max_tokens: int) -> float:
    """Decode tokens/s of ``rows`` concurrent rollouts through the gateway."""
    started = time.perf_counter()
    done = await asyncio.gather(*(rollout(model, max_tokens, seed) for seed in range(rows)))
    elapsed = time.perf_counter() - started
    return sum(t.metrics["tokens"] for t in done) / elapsed


def generate_tokens_per_s(folder: Path, device: str, rows: int, max_tokens: int) -> float:
    """Decode tokens/s of plain ``model.generate`` on ``rows`` copies of the same prompt."""
    from transformers import AutoTokenizer

    tokenizer: Any = AutoTokenizer.from_pretrained(folder)
    model = _generate_model(folder, device)
    prompt: Any = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True, return_tensors="pt"
    )
    ids = (prompt["input_ids"] if hasattr(prompt, "keys") else prompt).to(device)
    batch = ids.repeat(rows, 1)
    # Every row samples exactly max_tokens tokens (the engine's random-weight rows do too).
    settings: dict[str, Any] = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0)
    settings |= dict(max_new_tokens=max_tokens, min_new_tokens=max_tokens)
    pad = tokenizer.pad_token_id
    with torch.inference_mode():
        model.generate(batch, attention_mask=torch.ones_like(batch), pad_token_id=pad, **settings)
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        out = model.generate(
            batch, attention_mask=torch.ones_like(batch), pad_token_id=pad, **settings
        )
        if device == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - started
    return (out.shape[0] * (out.shape[1] - batch.shape[1])) / elapsed


_loaded: dict[tuple[str, str], Any] = {}


def _generate_model(folder: Path, device: str) -> Any:
    """The baseline's model, loaded once per folder (in the engine's dtype)."""
    from transformers import AutoModelForCausalLM

    from art_core.device import serving_dtype

    key = (str(folder), device)
    if key not in _loaded:
        _loaded.clear()
        free_memory(device)
        dtype = serving_dtype(device)
        model: Any = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
        _loaded[key] = model.to(device).eval()
    return _loaded[key]


async def decode_part(
    backend: art.LocalBackend,
    model: art.TrainableModel,
    name: str,
    levels: tuple[int, ...],
    max_tokens: int,
    report: Report,
) -> None:
    """Gateway tokens/s at each level (a warm-up at the largest first)."""
    await gateway_tokens_per_s(model, max(levels), min(8, max_tokens))
    for rows in levels:
        tps = await gateway_tokens_per_s(model, rows, max_tokens)
        report.decode.append({"model": name, "rows": rows, "tokens": max_tokens, "gateway": tps})
        print(f"  {name}: {rows:>4} rollouts x {max_tokens} tokens: {tps:9.1f} tok/s (gateway)")


def baseline_part(folder: Path, device: str, name: str, report: Report) -> None:
    """``model.generate`` on the same batches as the gateway rows of ``name``."""
    for row in report.decode:
        if row["model"] == name:
            row["generate"] = generate_tokens_per_s(folder, device, row["rows"], row["tokens"])
            print(f"  {name}: {row['rows']:>4} rows: {row['generate']:9.1f} tok/s (generate)")
    _loaded.clear()
    free_memory(device)


async def grpo_part(
    model: art.TrainableModel,
    name: str,
    plan: Plan,
    steps: int,
    report: Report,
) -> None:
    """GRPO steps timed as sample / train / swap."""
    config = TrainConfig(learning_rate=1e-5)
    for step in range(steps):
        started = time.perf_counter()
        groups = await art.gather_trajectory_groups(
            (
                art.TrajectoryGroup(
                    rollout(model, plan.grpo_tokens, 10_000 * step + 100 * p + i)
                    for i in range(plan.grpo_group)
                )
                for p in range(plan.grpo_prompts)
            ),
            pbar_desc=None,
        )
        sampled = time.perf_counter()
        result = await model.train(groups, config=config)
        done = time.perf_counter()
        trainer = float(result.metrics.get("train/seconds", done - sampled))
        row = {
            "model": name,
            "step": result.step,
            "rollouts": plan.grpo_prompts * plan.grpo_group,
            "tokens": plan.grpo_tokens,
            "sample_s": sampled - started,
            "train_s": trainer,
            "swap_s": max(0.0, done - sampled - trainer),
            "trained": result.nothing_trained is None,
        }
        report.grpo.append(row)
        print(
            f"  {name} step {row['step']}: sample {row['sample_s']:.2f} s, train "
            f"{row['train_s']:.2f} s, swap {row['swap_s']:.2f} s"
        )


async def model_part(
    name: str,
    plan: Plan,
    levels: tuple[int, ...],
    tokens: int,
    steps: int,
    baseline: bool,
    args: Any,
    report: Report,
) -> None:
    """Build ``name``, then its decode, GRPO and baseline parts, with their peak memory."""
    device = report.device
    started = time.perf_counter()
    target = args.work / "models" / (name + ("-tiny" if plan.tiny else ""))
    folder = build_model(name, target, device=device, tiny=plan.tiny, art_path=args.work)
    report.seconds[f"{name} build"] = time.perf_counter() - started
    free_memory(device)
    reset_peak(device)
    # A fresh .art folder: each run's GRPO steps start at step 1.
    art_path = Path(tempfile.mkdtemp(prefix="art-", dir=args.work))
    async with art.LocalBackend(
        path=art_path, engine="transformers", device=device, max_batch_size=max(levels)
    ) as backend:
        model = art.TrainableModel(
            name=name.replace(".", "-"), project="gpu", base_model=str(folder)
        )
        await model.register(backend)
        await decode_part(backend, model, name, levels, tokens, report)
        report.memory_gib[f"{name} serving"] = peak_gib(device)
        reset_peak(device)
        await grpo_part(model, name, plan, steps, report)
        report.memory_gib[f"{name} serving + training"] = peak_gib(device)
    shutil.rmtree(art_path, ignore_errors=True)
    free_memory(device)
    if baseline:
        reset_peak(device)
        baseline_part(folder, device, name, report)
        report.memory_gib[f"{name} generate"] = peak_gib(device)
    report.seconds[name] = time.perf_counter() - started


def table(report: Report) -> str:
    """The report as a plain-text table."""
    lines = [
        f"GPU benchmark on {report.device}: "
        + ", ".join(f"{k} {v}" for k, v in report.versions.items())
    ]
    lines.append("")
    lines.append(
        f"{'decode':<16}{'rollouts':>9}{'tokens':>7}{'gateway tok/s':>15}{'generate tok/s':>16}{'ratio':>8}{'vs 1':>7}"
    )
    for row in report.decode:
        alone = next(r["gateway"] for r in report.decode if r["model"] == row["model"])
        gen = row.get("generate", 0.0)
        ratio = row["gateway"] / gen if gen else float("nan")
        goal = "  (goal >= 3x)" if row["rows"] == GOAL_LEVEL else ""
        lines.append(
            f"{row['model']:<16}{row['rows']:>9}{row['tokens']:>7}{row['gateway']:>15.1f}"
            f"{gen:>16.1f}{ratio:>7.2f}x{row['gateway'] / alone:>6.1f}x{goal}"
        )
    lines.append("")
    lines.append(
        f"{'GRPO step':<16}{'step':>5}{'rollouts':>9}{'tokens':>7}{'sample s':>10}{'train s':>9}{'swap s':>8}"
    )
    for row in report.grpo:
        lines.append(
            f"{row['model']:<16}{row['step']:>5}{row['rollouts']:>9}{row['tokens']:>7}"
            f"{row['sample_s']:>10.2f}{row['train_s']:>9.2f}{row['swap_s']:>8.2f}"
        )
    lines.append("")
    lines.append(f"{'peak GPU memory':<40}{'GiB':>8}")
    lines += [f"{part:<40}{gib:>8.2f}" for part, gib in report.memory_gib.items()]
    lines.append("")
    lines += [f"{part:<40}{s:>8.1f} s" for part, s in report.seconds.items()]
    lines += [f"note: {note}" for note in report.notes]
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> Report:
    plan = SMOKE_PLAN if args.smoke else GPU_PLAN
    device = "cpu" if args.smoke else "cuda"
    report = Report(device=device, versions=versions(device))
    deadline = time.perf_counter() + args.budget_s
    print(f"small model ({device}):")
    await model_part(
        "qwen2.5-0.5b", plan, plan.levels, plan.max_tokens, plan.grpo_steps, True, args, report
    )
    left = deadline - time.perf_counter()
    if left < plan.big_seconds:
        report.notes.append(f"qwen2.5-7b skipped: {left:.0f} s of the budget left")
    else:
        print(f"large model ({device}):")
        big = (plan.big_level,)
        baseline = plan.big_baseline
        await model_part("qwen2.5-7b", plan, big, plan.big_tokens, 1, baseline, args, report)
    report.seconds["total"] = args.budget_s - (deadline - time.perf_counter())
    return report


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU")
    parser.add_argument("--out", type=Path, help="write bench.txt and bench.json here")
    parser.add_argument("--work", type=Path, default=Path("/tmp/art-gpu"), help="models, .art")
    parser.add_argument(
        "--budget-s", type=float, default=300.0, help="skip the 7B part past this many seconds"
    )
    args = parser.parse_args()
    print(machine_line(), flush=True)  # the figures below depend on it
    if not args.smoke and not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --smoke for the CPU version")
    report = asyncio.run(run(args))
    text = table(report)
    print("\n" + text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench.txt").write_text(text + "\n")
        (args.out / "bench.json").write_text(json.dumps(asdict(report), indent=1) + "\n")


if __name__ == "__main__":
    main()
