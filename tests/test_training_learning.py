"""Acceptance: the full public loop makes tiny-random learn a task it almost never solves.

The task: "answer with digits only". The reward is the fraction of the answer's non-space
characters that are digits. An untrained tiny-random model samples near-uniformly from its
695 tokens, 43 of which contain a digit, so it scores ~0.06; after GRPO it answers in digits.

Everything goes through the public API: ``TrainableModel`` + ``LocalBackend`` (gateway and
transformers engine), ``capture`` with the real ``openai`` client, ``gather_trajectory_groups``
and ``model.train`` (engine paused, trainer in a thread, adapter hot-swapped).

Why the LoRA also targets ``lm_head``: tiny-random's embeddings are random with norm ~0.16,
and its final RMSNorm output has norm 8, so with the head frozen no hidden state can move any
logit by more than ~1.3: the projections alone cannot make the model prefer 43 tokens out of
695 (measured: a supervised LoRA on the projections plateaus at 1% on 4 target tokens). A
LoRA on the head lifts that ceiling; real models do not need it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import art_core as art
from art_core.training import DEFAULT_LORA_TARGET_MODULES, TrainConfig

PROMPTS = [
    "What is 12 times 7?",
    "How many days are in a leap year?",
    "Give me a number between 1 and 9.",
    "What year comes after 1999?",
]
GROUP_SIZE = 8
MAX_TOKENS = 6
MAX_STEPS = 25
CONFIG = TrainConfig(
    learning_rate=3e-2,
    lora_target_modules=(*DEFAULT_LORA_TARGET_MODULES, "lm_head"),
    precision="fp32",  # the CPU engine samples in fp32: the ratio starts at exactly 1
)


def digit_fraction(text: str) -> float:
    """The reward: share of non-space characters that are digits (0 for an empty answer)."""
    chars = [c for c in text if not c.isspace()]
    return sum(c.isdigit() for c in chars) / len(chars) if chars else 0.0


async def rollout(
    model: art.TrainableModel,
    prompt: str,
    seed: int,
    reward: Callable[[str], float] = digit_fraction,
) -> art.Trajectory:
    async with art.capture(model) as run:
        response = await run.openai_client().chat.completions.create(
            model=run.model_name,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=MAX_TOKENS,
            temperature=1.0,
            seed=seed,  # a fixed sampling schedule keeps the test reproducible
        )
    answer = response.choices[0].message.content or ""
    return run.trajectory(reward=reward(answer), metrics={"chars": len(answer)})


async def gather(
    model: art.TrainableModel, step: int, reward: Callable[[str], float] = digit_fraction
) -> list[art.TrajectoryGroup]:
    """A group of GROUP_SIZE runs per prompt, sampled with the seeds of ``step``."""
    return await art.gather_trajectory_groups(
        (
            art.TrajectoryGroup(
                rollout(model, prompt, seed=1000 * step + GROUP_SIZE * p + i, reward=reward)
                for i in range(GROUP_SIZE)
            )
            for p, prompt in enumerate(PROMPTS)
        ),
        pbar_desc=None,
    )


def mean_reward(groups: list[art.TrajectoryGroup]) -> float:
    rewards = [t.reward for g in groups for t in g.trajectories]
    return sum(rewards) / len(rewards)


def test_digit_fraction_reward() -> None:
    assert digit_fraction("1 2 3") == 1.0
    assert digit_fraction("a1") == 0.5
    assert digit_fraction("") == 0.0


async def test_tiny_random_learns_to_answer_in_digits(tmp_path: Path) -> None:
    started = time.perf_counter()
    async with art.LocalBackend(path=tmp_path) as backend:
        model = art.TrainableModel(name="digits", project="learning", base_model="tiny-random")
        await model.register(backend)

        groups = await gather(model, 0)
        rewards = [mean_reward(groups)]
        assert rewards[0] <= 0.2, f"the task must start hard: mean reward {rewards[0]:.3f}"
        # Every rollout was recorded token-exactly and served by the base model.
        assert all(len(t.calls) == 1 and t.calls[0].adapter_step == 0 for g in groups for t in g)

        for step in range(1, MAX_STEPS + 1):
            result = await model.train(groups, config=CONFIG)
            assert result.step == step == await model.get_step()
            groups = await gather(model, step)
            # The new adapter is served right after train returns.
            assert {c.adapter_step for g in groups for t in g for c in t.calls} == {step}
            rewards.append(mean_reward(groups))
            if rewards[-1] >= 0.8:
                break

    curve = " ".join(f"{r:.2f}" for r in rewards)
    assert rewards[-1] >= 0.8, f"mean reward per step: {curve}"
    elapsed = time.perf_counter() - started
    print(f"\nreward by step: {curve} ({len(rewards) - 1} steps, {elapsed:.0f} s)")
    history = (tmp_path / "learning" / "models" / "digits" / "history.jsonl").read_text()
    assert history.count('"train/loss"') == len(rewards) - 1
