"""``art-core demo``: serve the embedded SmolLM2-135M-Instruct offline and talk to it.

It starts a ``LocalBackend``, registers the model (converting the GGUF once), asks a question
through the gateway with the real ``openai`` client inside a captured rollout, and prints the
answer together with what was recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import art_core as art


async def run_demo(question: str, base_model: str, path: str, max_tokens: int) -> str:
    """Ask ``question`` through the gateway; returns the answer. Example: ``art-core demo``."""
    async with art.LocalBackend(path=path) as backend:
        model = art.TrainableModel(name="demo-agent", project="demo", base_model=base_model)
        started = time.perf_counter()
        await model.register(backend)
        print(
            f"serving {base_model} at {backend.base_url} (ready in {time.perf_counter() - started:.1f} s)"
        )
        async with art.capture(model) as run:
            response = await run.openai_client().chat.completions.create(
                model=run.model_name,
                messages=[{"role": "user", "content": question}],
                temperature=0.0,
                max_tokens=max_tokens,
            )
        answer = response.choices[0].message.content or ""
        [call] = run.trajectory().calls
        print(f"\nQ: {question}\nA: {answer}\n")
        print(
            f"recorded in rollout {run.rollout_id}: {call.num_prompt_tokens} prompt tokens, "
            f"{call.num_completion_tokens} completion tokens, {call.latency_s:.2f} s, "
            f"finish_reason={call.finish_reason}"
        )
        return answer


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("demo", help="talk to the embedded model through the gateway")
    parser.add_argument(
        "--question", default="What is the capital of France? Answer in one sentence."
    )
    parser.add_argument("--base-model", default="smollm2-135m")
    parser.add_argument("--path", default=".art")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.set_defaults(
        func=lambda args: (
            asyncio.run(run_demo(args.question, args.base_model, args.path, args.max_tokens)) and 0
        )
    )
