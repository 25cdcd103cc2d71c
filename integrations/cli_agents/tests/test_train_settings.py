"""``art_cli_agents.train``'s options: the keywords it always took and ``CLITrainSettings``
are one set of settings; a keyword that is no option is a ``TypeError`` naming it. Nothing
runs an agent."""

from __future__ import annotations

import dataclasses
import io
import typing

import art_cli_agents as cli
import pytest
from art_cli_agents import CLITrainKwargs, CLITrainSettings
from art_cli_agents.train import train_settings

import art_core as art

KEYWORDS = {
    "val_tasks": [cli.Task("print hello")],
    "steps": 3,
    "groups_per_step": 2,
    "rollouts_per_group": 3,
    "val_rollouts_per_task": 1,
    "config": art.TrainConfig(learning_rate=1e-5),
    "limits": cli.Limits(timeout_s=30),
    "network": "isolated",
    "seed": 7,
    "errlog": io.StringIO(),
    "time_budget_s": 60.0,
    "on_step": print,
    "max_exceptions": 2,
    "max_concurrent_groups": 1,
    "filesystem": "isolated",
    "sampling": art.RolloutSampling(seed=3),
}


def test_every_option_is_a_keyword_and_a_typed_keyword() -> None:
    fields = {f.name for f in dataclasses.fields(CLITrainSettings)}
    assert set(KEYWORDS) == fields
    assert set(typing.get_type_hints(CLITrainKwargs)) == fields


def test_keywords_and_the_settings_object_give_the_same_settings() -> None:
    from_keywords = train_settings(**KEYWORDS)  # type: ignore[arg-type]
    from_object = train_settings(CLITrainSettings(**KEYWORDS))  # type: ignore[arg-type]
    assert from_keywords == from_object
    for name, value in KEYWORDS.items():
        assert getattr(from_keywords, name) is value
    both = train_settings(CLITrainSettings(steps=5, seed=3), steps=9)
    assert (both.steps, both.seed) == (9, 3)
    defaults = CLITrainSettings()
    assert (defaults.steps, defaults.groups_per_step, defaults.rollouts_per_group) == (10, 4, 4)
    assert defaults.val_rollouts_per_task == 2 and defaults.max_exceptions == 0.25


async def test_an_unknown_keyword_is_a_type_error_naming_it() -> None:
    with pytest.raises(TypeError, match="unexpected keyword arguments: rollouts, stepz"):
        train_settings(stepz=3, rollouts=2)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="stepz"):
        await cli.train(None, None, [cli.Task("p")], stepz=3)  # type: ignore[arg-type, call-arg]


async def test_the_settings_object_is_checked_like_the_keywords() -> None:
    with pytest.raises(ValueError, match="rollouts_per_group must be >= 2"):
        await cli.train(None, None, [cli.Task("p")], CLITrainSettings(rollouts_per_group=1))  # type: ignore[arg-type]
