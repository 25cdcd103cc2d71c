"""ART's API surface kept for code written against it: ``art.retry``, ``art.dev`` configs,
``gather_trajectories``, ``trajectory_group_batches``, ``Trajectory.finish`` /
``track_duration`` and the message type aliases."""

from __future__ import annotations

import asyncio
import gc
import warnings
from typing import Any

import pytest

import art_core as art
from art_core.backends.base import BackendBase


# ----------------------------------------------------------------------------- retry
class Flaky(Exception):
    pass


async def test_retry_retries_the_chosen_exceptions_then_gives_up() -> None:
    attempts: list[int] = []
    seen: list[tuple[str, int]] = []

    @art.retry(
        max_attempts=3, delay=0, exceptions=(Flaky,), on_retry=lambda e, n: seen.append((str(e), n))
    )
    async def rollout(fail_times: int) -> str:
        attempts.append(1)
        if len(attempts) <= fail_times:
            raise Flaky(f"attempt {len(attempts)}")
        return "ok"

    assert await rollout(2) == "ok" and len(attempts) == 3
    assert seen == [("attempt 1", 1), ("attempt 2", 2)]
    attempts.clear()
    with pytest.raises(Flaky, match="attempt 3"):
        await rollout(5)
    assert len(attempts) == 3
    assert rollout.__name__ == "rollout"  # functools.wraps: weave.op and logs see the name


def test_retry_leaves_other_exceptions_and_works_on_sync_functions() -> None:
    calls: list[int] = []

    @art.retry(delay=0, exceptions=(Flaky,))
    def parse(text: str) -> int:
        calls.append(1)
        return int(text)

    with pytest.raises(ValueError):
        parse("x")
    assert len(calls) == 1
    with pytest.raises(ValueError, match="max_attempts"):
        art.retry(max_attempts=0)


