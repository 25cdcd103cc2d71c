"""A decode step compiled over a fixed-width KV cache against ``model.generate`` and our
eager step, with compile times and the weight-read floor.

For each batch of ``--rows`` rows (prompts of different lengths, left-padded), ``--steps``
greedy decode steps of ``--base-model`` in ``--dtype`` (default: the engine's serving dtype,
``art_core.device.serving_dtype``: bf16 on CPUs that compute it natively), in ms per step:

- ``model.generate``: Hugging Face's greedy loop (``min_new_tokens`` = ``max_new_tokens``),
  timed between consecutive steps inside it (a logits processor's clock); plain weights;
- ``engine, eager``: ``TransformersEngine.generate`` (pre-packed linears, its growing cache),
  the forward part of its decode steps (``step_times``: sampling and recording excluded);
  and below the table, its whole decode step (sampling, logprobs and recording included);
- ``engine, compiled``: the same with ``TransformersEngine(compile_decode=True)`` (the
  compiled step below, dynamic shapes, over the running batch's cache), in a process with an
  empty compile cache: ``compile s`` is the engine's start (load, compile, check);
- ``fixed-width, eager``: ``CompiledDecodeStep(eager=True)`` (``engines/compiled_step.py``),
  packed linears, the step that is compiled, uncompiled;
- ``fixed-width, compiled``: the same step under ``torch.compile`` (inductor), twice: in a
  process with an empty compile cache (its first call compiles: ``compile s``) and in a
  second process on the cache the first one left (what a restart pays);
- the floor: the model's linear layers alone (pre-packed, the step's input shapes, one call
  per packed weight: merged siblings, ``packed.MergedLinears``, are one call) and the bytes of their weights over the read bandwidth of ``a.sum()`` on this
  machine: a step cannot be faster than reading its weights once.

``vs generate`` is model.generate's ms per step over the path's (goal of issue 50: >= 2x);
``same tokens`` counts the leading steps whose tokens equal model.generate's in every row
(bf16: an early near-tie can send a row elsewhere; the fp32 equality is a test,
``tests/test_compiled_step.py``). Each path runs in its own process (clean compile state,
allocator and thread pools: a fork of multiprocessing's fork server, which has only imported
torch, transformers and the engine), with torch's threads fixed at the cores this process may
use (``ART_CORE_FOLLOW_FREE_CORES=0``); the median of ``--repeats`` runs.

``--churn N``: instead, the engine eager and with ``compile_decode=True`` under churn: N
rollouts arriving over 1.5 s (seeded: prompts of 20-200 tokens, 16-160 tokens each, sampled),
so rows join the running batch and leave it at every few steps; tokens per second over the
whole burst and the forward's ms per step, the median of ``--repeats`` bursts after one to
warm up.

Usage: bash run.sh bench compiled_decode [--base-model smollm2-135m] [--rows 1,8]
                                         [--steps 64] [--repeats 3] [--dynamic]
                                         [--adapter-rank R] [--churn N]
       bash run.sh bench compiled_decode --smoke   (tiny-random, 2 rows of 8 steps, once)

``--smoke`` runs every path once, in fp32, and compiles into the art_core cache of its
environment (``compile_cache_dir()``, ``$ART_CORE_CACHE_DIR/inductor``: where the engine
compiles by default) rather than an empty one: the graphs are those the engine's tests
compile (``tests/test_engine_compiled.py``, fp32 tiny-random), so a test run compiles them
once. Its compile times are then not a cold cache's: a smoke run measures nothing.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _children import in_fresh_process
from _machine import machine_line

PATHS = {
    "generate": "model.generate",
    "engine": "engine, eager (forward)",
    "engine-compiled": "engine, compiled (forward)",
    "eager": "fixed-width, eager",
    "compiled-cold": "fixed-width, compiled (empty cache)",
    "compiled-warm": "fixed-width, compiled (warm cache)",
}
GOAL = 2.0
# Openings smollm2-135m continues for 64 greedy tokens without an end-of-text token (in fp32
# its tokens are model.generate's in every row): each row decodes every step, in every path.
TEXTS = [
    "Once upon a time, in a village at the edge of a great forest, there lived a",
    "The history of the printing press begins in",
    "Explain how a steam engine works, step by step, for a curious child who",
    "In the year 2150, the first city on Mars was founded by a small group of",
    "The three laws of thermodynamics are",
    "A recipe for bread: first, take",
    "Dear diary, today I finally",
    "The lighthouse keeper climbed the stairs and",
]


# ------------------------------------------------------------------------------ children
def prompts(tokenizer: Any, rows: int) -> list[list[int]]:
    return [tokenizer.encode(TEXTS[i % len(TEXTS)]) for i in range(rows)]


def load(spec: dict[str, Any], pack: bool) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from art_core.device import serving_dtype
    from art_core.engines.packed import pack_linears, packing_supported

    path = spec["model_path"]
    dtype = getattr(torch, spec["dtype"]) if spec.get("dtype") else serving_dtype("cpu")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    if pack and packing_supported("cpu", dtype):
        pack_linears(model)
    torch.set_grad_enabled(False)
    return model, AutoTokenizer.from_pretrained(path)


def run_generate(spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    model, tokenizer = load(spec, pack=False)
    if spec.get("adapter"):
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, spec["adapter"]).eval()
    batch = prompts(tokenizer, spec["rows"])
    longest = max(len(p) for p in batch)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.tensor([[pad] * (longest - len(p)) + p for p in batch])
    attention = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in batch])
    stamps: list[float] = []

    class Clock(LogitsProcessor):
        def __call__(self, input_ids: Any, scores: Any) -> Any:
            stamps.append(time.perf_counter())
            return scores

    def once() -> tuple[float, list[list[int]]]:
        stamps.clear()
        out = model.generate(
            input_ids=ids,
            attention_mask=attention,
            max_new_tokens=spec["steps"],
            min_new_tokens=spec["steps"],
            do_sample=False,
            pad_token_id=pad,
            logits_processor=LogitsProcessorList([Clock()]),
        )
        per_step = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
        return per_step, out[:, longest:].tolist()

    once()  # warm
    runs = [once() for _ in range(spec["repeats"])]
    return {"ms": 1000 * statistics.median(r[0] for r in runs), "tokens": runs[0][1]}


def run_engine(spec: dict[str, Any]) -> dict[str, Any]:
    import asyncio

    from transformers import AutoTokenizer

    from art_core.engines.base import GenerationRequest, SamplingParams
    from art_core.engines.step_times import StepTimes
    from art_core.engines.transformers_engine import TransformersEngine

    batch = prompts(AutoTokenizer.from_pretrained(spec["model_path"]), spec["rows"])

    async def main() -> dict[str, Any]:
        engine = TransformersEngine(
            Path(spec["model_path"]),
            prefix_cache_bytes=0,
            compile_decode=spec["compile"],
            dtype=spec.get("dtype"),
        )
        started = time.perf_counter()
        await engine.start()
        start_s = time.perf_counter() - started
        if engine.compiled_decode_off is not None:
            raise RuntimeError(f"compiled decode off: {engine.compiled_decode_off}")
        adapter = None
        if spec.get("adapter"):
            adapter = "bench"
            # Step 1: an adapter of step 0 is the base model itself (ART's numbering).
            await engine.load_adapter(Path(spec["adapter"]), 1, name=adapter)
        try:
            times = engine.step_times = StepTimes()

            async def once() -> tuple[float, list[list[int]]]:
                times.clear()
                params = SamplingParams(temperature=0.0, max_tokens=spec["steps"])
                results = await asyncio.gather(
                    *(engine.generate(GenerationRequest(list(p), params, adapter)) for p in batch)
                )
                steps = max(1, times.counts["forward"])
                whole = sum(times.seconds[part] for part in ("forward", "sample", "record"))
                tokens = [r[0].token_ids for r in results]
                return times.seconds["forward"] / steps, whole / steps, tokens

            await once()  # warm
            runs = [await once() for _ in range(spec["repeats"])]
        finally:
            await engine.close()
        return {
            "ms": 1000 * statistics.median(r[0] for r in runs),
            "whole_ms": 1000 * statistics.median(r[1] for r in runs),
            "tokens": runs[0][2],
            "compile_s": start_s if spec["compile"] else None,
        }

    return asyncio.run(main())


def run_churn(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec["churn"]`` rollouts arriving over 1.5 s, rows joining and leaving the batch."""
    import asyncio
    import random

    from art_core.engines.base import GenerationRequest, SamplingParams
    from art_core.engines.step_times import StepTimes
    from art_core.engines.transformers_engine import TransformersEngine

    async def main() -> dict[str, Any]:
        engine = TransformersEngine(
            Path(spec["model_path"]), prefix_cache_bytes=0, compile_decode=spec["compile"]
        )
        await engine.start()
        try:

            async def burst() -> tuple[float, float]:
                rng = random.Random(0)
                top = min(20000, len(engine.tokenizer))  # token ids of the vocabulary
                plan = [
                    (
                        rng.random() * 1.5,
                        [rng.randrange(3, top) for _ in range(rng.randrange(20, 200))],
                        rng.randrange(16, 160),
                    )
                    for _ in range(spec["churn"])
                ]

                async def one(i: int, delay: float, prompt: list[int], tokens: int) -> int:
                    await asyncio.sleep(delay)
                    params = SamplingParams(max_tokens=tokens, temperature=1.0, seed=i)
                    [result] = await engine.generate(GenerationRequest(prompt, params))
                    return len(result.token_ids)

                times = engine.step_times = StepTimes()
                started = time.perf_counter()
                sampled = sum(
                    await asyncio.gather(*(one(i, *rollout) for i, rollout in enumerate(plan)))
                )
                elapsed = time.perf_counter() - started
                return sampled / elapsed, times.seconds["forward"] / times.counts["forward"]

            await burst()  # warm
            runs = [await burst() for _ in range(spec["repeats"])]
        finally:
            await engine.close()
        return {
            "tokens_per_s": statistics.median(r[0] for r in runs),
            "ms": 1000 * statistics.median(r[1] for r in runs),
        }

    return asyncio.run(main())


