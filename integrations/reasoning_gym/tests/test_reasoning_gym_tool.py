"""A reasoning-gym generator (``basic_arithmetic``) with the ``calculate`` tool this package
ships, run unchanged through ``art_mcp.rollout`` (the gateway records every call), scored by the
dataset's own ``score_answer``, and trained on for a step."""

from __future__ import annotations

from dataclasses import replace

import art_mcp
import pytest
import reasoning_gym
from art_mcp import RolloutSettings, Scenario
from art_reasoning_gym import (
    CALCULATOR_SERVER,
    DATASET_KEY,
    INDEX_KEY,
    compute,
    scenarios_from_dataset,
    score_answer_reward,
)

import art_core as art
from art_core.testing.checks import assert_token_exact, tool_call_in_text
from art_core.testing.pytest_plugin import register_tiny_model

SETTINGS = RolloutSettings(
    tool_choice="required",
    parallel_tool_calls=False,
    max_turns=2,
    max_tokens=40,
    max_answer_chars=16,
    connect_timeout_s=60.0,
)
CONFIG = art.TrainConfig(learning_rate=1e-3, lora_rank=4, lora_alpha=8)
INSTRUCTIONS = "Use the calculate tool, then call complete_task with the number it returned."


def powers(size: int = 3) -> reasoning_gym.dataset.ProceduralDataset:
    """``power_function``: its own ``score_answer`` gives 1.0 for the answer to 3 significant
    figures, 0.01 for any other answer and 0.0 for none, so a run that answers scores above one
    that never does (partial credit the generator defines)."""
    return reasoning_gym.create_dataset("power_function", size=size, seed=7)


def arithmetic(size: int = 4) -> reasoning_gym.dataset.ProceduralDataset:
    # Two terms of one or two digits, no division: short questions a small model can copy.
    return reasoning_gym.create_dataset(
        "basic_arithmetic",
        size=size,
        seed=7,
        min_terms=2,
        max_terms=2,
        min_digits=1,
        max_digits=2,
        operators=("+", "-", "*"),
    )


def test_the_calculator_solves_what_the_generators_ask() -> None:
    arithmetic = reasoning_gym.create_dataset("basic_arithmetic", size=50, seed=3)
    for entry in arithmetic:
        assert compute(entry["metadata"]["expression"]) == entry["answer"], entry
    power = powers(50)
    for entry in power:
        base, exponent = entry["metadata"]["base"], entry["metadata"]["exponent"]
        assert power.score_answer(compute(f"({base})^{exponent}"), entry) == 1.0, entry
    for bad in ("", "2 % 8", "2 ^ 0.5", "2 ^ 99", "0 ^ -1", "__import__('os')", "1 / 0", "x"):
        with pytest.raises(ValueError):
            compute(bad)


def test_scenarios_and_reward_are_the_dataset_s_own() -> None:
    dataset = powers()
    scenarios = scenarios_from_dataset(dataset, instructions=INSTRUCTIONS)
    assert [s.metadata[INDEX_KEY] for s in scenarios] == [0, 1, 2]
    assert {s.metadata[DATASET_KEY] for s in scenarios} == {"power_function"}
    reward = score_answer_reward(dataset)
    first, entry = scenarios[0], dataset[0]
    assert first.task.endswith(entry["question"].strip()) and first.answer == entry["answer"]

    def scored(final: str | None) -> float:
        return reward(first, art.Trajectory(metadata={"final_answer": final}))

    # exactly what reasoning-gym's score_answer says, partial credit included
    for final in (entry["answer"], "8.06e-06", "no idea", "", None):
        assert scored(final) == dataset.score_answer(final, entry)
    assert (scored(entry["answer"]), scored("no idea"), scored(None)) == (1.0, 0.01, 0.0)
    with pytest.raises(ValueError, match="has no valid"):
        reward(Scenario(task="What is 1 + 1?"), art.Trajectory())
    with pytest.raises(ValueError, match="is not row 1"):
        reward(first.model_copy(update={"metadata": {INDEX_KEY: 1}}), art.Trajectory())
    with pytest.raises(ValueError, match="not a row"):
        scenarios_from_dataset(dataset, [3])


async def test_generator_with_the_tool_runs_through_the_gateway_and_trains_a_step(
    backend: art.LocalBackend,
) -> None:
    dataset = powers()
    scenarios = scenarios_from_dataset(dataset, instructions=INSTRUCTIONS)
    reward = score_answer_reward(dataset)
    model = await register_tiny_model(backend, "rg-tiny", "reasoning-gym-tests")
    groups = await art.gather_trajectory_groups(
        art.TrajectoryGroup(
            art_mcp.rollout(
                model,
                scenario,
                CALCULATOR_SERVER,
                reward_fn=reward,
                # Each run its own sampling seed: the same runs every time (unseeded, the
                # tiny model's 12 runs all went without an answer about once in many CI runs).
                settings=replace(SETTINGS, extra_body={"seed": 1000 * index + run}),
            )
            for run in range(4)
        )
        for index, scenario in enumerate(scenarios)
    )
    # (the Engine protocol does not declare it; every engine here has one)
    tokenizer = backend.engine(model).tokenizer  # type: ignore[attr-defined]
    calculated = 0
    for scenario, group in zip(scenarios, groups, strict=True):
        assert len(group.trajectories) == 4 and not group.exceptions
        entry = dataset[scenario.metadata[INDEX_KEY]]
        for trajectory in group.trajectories:
            assert_token_exact(trajectory, tokenizer)
            # the reward is reasoning-gym's own verdict on the answer the run gave
            final = trajectory.metadata["final_answer"]
            assert trajectory.reward == dataset.score_answer(final, entry)
            for call in trajectory.calls:
                assert call.prompt_token_ids and call.completion_token_ids
                for tool_call in call.response_message.get("tool_calls") or []:
                    # (a call cut by max_tokens was completed by the parser: not in the text)
                    assert call.finish_reason == "length" or tool_call_in_text(
                        tool_call, call.completion_text
                    )
                    calculated += tool_call["function"]["name"] == "calculate"
    assert calculated, "no run called the calculator"
    rewards = [[t.reward for t in g.trajectories] for g in groups]
    assert any(len(set(r)) > 1 for r in rewards), f"every group all-equal: {rewards}"
    result = await model.train(groups, config=CONFIG)
    assert result.step == 1
    assert result.nothing_trained is None
