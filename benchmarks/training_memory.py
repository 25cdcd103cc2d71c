"""Peak memory of one GRPO step on a fixed batch: micro-batches by the memory budget vs the old
fixed token count (issue 50).

The batch is fixed and seeded: 16 rollouts (4 groups of 4) of 1 to 4 turns, each turn a
completion of 100-200 tokens and a tool result of 100-250 tokens after a 700-token task
prompt shared by the group (like an MCP agent's system prompt and tool schemas), about 14k
tokens to run. Token ids are random, the sampler's logprobs a constant; ``off_policy_mask`` is
off so that every token trains (with a constant sampler logprob the mask would drop them all).
The config is otherwise ``art_mcp.train``'s (``TrainConfig(learning_rate=1e-4)``).

Each configuration runs in its own process (a fork of one that has imported torch, peft and
art_core's trainer; a new interpreter for ``--baseline-tree``): load the model, then one
``Trainer.train_step``;
``step peak`` is the process's peak resident memory during that step (the kernel's high-water
mark, reset after loading), ``estimate`` what the trainer estimated it would be,
``proc peak`` the peak over the whole run (loading included) and ``after`` the resident
memory once the step is done (GiB throughout).

- ``baseline``: ``memory_budget="off"``: micro-batches of ``max_tokens_per_batch`` (4096)
  tokens, as before the budget. With ``--baseline-tree DIR`` the baseline runs the
  ``art_core`` of another checkout instead (e.g. ``git archive HEAD~1 | tar -x -C DIR``: the
  code before this change, whose logits path was not fused either).
- ``budget=...``: each of ``--budgets``: ``default`` (the process's share of the machine,
  ``art_core.memory``) or a size such as ``6GiB``.

Run:  python benchmarks/training_memory.py --model smollm2-135m --budgets default,6GiB
      python benchmarks/training_memory.py --model qwen2.5-coder-0.5b --budgets 6GiB
      python benchmarks/training_memory.py --smoke      (tiny-random, a small batch, seconds)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _children import in_fresh_process
from _machine import machine_line

GROUPS, PER_GROUP, MAX_TURNS = 4, 4, 4
QWEN = "qwen2.5-coder-0.5b"


def _status(key: str) -> int | None:
    match = re.search(rf"^{key}:\s+(\d+)", Path("/proc/self/status").read_text(), re.MULTILINE)
    return int(match[1]) * 1024 if match else None


def _reset_high_water_mark() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return _status("VmHWM") is not None
    except OSError:
        return False


def make_groups(vocab: int, *, prompt: int, completion: tuple[int, int], tool: tuple[int, int]):  # type: ignore[no-untyped-def]
    """The fixed batch: 4 groups x 4 rollouts, rollout k of a step has 1 + k % 4 turns."""
    from art_core.trajectories import LLMCall, Trajectory, TrajectoryGroup

    rng = random.Random(0)
    groups = []
    for g in range(GROUPS):
        task = [rng.randrange(vocab) for _ in range(prompt)]
        trajectories = []
        for r in range(PER_GROUP):
            turns = 1 + (g * PER_GROUP + r) % MAX_TURNS
            ids, calls = list(task), []
            for turn in range(turns):
                sampled = [rng.randrange(vocab) for _ in range(rng.randint(*completion))]
                calls.append(
                    LLMCall(
                        model="m",
                        messages=[],
                        index=turn,
                        prompt_token_ids=list(ids),
                        completion_token_ids=sampled,
                        logprobs=[-1.0] * len(sampled),
                    )
                )
                ids += sampled + [rng.randrange(vocab) for _ in range(rng.randint(*tool))]
            trajectories.append(Trajectory(calls=calls, reward=float(r % 2)))
        groups.append(TrajectoryGroup(trajectories))
    return groups


def _resolve(model: str) -> Path:
    from art_core.embedded import models_dir, resolve_base_model

    if model == QWEN:
        from art_core.embedded.qwen_gguf import fetch_qwen25_coder

        return resolve_base_model(str(fetch_qwen25_coder(models_dir())))
    return resolve_base_model(model)


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """One configuration in this process: what it measured, or why it was refused."""
    started = time.perf_counter()
    from art_core.training import TrainConfig, Trainer

    path = _resolve(spec["model"])
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    groups = make_groups(vocab, **spec["batch"])
    options: dict[str, Any] = {"learning_rate": 1e-4, "off_policy_mask": None}
    if spec["budget"] is not None:  # the baseline tree may not know the field
        options["memory_budget"] = spec["budget"]
    config = TrainConfig(**options)
    with tempfile.TemporaryDirectory(prefix="art-training-memory-") as folder:
        trainer = Trainer(path, Path(folder) / "model", device="cpu")
        trainer.load(config)
        loaded = _status("VmRSS") or 0
        exact = _reset_high_water_mark()
        step_started = time.perf_counter()
        try:
            result = trainer.train_step(groups, config)
        except MemoryError as exc:  # SequenceTooLargeError: refused before any forward
            checkpoints = sorted(p.name for p in Path(folder).rglob("*") if p.is_file())
            return {"refused": f"{type(exc).__name__}: {exc}", "files": checkpoints}
        step_seconds = time.perf_counter() - step_started
        step_peak = _status("VmHWM") if exact else None
        after = _status("VmRSS") or 0
    metrics = result.metrics
    process_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "loaded": loaded,
        "step_peak": step_peak or metrics.get("train/peak_memory_bytes"),
        "process_peak": process_peak,
        "after": after,
        "step_seconds": step_seconds,
        "total_seconds": time.perf_counter() - started,
        "loss": metrics["train/loss"],
        "grad_norm": metrics["train/grad_norm"],
        "micro_batches": metrics["train/num_micro_batches"],
        "token_budget": metrics.get("train/micro_batch_token_budget"),
        "checkpointing": metrics.get("train/gradient_checkpointing"),
        "budget": metrics.get("train/memory_budget_bytes"),
        "estimate": metrics.get("train/estimated_peak_memory_bytes"),
        "metric_peak": metrics.get("train/peak_memory_bytes"),
    }


def _child(spec: dict[str, Any]) -> None:
    """One configuration in this process (another checkout's, ``--baseline-tree``); prints
    ``RESULT {json}``."""
    print("RESULT " + json.dumps(measure(spec)), flush=True)


# What every configuration imports, imported once by multiprocessing's fork server: each
# configuration runs in a fork of it (fresh allocator and memory high-water mark, no 5-7 s of
# imports each).
PRELOAD = ["torch", "peft", "art_core.training"]


def _run(spec: dict[str, Any], tree: str | None) -> dict[str, Any]:
    if not tree:
        try:
            return dict(in_fresh_process(measure, spec, preload=PRELOAD))
        except RuntimeError as exc:
            raise SystemExit(f"{spec} failed:\n{exc}") from None
    env = dict(os.environ)  # the other checkout's art_core first on the path: a new interpreter
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [tree, env.get("PYTHONPATH")]))
    command = [sys.executable, __file__, "--child", json.dumps(spec)]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"{spec} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    return json.loads(line.removeprefix("RESULT "))


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**30:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m", help=f"an embedded name or {QWEN}")
    parser.add_argument("--budgets", default="default,6GiB", help="comma-separated")
    parser.add_argument("--baseline-tree", help="run the baseline on this checkout's art_core")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="tiny-random, a small batch")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(json.loads(args.child))
        return
    print(machine_line(), flush=True)  # the figures below depend on it
    batch = {"prompt": 700, "completion": (100, 200), "tool": (100, 250)}
    if args.smoke:
        args.model, args.budgets = "tiny-random", "default,2GiB,256MiB"
        batch = {"prompt": 60, "completion": (10, 20), "tool": (10, 25)}
    print(
        f"{args.model}: one GRPO step, {GROUPS * PER_GROUP} rollouts of 1-{MAX_TURNS} turns "
        f"(prompt {batch['prompt']}, completions {batch['completion']}, tool results "
        f"{batch['tool']} tokens), LoRA r8, each configuration in its own process"
    )
    runs: list[tuple[str, dict[str, Any]]] = []
    if not args.no_baseline:
        spec = {
            "model": args.model,
            "batch": batch,
            "budget": None if args.baseline_tree else "off",
        }
        label = "baseline (tree)" if args.baseline_tree else "baseline (budget off)"
        runs.append((label, _run(spec, args.baseline_tree)))
    for budget in filter(None, args.budgets.split(",")):
        spec = {
            "model": args.model,
            "batch": batch,
            "budget": None if budget == "default" else budget,
        }
        runs.append((f"budget={budget}", _run(spec, None)))
    print()
    header = (
        f"{'configuration':<22} {'budget GiB':>10} {'tokens/mb':>9} {'mbs':>4} {'ckpt':>4} "
        f"{'loaded GiB':>10} {'step peak':>9} {'estimate':>8} {'proc peak':>9} "
        f"{'after':>6} {'step s':>7} {'loss':>12}"
    )
    print(header)
    refused = [(label, r) for label, r in runs if "refused" in r]
    for label, r in runs:
        if "refused" in r:
            print(f"{label:<22} refused before any forward (see below)")
            continue
        token_budget = "-" if r["token_budget"] is None else f"{r['token_budget']:.0f}"
        checkpointing = (
            "-" if r["checkpointing"] is None else ("on" if r["checkpointing"] else "off")
        )
        print(
            f"{label:<22} {_gib(r['budget'] or None):>10} {token_budget:>9} "
            f"{r['micro_batches']:>4.0f} {checkpointing:>4} {_gib(r['loaded']):>10} "
            f"{_gib(r['step_peak']):>9} {_gib(r['estimate']):>8} {_gib(r['process_peak']):>9} "
            f"{_gib(r['after']):>6} {r['step_seconds']:>7.1f} {r['loss']:>12.8f}"
        )
    losses = [r["loss"] for _, r in runs if "refused" not in r]
    if losses:
        spread = max(losses) - min(losses)
        scale = max(abs(x) for x in losses) or 1.0
        print(f"\nloss spread across configurations: {spread:.2e} ({spread / scale:.2e} relative)")
    for label, r in refused:
        print(
            f"\n{label}: {r['refused']}\nfiles in the model folder after it: {r['files'] or 'none'}"
        )


if __name__ == "__main__":
    main()