def run_fixed_width(spec: dict[str, Any], eager: bool) -> dict[str, Any]:
    import torch

    from art_core.engines.compiled_step import MIN_WIDTH, CompiledDecodeStep

    model, tokenizer = load(spec, pack=True)
    batch = prompts(tokenizer, spec["rows"])
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    cache = Path(spec["cache_dir"]) if spec.get("cache_dir") else None
    built = time.perf_counter()
    width = spec.get("min_width") or MIN_WIDTH
    step = CompiledDecodeStep(
        model,
        pad_id=pad,
        eager=eager,
        cache_dir=cache,
        min_width=width,
        dynamic=bool(spec.get("dynamic")),
    )
    if spec.get("adapter"):
        from art_core.engines.lora import read_adapter

        deltas = read_adapter(Path(spec["adapter"])).deltas
        step.use_adapter(
            {k: (a.t().contiguous(), b.t().contiguous()) for k, (a, b) in deltas.items()}
        )
    built = time.perf_counter() - built

    def once() -> tuple[float, list[list[int]]]:
        tokens = [step.prefill(batch).argmax(-1)]
        started = time.perf_counter()
        for _ in range(spec["steps"] - 1):
            tokens.append(step.decode(tokens[-1]).argmax(-1))
        per_step = (time.perf_counter() - started) / (spec["steps"] - 1)
        return per_step, torch.stack(tokens, dim=1).tolist()

    once()  # warm: compiles each bucket it meets
    runs = [once() for _ in range(spec["repeats"])]
    return {
        "ms": 1000 * statistics.median(r[0] for r in runs),
        "tokens": runs[0][1],
        "compile_s": None if eager else built + sum(step.compile_seconds.values()),
        "buckets": [list(k) for k in step.compile_seconds],
    }


