"""``art_mcp.train``'s options: the keywords it always took and ``MCPTrainSettings`` are one
set of settings; a keyword that is no option is a ``TypeError`` naming it. No model runs."""

from __future__ import annotations

import dataclasses
import io
import typing

import art_mcp
import pytest
from art_mcp import Judge, MCPTrainKwargs, MCPTrainSettings, RolloutSettings, Scenario
from art_mcp.train import train_settings


def reward(scenario: Scenario, trajectory: object) -> float:
    return 1.0


KEYWORDS = {
    "steps": 3,
    "groups_per_step": 2,
    "rollouts_per_group": 4,
    "reward_fn": reward,
    "judge": Judge("judge-model"),
    "val_scenarios": [Scenario(task="What time is it in Paris?")],
    "val_rollouts_per_scenario": 1,
    "settings": RolloutSettings(max_turns=3),
    "val_settings": RolloutSettings(max_turns=2),
    "config": object(),
    "max_exceptions": 2,
    "seed": 7,
    "errlog": io.StringIO(),
    "on_step": print,
    "dynamic_sampling": True,
    "max_rollouts_per_step": 64,
    "max_group_size": 8,
    "curriculum": True,
    "success_threshold": 0.5,
    "warm_start": art_mcp.WarmStart(traces=2),
    "time_budget_s": 60.0,
}


def test_every_option_is_a_keyword_and_a_typed_keyword() -> None:
    fields = {f.name for f in dataclasses.fields(MCPTrainSettings)}
    assert set(KEYWORDS) == fields
    assert set(typing.get_type_hints(MCPTrainKwargs)) == fields


def test_keywords_and_the_settings_object_give_the_same_settings() -> None:
    from_keywords = train_settings(**KEYWORDS)  # type: ignore[arg-type]
    from_object = train_settings(MCPTrainSettings(**KEYWORDS))
    assert from_keywords == from_object
    for name, value in KEYWORDS.items():
        assert getattr(from_keywords, name) is value
    # keywords override the object's fields, the others stay
    both = train_settings(MCPTrainSettings(steps=5, seed=3), steps=9)
    assert (both.steps, both.seed) == (9, 3)
    assert train_settings() == MCPTrainSettings()


def test_the_defaults_are_those_train_always_had() -> None:
    options = MCPTrainSettings()
    assert (options.steps, options.groups_per_step, options.rollouts_per_group) == (10, 4, 8)
    assert options.val_rollouts_per_scenario == 2 and options.max_exceptions == 0.25
    assert options.max_rollouts() == 32
    assert dataclasses.replace(options, dynamic_sampling=True).max_rollouts() == 128


async def test_an_unknown_keyword_is_a_type_error_naming_it() -> None:
    with pytest.raises(TypeError, match="unexpected keyword arguments: rollouts, stepz"):
        train_settings(stepz=3, rollouts=2)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="stepz"):
        await art_mcp.train(
            None,  # type: ignore[arg-type]
            "python x.py",
            [],
            reward_fn=reward,
            stepz=3,  # type: ignore[call-arg]
        )


async def test_the_settings_object_is_checked_like_the_keywords() -> None:
    scenarios = [Scenario(task="What time is it in Paris?")]
    with pytest.raises(ValueError, match="train needs a reward"):
        await art_mcp.train(None, "python x.py", scenarios, MCPTrainSettings())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rollouts_per_group must be >= 2"):
        await art_mcp.train(
            None,  # type: ignore[arg-type]
            "python x.py",
            scenarios,
            MCPTrainSettings(judge=Judge("j")),
            rollouts_per_group=1,
        )
