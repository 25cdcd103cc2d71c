"""End to end on a real training run: tiny-random learns to answer in digits (the trainer's
learning task) with tracing and W&B on; every train step is a span with its metrics, linked to
the rollouts it trained on; W&B (offline) gets the history; ``art-core plot`` on the model
folder draws a reward curve that rises."""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tracing_support import roots, wait_for_wandb_history

import art_core as art
from art_core import metrics, tracing
from art_core.cli import main
from art_core.training import DEFAULT_LORA_TARGET_MODULES, TrainConfig

PROMPTS = [
    "What is 12 times 7?",
    "How many days are in a leap year?",
    "Give me a number between 1 and 9.",
    "What year comes after 1999?",
]
GROUP_SIZE = 8
# Room to learn: the loop stops at TARGET (usually within 12 steps); a slow but rising run
# still gets there instead of failing on the luck of its samples.
MAX_STEPS = 25
TARGET = 0.5
CONFIG = TrainConfig(
    learning_rate=2e-2,
    # tiny-random's frozen head caps how far the projections can move a logit (see
    # test_training_learning.py): the LoRA also targets lm_head.
    lora_target_modules=(*DEFAULT_LORA_TARGET_MODULES, "lm_head"),
    precision="fp32",
)


def digit_share(text: str) -> float:
    """The reward: up to 6 digits in the answer, as a fraction of 6."""
    return min(sum(c.isdigit() for c in text), 6) / 6


async def rollout(model: art.TrainableModel, prompt: str, seed: int) -> art.Trajectory:
    async with art.capture(model, metadata={"prompt": prompt}) as run:
        response = await run.openai_client().chat.completions.create(
            model=run.model_name,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=6,
            temperature=1.0,
            seed=seed,  # a fixed sampling schedule: the run is the same every time
        )
    return run.trajectory(reward=digit_share(response.choices[0].message.content or ""))


def mean(groups: list[art.TrajectoryGroup]) -> float:
    rewards = [t.reward for g in groups for t in g]
    return sum(rewards) / len(rewards)


@pytest.mark.slow
async def test_a_traced_training_run_plots_a_rising_reward_curve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path),
        "WANDB_SILENT": "true",
        "WANDB_CONSOLE": "off",
    }.items():
        monkeypatch.setenv(name, value)
    memory = InMemorySpanExporter()
    tracing.enable(memory)
    # dir/mode as arguments: W&B reads its environment once per process (an earlier test's
    # WANDB_DIR would win).
    metrics.enable_wandb(mode="offline", dir=str(tmp_path))
    try:
        async with art.LocalBackend(path=tmp_path / "art") as backend:
            model = art.TrainableModel(name="digits", project="tracing", base_model="tiny-random")
            await model.register(backend)
            rewards, steps = [], 0
            while True:
                groups = await art.gather_trajectory_groups(
                    (
                        art.TrajectoryGroup(
                            rollout(model, prompt, seed=1000 * steps + GROUP_SIZE * p + i)
                            for i in range(GROUP_SIZE)
                        )
                        for p, prompt in enumerate(PROMPTS)
                    ),
                    pbar_desc=None,
                )
                rewards.append(mean(groups))
                if rewards[-1] >= TARGET or steps == MAX_STEPS:
                    break
                await model.train(groups, config=CONFIG)
                steps += 1
            await model.log(groups, split="val")
        assert tracing.flush(30)
    finally:
        tracing.disable()
        metrics.disable_wandb(60)
    curve = " ".join(f"{r:.2f}" for r in rewards)
    assert rewards[-1] >= TARGET, f"mean reward per step: {curve}"

    # A span per train step with its metrics, linked to the rollouts it trained on.
    spans = memory.get_finished_spans()
    train_spans = sorted(
        (s for s in spans if s.name == "train_step digits"),
        key=lambda s: s.attributes["art.train.step"],
    )
    assert [s.attributes["art.train.step"] for s in train_spans] == list(range(1, steps + 1))
    rollout_contexts = {s.context.span_id for s in roots(spans)}
    for span, reward in zip(train_spans, rewards, strict=False):
        assert span.attributes["art.train.reward"] == pytest.approx(reward)
        assert (
            "art.train.loss" in span.attributes
            and span.attributes["art.train.config.learning_rate"] == 2e-2
        )
        assert len(span.links) == len(PROMPTS) * GROUP_SIZE
        assert {link.context.span_id for link in span.links} <= rollout_contexts
    # Each rollout traced once, served by the adapter of its step.
    assert len(roots(spans)) == len(rewards) * len(PROMPTS) * GROUP_SIZE
    assert {s.attributes["art.adapter_step"] for s in roots(spans)} == set(range(steps + 1))

    # W&B got the same history as history.jsonl.
    rows = wait_for_wandb_history(tmp_path, lambda rows: any("val/reward" in r for r in rows))
    logged = [float(r["train/reward"]) for r in rows if "train/reward" in r]
    assert logged == pytest.approx(rewards[:-1]), [
        (r.get("_step"), r.get("train/reward"), r.get("val/reward")) for r in rows
    ]

    # art-core plot on the model folder: the reward curve rises.
    model_dir = tmp_path / "art" / "tracing" / "models" / "digits"
    assert main(["plot", str(model_dir)]) == 0
    png = model_dir / "plots" / "reward.png"
    assert png.read_bytes()[:4] == b"\x89PNG"
    from art_core.metrics.plot import plot_history

    series = plot_history(model_dir).series
    train = [value for _, value in series["train/reward"]]
    assert train == pytest.approx(rewards[:-1])
    assert series["val/reward"][-1][1] == pytest.approx(rewards[-1])
    assert series["val/reward"][-1][1] > train[0] + 0.3, f"reward curve: {curve}"
    print(f"\nreward by step: {curve} ({steps} steps)")