def run_floor(spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    from torch import nn

    from art_core.engines.packed import base_linear

    model, _ = load(spec, pack=True)
    linears = [m for m in model.modules() if type(m) is nn.Linear]
    weight_bytes = sum(m.weight.numel() * m.weight.element_size() for m in linears)
    # Read bandwidth: a sum over a buffer far larger than the caches, best of five.
    buffer = torch.ones(256 * 2**20, dtype=torch.bfloat16)  # 512 MiB
    buffer.sum()
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - started)
    bandwidth = buffer.numel() * buffer.element_size() / best
    del buffer
    out = {"linears": len(linears), "weight_bytes": weight_bytes, "bandwidth": bandwidth}
    # One call per packed weight: a group of merged siblings (``packed.MergedLinears``) is one.
    calls: dict[int, Any] = {}
    for linear in linears:
        merged = linear.__dict__.get("_art_merged")
        if merged is not None:
            calls.setdefault(id(merged[0]), (merged[0].compute, linear.in_features))
        else:
            calls[id(linear)] = (functools.partial(base_linear, linear), linear.in_features)
    out["calls"] = len(calls)
    dtype = linears[0].weight.dtype
    for rows in spec["rows_list"]:
        inputs = [torch.randn(rows, 1, size, dtype=dtype) for _, size in calls.values()]

        def one_pass(inputs: list[torch.Tensor] = inputs) -> None:
            for (call, _), x in zip(calls.values(), inputs, strict=True):
                call(x)

        one_pass()
        passes = []
        for _ in range(max(3, spec["repeats"] * 3)):
            started = time.perf_counter()
            one_pass()
            passes.append(time.perf_counter() - started)
        out[f"linears_ms_{rows}"] = 1000 * statistics.median(passes)
    return out


