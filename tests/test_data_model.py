"""Trajectories, groups and gather_trajectory_groups."""

from __future__ import annotations

import asyncio

import pytest

import art_core as art


def test_trajectory_json_round_trip_keeps_calls() -> None:
    call = art.LLMCall(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        prompt_token_ids=[1, 2],
        completion_token_ids=[3, 4],
        logprobs=[-0.5, -0.25],
        completion_text="ab",
        response_message={"role": "assistant", "content": "ab"},
    )
    trajectory = art.Trajectory(
        calls=[call], reward=0.5, metrics={"turns": 1}, metadata={"k": "v"}, logs=["x"]
    )
    loaded = art.Trajectory.model_validate_json(trajectory.model_dump_json())
    assert loaded == trajectory
    assert loaded.messages() == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "ab"},
    ]


def test_trajectory_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="finite"):
        art.Trajectory(reward=float("nan"))
    with pytest.raises(ValueError, match="Extra inputs"):
        art.Trajectory(rewardd=1.0)  # type: ignore[call-arg]


def test_model_names_cannot_escape_the_art_folder() -> None:
    for bad in ("../evil", "a/b", ".hidden", "x" * 200, ""):
        with pytest.raises(ValueError, match="model name"):
            art.TrainableModel(name=bad, base_model="tiny-random")


async def rollout(reward: float, fail: bool = False) -> art.Trajectory:
    await asyncio.sleep(0)
    if fail:
        raise RuntimeError("tool exploded")
    return art.Trajectory(reward=reward)


async def test_gather_runs_groups_and_counts_exceptions() -> None:
    groups = await art.gather_trajectory_groups(
        [
            art.TrajectoryGroup(rollout(r) for r in (0.0, 1.0)),
            art.TrajectoryGroup([rollout(2.0), rollout(0.0, fail=True)]),
        ],
        max_exceptions=1,
    )
    assert [[t.reward for t in g] for g in groups] == [[0.0, 1.0], [2.0]]
    assert groups[1].exceptions[0].type == "RuntimeError"
    assert "tool exploded" in groups[1].exceptions[0].message


async def test_gather_raises_past_max_exceptions() -> None:
    with pytest.raises(art.TooManyExceptions, match="tool exploded"):
        await art.gather_trajectory_groups(
            [art.TrajectoryGroup([rollout(1.0, fail=True), rollout(1.0, fail=True)])],
            max_exceptions=1,
        )


async def test_gather_after_each_can_rescore_or_drop() -> None:
    async def judge(group: art.TrajectoryGroup) -> art.TrajectoryGroup | None:
        if any(t.reward < 0 for t in group):
            return None
        for t in group:
            t.reward *= 10
        return group

    groups = await art.gather_trajectory_groups(
        [art.TrajectoryGroup([rollout(1.0)]), art.TrajectoryGroup([rollout(-1.0)])],
        after_each=judge,
    )
    assert [[t.reward for t in g] for g in groups] == [[10.0]]


async def test_group_json_round_trip_and_await() -> None:
    group = await art.TrajectoryGroup([rollout(1.0), art.Trajectory(reward=0.0)])
    loaded = art.TrajectoryGroup.model_validate_json(group.model_dump_json())
    assert sorted(t.reward for t in loaded) == [0.0, 1.0]


def test_malformed_group_payload_is_a_validation_error() -> None:
    import pydantic

    for payload in ({"trajectories": 3}, {"trajectories": [5]}, {"trajectories": "abc"}):
        with pytest.raises(pydantic.ValidationError, match="trajectories"):
            art.TrajectoryGroup.model_validate(payload)


def test_import_art_core_does_not_import_torch() -> None:
    """A RemoteBackend client (a laptop) never needs torch; importing it costs ~1.5 s."""
    import subprocess
    import sys

    code = "import sys, art_core; print(sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
