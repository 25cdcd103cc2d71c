"""A model folder trained for real for the viewer's tests: tiny-random agents that call a
tool, read its result and answer, scored by which city they asked about, trained a few GRPO
steps (with a validation pass), and the viewer served over it on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from starlette.types import ASGIApp

import art_core as art
from art_core.testing.loopback import LoopbackServer
from art_core.testing.tools import WEATHER_TOOL
from art_core.training import TrainConfig
from art_core.ui import build_ui_app

PROMPTS = ["What is the weather in Paris?", "Is it sunny in Lima?"]
GROUP_SIZE = 4
CONFIG = TrainConfig(learning_rate=1e-3, precision="fp32")


class ViewerServer(LoopbackServer):
    """``build_ui_app(path)`` on loopback (optionally behind ``wrap``)."""

    def __init__(self, path: Path, wrap=None) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.path, self.wrap = path, wrap

    def app(self) -> ASGIApp:
        app = build_ui_app(self.path)
        return self.wrap(app) if self.wrap else app


async def tool_rollout(model: art.TrainableModel, prompt: str, seed: int) -> art.Trajectory:
    """Two calls: a forced tool call, then an answer after the tool's result."""
    async with art.capture(model, metadata={"scenario_id": prompt, "task": prompt}) as run:
        client = run.openai_client()
        messages: list[dict] = [
            {"role": "system", "content": "Answer with the weather tool."},
            {"role": "user", "content": prompt},
        ]
        first = await client.chat.completions.create(
            model=run.model_name,
            messages=messages,  # type: ignore[arg-type]
            tools=[WEATHER_TOOL],  # type: ignore[list-item]
            tool_choice="required",
            parallel_tool_calls=False,
            # What an integration adds to every call (here as LangGraph's node would be).
            extra_headers={"x-art-metadata": json.dumps({"langgraph_node": "agent"})},
            max_tokens=64,
            temperature=1.0,
            seed=seed,
        )
        message = first.choices[0].message
        tool_call = message.tool_calls[0]  # type: ignore[index]
        city = json.loads(tool_call.function.arguments)["city"]  # type: ignore[union-attr]
        messages += [
            message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": tool_call.id, "content": f"Sunny in {city}, 21 C."},
        ]
        await client.chat.completions.create(
            model=run.model_name,
            messages=messages,  # type: ignore[arg-type]
            tools=[WEATHER_TOOL],  # type: ignore[list-item]
            tool_choice="none",
            max_tokens=6,
            temperature=1.0,
            seed=seed + 1,
        )
    return run.trajectory(reward=1.0 if city in prompt else 0.0)


async def sample(model: art.TrainableModel, step: int) -> list[art.TrajectoryGroup]:
    """One group of ``GROUP_SIZE`` rollouts per prompt (seeded by step and position)."""
    return await art.gather_trajectory_groups(
        (
            art.TrajectoryGroup(
                tool_rollout(model, prompt, seed=1000 * step + 10 * p + i)
                for i in range(GROUP_SIZE)
            )
            for p, prompt in enumerate(PROMPTS)
        ),
        pbar_desc=None,
    )


async def train_steps(model: art.TrainableModel, steps: int) -> None:
    """``steps`` GRPO steps from the model's current step, then a validation pass."""
    for _ in range(steps):
        step = await model.get_step()
        await model.train(await sample(model, step), config=CONFIG)
    step = await model.get_step()
    await model.log(await sample(model, 10_000 + step), split="val")


def start_ui(args: list[str]) -> tuple[subprocess.Popen[str], list[str]]:
    """``art-core ui ARGS --port 0`` as a real process, once it printed the address to open
    (``$ART_CORE_TOKEN`` unset): the process and the lines it printed."""
    process = subprocess.Popen(
        [sys.executable, "-m", "art_core.cli", "ui", *args, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "ART_CORE_TOKEN"},
    )
    assert process.stdout is not None
    lines: list[str] = []
    for line in process.stdout:
        lines.append(line.strip())
        if line.startswith("art-core ui: open "):
            return process, lines
    process.wait(10)
    raise AssertionError("art-core ui did not start:\n" + "\n".join(lines))


def stop_ui(process: subprocess.Popen[str]) -> str:
    """SIGTERM ``art-core ui`` and wait for it: what it printed after starting (its log,
    stderr included), its pipe read to the end and closed."""
    process.terminate()
    try:
        rest, _ = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        rest, _ = process.communicate()
    return rest