def child(spec: dict[str, Any]) -> dict[str, Any]:
    from art_core.device import use_cpu_threads

    use_cpu_threads()
    path = spec["path"]
    if path == "generate":
        return run_generate(spec)
    if path == "engine":
        return run_engine(spec)
    if path == "floor":
        return run_floor(spec)
    if path == "churn":
        return run_churn(spec)
    return run_fixed_width(spec, eager=path == "eager")


# -------------------------------------------------------------------------------- parent
# What every path imports, imported once by multiprocessing's fork server: each path's process
# is a fork of it (no ~4 s of imports per path), fresh otherwise (no compile state, thread
# pool or allocator of another path's; the server runs nothing but these imports).
PRELOAD = ["torch", "transformers.modeling_layers", "art_core.engines.transformers_engine"]
# One path's run: past this it hangs.
CHILD_TIMEOUT_S = 1800.0


def spawn(spec: dict[str, Any]) -> dict[str, Any]:
    """One path in its own process (forked from the fork server); its result."""
    environment = {"ART_CORE_FOLLOW_FREE_CORES": "0"}
    if spec.get("cache_home"):  # the engine compiles into $ART_CORE_CACHE_DIR/inductor
        environment["ART_CORE_CACHE_DIR"] = spec["cache_home"]
    try:
        result = in_fresh_process(
            child, spec, preload=PRELOAD, environment=environment, timeout_s=CHILD_TIMEOUT_S
        )
    except RuntimeError as exc:
        raise RuntimeError(f"{spec['path']}: {exc}") from None
    return dict(result)


def same_tokens(tokens: list[list[int]], reference: list[list[int]]) -> int:
    """Leading steps at which every row has the reference's token."""
    steps = min(len(row) for row in [*tokens, *reference])
    for i in range(steps):
        if any(mine[i] != theirs[i] for mine, theirs in zip(tokens, reference, strict=True)):
            return i
    return steps