# ----------------------------------------------------------------------------- art.dev
def test_internal_model_config_sets_train_defaults_explicit_settings_win() -> None:
    model = art.TrainableModel(
        name="dev-config",
        base_model="tiny-random",
        _internal_config=art.dev.InternalModelConfig(
            init_args=art.dev.InitArgs(max_seq_length=8192),
            engine_args=art.dev.EngineArgs(enforce_eager=True, gpu_memory_utilization=0.8),
            peft_args=art.dev.PeftArgs(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
            trainer_args=art.dev.TrainerArgs(max_grad_norm=0.5, adam_beta2=0.95),
        ),
    )
    with pytest.warns(UserWarning, match=r"engine_args\.enforce_eager.*no effect here") as caught:
        config = BackendBase.train_config(None, {}, model=model)
    assert "init_args.max_seq_length" in str(caught[0].message)
    assert (config.lora_rank, config.lora_alpha) == (4, 8)
    assert config.lora_target_modules == ("q_proj", "v_proj")
    assert config.max_grad_norm == 0.5 and config.adam_betas == (0.9, 0.95)
    # a TrainConfig field set by the caller, or a keyword setting, wins over the model's
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = BackendBase.train_config(
            art.TrainConfig(lora_rank=16), {"max_grad_norm": 1.0}, model=model
        )
    assert config.lora_rank == 16 and config.max_grad_norm == 1.0 and config.lora_alpha == 8
    # ART assigns it after construction too
    model._internal_config = art.dev.InternalModelConfig(peft_args=art.dev.PeftArgs(r=2))
    assert BackendBase.train_config(None, {}, model=model).lora_rank == 2
    model._internal_config = {"peft_args": 16}  # type: ignore[assignment]
    with pytest.raises(TypeError, match=r"_internal_config\['peft_args'\] must be a dict"):
        BackendBase.train_config(None, {}, model=model)


def test_message_type_aliases_annotate_art_code() -> None:
    messages: art.Messages = [{"role": "user", "content": "hi"}]
    tools: art.Tools = [{"type": "function", "function": {"name": "f"}}]
    items: art.MessagesAndChoices = list(messages)
    assert art.Trajectory(messages_and_choices=items, tools=tools).messages() == messages


# ----------------------------------------------------------------------------- trajectory
async def test_finish_and_track_duration() -> None:
    trajectory = art.Trajectory(reward=0)
    for _ in range(2):
        async with trajectory.track_duration("tool"):
            await asyncio.sleep(0)
    with pytest.raises(KeyError):
        async with trajectory.track_duration("judge"):
            raise KeyError("the block's error propagates; the time is still counted")
    assert trajectory.metrics["tool_duration"] >= 0 and "judge_duration" in trajectory.metrics
    assert trajectory.finish() is trajectory
    assert trajectory.end_time is not None
    assert trajectory.metrics["duration"] == pytest.approx(
        trajectory.end_time - trajectory.start_time
    )


# ----------------------------------------------------------------------------- gathering
async def one(reward: float, *, fail: bool = False) -> art.Trajectory:
    await asyncio.sleep(0)
    if fail:
        raise Flaky(f"rollout {reward} failed")
    return art.Trajectory(reward=reward)


async def pair(reward: float) -> list[art.Trajectory]:
    return [art.Trajectory(reward=reward), art.Trajectory(reward=-reward)]


async def test_gather_trajectories_keeps_order_pairs_and_allowed_exceptions() -> None:
    results = await art.gather_trajectories(
        [one(1.0), pair(2.0), one(3.0, fail=True)], pbar_desc=None, max_exceptions=1
    )
    assert results[0].reward == 1.0
    assert [t.reward for t in results[1]] == [2.0, -2.0]
    assert isinstance(results[2], Flaky)
    with pytest.raises(art.TooManyExceptions, match=r"rollout 3\.0 failed"):
        await art.gather_trajectories([one(1.0), one(3.0, fail=True)], pbar_desc=None)


def group(rewards: list[float], running: dict[str, int], *, fail: bool = False) -> Any:
    async def rollout(reward: float) -> art.Trajectory:
        running["now"] += 1
        running["max"] = max(running["max"], running["now"])
        running["started"] += 1
        await asyncio.sleep(0.001 * reward)
        running["now"] -= 1
        if fail:
            raise Flaky("group failed")
        return art.Trajectory(reward=reward)

    return art.TrajectoryGroup(rollout(r) for r in rewards)


async def test_trajectory_group_batches_in_order_of_finishing_and_bounded() -> None:
    running = {"now": 0, "max": 0, "started": 0}
    groups = [group([float(5 - i), 0.0], running) for i in range(5)]
    batches = [
        b
        async for b in art.trajectory_group_batches(
            groups, batch_size=2, max_concurrent_batches=1, pbar_desc=None
        )
    ]
    assert [len(b) for b in batches] == [2, 2, 1]
    assert running["max"] <= 2 * 2  # two groups of two rollouts at a time
    assert sorted(t.reward for b in batches for g in b for t in g if t.reward) == [1, 2, 3, 4, 5]


async def test_trajectory_group_batches_yields_the_last_batch_when_groups_finish_together() -> None:
    # The source ends only after its last groups finished together with an odd remainder:
    # the smaller last batch must still be yielded, not dropped.
    gate = asyncio.Event()

    async def waits(reward: float) -> art.TrajectoryGroup:
        await gate.wait()
        return art.TrajectoryGroup([art.Trajectory(reward=reward)])

    async def instant(reward: float) -> art.TrajectoryGroup:
        return art.TrajectoryGroup([art.Trajectory(reward=reward)])

    async def opens_the_gate(reward: float) -> art.TrajectoryGroup:
        gate.set()  # wakes the first group in the same loop turn as this one ends
        await asyncio.sleep(0)
        return art.TrajectoryGroup([art.Trajectory(reward=reward)])

    source = iter([waits(1.0), instant(2.0), opens_the_gate(3.0)])
    batches = [
        b
        async for b in art.trajectory_group_batches(
            source, batch_size=2, max_concurrent_batches=1, pbar_desc=None
        )
    ]
    assert sorted(g.trajectories[0].reward for b in batches for g in b) == [1.0, 2.0, 3.0]
    assert [len(b) for b in batches] == [2, 1]


async def test_trajectory_group_batches_skips_stops_and_counts_exceptions() -> None:
    running = {"now": 0, "max": 0, "started": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a skipped group's coroutines must be closed, not leaked
        groups = [group([1.0], running) for _ in range(6)]
        batches = art.trajectory_group_batches(groups, batch_size=2, skip_batches=2, pbar_desc=None)
        assert [len(b) async for b in batches] == [2]
        gc.collect()
    assert running["started"] == 2

    groups = [group([1.0], running, fail=True), group([2.0], running)]
    with pytest.raises(art.TooManyExceptions, match="group failed"):
        async for _ in art.trajectory_group_batches(groups, batch_size=2, pbar_desc=None):
            pass
    batches = art.trajectory_group_batches(
        [group([1.0], running, fail=True), group([2.0], running)],
        batch_size=2,
        max_batch_exceptions=0.5,
        pbar_desc=None,
    )
    [batch] = [b async for b in batches]
    assert sum(len(g.exceptions) for g in batch) == 1

    # leaving the loop early cancels the groups still running
    endless = (group([1.0], running) for _ in range(1000))
    before = running["started"]
    async for _ in art.trajectory_group_batches(endless, batch_size=1, pbar_desc=None):
        break
    await asyncio.sleep(0.01)
    assert running["now"] == 0 and running["started"] - before <= 4
