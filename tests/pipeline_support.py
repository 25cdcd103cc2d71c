"""The digits task (tests/test_training_learning.py) as a pipeline: scenarios, rollout, checks.

Runnable as a script too (``python pipeline_support.py ART_PATH STEPS``): the kill-and-resume
test runs it in a process of its own and kills it.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from collections.abc import Iterator
from pathlib import Path

import art_core as art
from art_core.model_folder import ModelFolder
from art_core.training import DEFAULT_LORA_TARGET_MODULES, TrainConfig

PROMPTS = [
    "What is 12 times 7?",
    "How many days are in a leap year?",
    "Give me a number between 1 and 9.",
    "What year comes after 1999?",
]
CONFIG = TrainConfig(
    learning_rate=3e-2,
    lora_target_modules=(*DEFAULT_LORA_TARGET_MODULES, "lm_head"),
    precision="fp32",
    truncated_importance_sampling=2.0,
)


def scenarios() -> Iterator[dict[str, object]]:
    """An endless stream: prompts in turn, each with its own sampling seed."""
    for index in itertools.count():
        yield {"index": index, "prompt": PROMPTS[index % len(PROMPTS)], "seed": 1000 * index}


def digit_fraction(text: str) -> float:
    chars = [c for c in text if not c.isspace()]
    return sum(c.isdigit() for c in chars) / len(chars) if chars else 0.0


async def rollout(model: art.TrainableModel, scenario: dict[str, object]) -> art.Trajectory:
    async with art.capture(model, metadata={"scenario": scenario["index"]}) as run:
        response = await run.openai_client().chat.completions.create(
            model=run.model_name,
            messages=[{"role": "user", "content": str(scenario["prompt"])}],
            max_tokens=6,
            temperature=1.0,
        )
    return run.trajectory(reward=digit_fraction(response.choices[0].message.content or ""))


def trained_groups(folder: ModelFolder) -> dict[int, list[art.TrajectoryGroup]]:
    """The groups each step trained on, by the step that was trained on (file name)."""
    steps = sorted(int(p.stem) for p in (folder / "trajectories" / "train").glob("*.jsonl"))
    return {step: folder.read_trajectories("train", step) for step in steps}


async def run_pipeline(path: Path, max_steps: int) -> None:
    async with art.LocalBackend(path=path) as backend:
        model = art.TrainableModel(name="digits", project="pipeline", base_model="tiny-random")
        await model.register(backend)
        trainer = art.PipelineTrainer(
            model,
            rollout,
            scenarios(),
            group_size=8,
            groups_per_step=4,
            max_steps_off_policy=1,
            max_steps=max_steps,
            train_config=CONFIG,
            progress=False,
        )
        await trainer.train()


if __name__ == "__main__":
    asyncio.run(run_pipeline(Path(sys.argv[1]), int(sys.argv[2])))