def save_adapter(model_path: str, folder: Path, rank: int) -> str:
    """A LoRA adapter of ``rank`` on every projection of the model, its B factors random
    (peft starts them at zero: an adapter that changes nothing), seeded."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_path), config)
    for name, parameter in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.02)
    model.save_pretrained(folder)
    return str(folder)


def main_churn(args: argparse.Namespace, model_path: str) -> None:
    with tempfile.TemporaryDirectory(prefix="compiled-decode-") as folder:
        spec = {"model_path": model_path, "repeats": args.repeats, "churn": args.churn}
        spec["path"], spec["cache_home"] = "churn", folder
        eager = spawn({**spec, "compile": False})
        compiled = spawn({**spec, "compile": True})
    print(
        f"\n{args.base_model}: {args.churn} rollouts arriving over 1.5 s, 16-160 tokens each, "
        f"median of {args.repeats} bursts"
    )
    print("| engine | tokens/s | forward ms/step |\n|---|---|---|")
    for label, result in (("eager", eager), ("compile_decode=True", compiled)):
        print(f"| {label} | {result['tokens_per_s']:.1f} | {result['ms']:.2f} |")
    ratio = compiled["tokens_per_s"] / eager["tokens_per_s"]
    print(f"compiled vs eager: {ratio:.2f}x tokens/s, {eager['ms'] / compiled['ms']:.2f}x a step")


def main(args: argparse.Namespace) -> None:
    from art_core.device import serving_dtype
    from art_core.embedded import resolve_base_model
    from art_core.files import cache_dir as art_core_cache_dir

    print(machine_line())
    model_path = str(resolve_base_model(args.base_model))
    if args.churn:
        main_churn(args, model_path)
        return
    levels = [int(x) for x in args.rows.split(",")]
    base = {
        "model_path": model_path,
        "steps": args.steps,
        "repeats": args.repeats,
        "dynamic": args.dynamic,
        "dtype": args.dtype,
    }
    results: dict[tuple[int, str], dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="compiled-decode-") as folder:
        if args.adapter_rank:
            base["adapter"] = save_adapter(model_path, Path(folder) / "adapter", args.adapter_rank)
        for rows in levels:
            cache = str(Path(folder) / f"inductor-{rows}")  # empty: the first process compiles
            engine_home = Path(folder) / f"engine-{rows}"  # empty too
            if args.smoke:
                # The environment's cache for every path (see the module): each path still
                # runs and compiles, what the engine's tests or another path compiled it finds.
                engine_home = art_core_cache_dir()
                cache = str(engine_home / "inductor")
            for path in PATHS:
                spec = {
                    **base,
                    "path": path.split("-")[0],
                    "rows": rows,
                    "cache_dir": cache,
                    "compile": path == "engine-compiled",
                    "cache_home": str(engine_home),
                }
                results[(rows, path)] = spawn(spec)
        floor = spawn({**base, "path": "floor", "rows_list": levels})
    dtype = args.dtype or str(serving_dtype("cpu")).removeprefix("torch.")
    print(
        f"\n{args.base_model}, {dtype}, "
        + (
            f"a rank-{args.adapter_rank} LoRA adapter on every projection, "
            if args.adapter_rank
            else ""
        )
        + ("dynamic shapes (one graph for every bucket), " if args.dynamic else "")
        + f"{args.steps} greedy decode steps, median of "
        f"{args.repeats} runs; ms per decode step"
    )
    head = ["rows", "path", "ms/step", "vs generate", "compile s", "same tokens"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    best: dict[int, float] = {}
    for rows in levels:
        reference = results[(rows, "generate")]
        for path, label in PATHS.items():
            result = results[(rows, path)]
            ratio = reference["ms"] / result["ms"]
            if "compiled" in path:
                best[rows] = max(best.get(rows, 0.0), ratio)
            compile_s = result.get("compile_s")
            same = same_tokens(result["tokens"], reference["tokens"])
            print(
                f"| {rows} | {label} | {result['ms']:.2f} | {ratio:.2f}x | "
                f"{'-' if compile_s is None else f'{compile_s:.1f}'} | {same}/{args.steps} |"
            )
        linears = floor[f"linears_ms_{rows}"]
        print(
            f"| {rows} | {floor['linears']} linears alone ({floor['calls']} calls) | "
            f"{linears:.2f} | - | - | - |"
        )
        floor_ms = 1000 * floor["weight_bytes"] / floor["bandwidth"]
        print(
            f"| {rows} | weights read once ({floor['weight_bytes'] / 1e6:.3g} MB at "
            f"{floor['bandwidth'] / 1e9:.0f} GB/s) | {floor_ms:.2f} | - | - | - |"
        )
    for rows in levels:
        for path in ("engine", "engine-compiled"):
            result = results[(rows, path)]
            ratio = results[(rows, "generate")]["ms"] / result["whole_ms"]
            print(
                f"{PATHS[path].split(' (')[0]} at {rows} rows, whole decode step (forward, "
                f"sampling, logprobs, recording): {result['whole_ms']:.2f} ms, {ratio:.2f}x "
                "model.generate"
            )
    for rows in levels:
        verdict = "meets" if best[rows] >= GOAL else "misses"
        print(f"compiled at {rows} rows: {best[rows]:.2f}x model.generate: {verdict} {GOAL}x")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-model", default="smollm2-135m")
    parser.add_argument("--rows", default="1,8", help="batch sizes, comma-separated")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--dynamic",
        action="store_true",
        help="compile one graph for every bucket (dynamic shapes), not one per bucket",
    )
    parser.add_argument(
        "--adapter-rank",
        type=int,
        default=0,
        help="serve a LoRA adapter of this rank on every projection, in every path (0: none)",
    )
    parser.add_argument(
        "--churn",
        type=int,
        default=0,
        help="instead: this many rollouts arriving over 1.5 s, eager vs compiled engine",
    )
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        help="the weights' dtype in every path (default: the engine's serving dtype)",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="tiny-random, 2 rows, 8 steps, fp32 (see above)"
    )
    args = parser.parse_args()
    if args.smoke:
        args.base_model, args.rows, args.steps, args.repeats = "tiny-random", "2", 8, 1
        args.dtype = "float32"
    return args


if __name__ == "__main__":
    main(parse_args())
