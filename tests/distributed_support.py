"""Groups and comparisons for the data-parallel training tests (tiny-random, fp32, seeded)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from art_core.training import TrainConfig, TrainResult
from art_core.trajectories import LLMCall, Trajectory, TrajectoryGroup

# A high learning rate so one step on a tiny model moves the adapter measurably.
FAST = TrainConfig(learning_rate=2e-2, precision="fp32", seed=1)
# Every part of the objective, several optimizer updates per call, micro-batches of a few
# sequences: the math that has to survive the split across ranks.
EVERYTHING = FAST.model_copy(
    update={
        "loss": "cispo",
        "truncated_importance_sampling": 2.0,
        "beta": 0.05,
        "num_epochs": 2,
        "optimizer_steps_per_epoch": 2,
        "max_tokens_per_batch": 96,
    }
)
# Metrics that describe how the step ran rather than what it computed.
RUN_METRICS = (
    "train/seconds",
    "train/tokens_per_second",
    "train/num_micro_batches",
    # Memory: each process's own (its resident memory, the budget it derived, the plan).
    "train/peak_memory_bytes",
    "train/estimated_peak_memory_bytes",
    "train/memory_budget_bytes",
    "train/micro_batch_token_budget",
)


def sampler_logprobs(model: Any, prompt: list[int], completion: list[int]) -> list[float]:
    """What a sampler at temperature 1 would have recorded for ``completion``."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = model(ids).logits[0, :-1].log_softmax(-1)
    picked = logp.gather(-1, ids[0, 1:, None])[:, 0]
    return picked[len(prompt) - 1 :].tolist()


def make_group(
    model: Any, prompt: list[int], completions: list[list[int]], rewards: list[float]
) -> TrajectoryGroup:
    trajectories = [
        Trajectory(
            calls=[
                LLMCall(
                    model="tiny",
                    messages=[],
                    prompt_token_ids=prompt,
                    completion_token_ids=completion,
                    logprobs=sampler_logprobs(model, prompt, completion),
                )
            ],
            reward=reward,
        )
        for completion, reward in zip(completions, rewards, strict=True)
    ]
    return TrajectoryGroup(trajectories)


def random_groups(
    model: Any, *, seed: int, lengths: list[list[int]], prompt_lengths: list[int]
) -> list[TrajectoryGroup]:
    """Groups of seeded random completions: ``lengths[g]`` are group g's completion lengths
    (very different lengths test the token balancing), ``prompt_lengths[g]`` its prompt's."""
    rng = random.Random(seed)
    vocab = model.config.vocab_size
    groups = []
    for group_lengths, prompt_length in zip(lengths, prompt_lengths, strict=True):
        prompt = [rng.randrange(vocab) for _ in range(prompt_length)]
        completions = [[rng.randrange(vocab) for _ in range(n)] for n in group_lengths]
        rewards = [rng.random() for _ in group_lengths]
        groups.append(make_group(model, prompt, completions, rewards))
    return groups


def adapter(result: TrainResult) -> dict[str, torch.Tensor]:
    assert result.checkpoint_path is not None
    return load_file(str(Path(result.checkpoint_path) / "adapter_model.safetensors"))


def optimizer_state(result: TrainResult) -> dict[str, torch.Tensor]:
    assert result.checkpoint_path is not None
    return load_file(str(Path(result.checkpoint_path) / "optimizer.safetensors"))


def assert_same_tensors(
    expected: dict[str, torch.Tensor], actual: dict[str, torch.Tensor], *, rel: float = 1e-5
) -> None:
    """Every tensor within ``rel`` of the expected one, relative in norm.

    Not element by element: Adam divides each gradient by its own magnitude, so an element
    whose gradient is ~1e-7 (float noise of a sum, whatever the packing) moves by an amount
    that float summation order decides; the tensor as a whole agrees to ~1e-6.
    """
    assert expected.keys() == actual.keys()
    for name, value in expected.items():
        scale = max(float(value.norm()), 1e-12)
        difference = float((actual[name] - value).norm())
        assert difference <= rel * scale, (name, difference / scale)


def assert_same_metrics(expected: TrainResult, actual: TrainResult) -> None:
    """The step's metrics agree, except those that describe how it ran."""
    for name, value in expected.metrics.items():
        if name in RUN_METRICS:
            continue
        assert actual.metrics[name] == pytest_approx(value), name


def pytest_approx(value: float) -> Any:
    import pytest

    return pytest.approx(value, rel=1e-5, abs=1e-6)
