"""PipelineTrainer: learns while sampling never stops, trains nothing older than allowed,
counts what it drops, and resumes at the right step and scenario after a kill."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from pipeline_support import CONFIG, rollout, run_pipeline, scenarios, trained_groups

import art_core as art
from art_core.cpu import cpu_budget
from art_core.model_folder import ModelFolder
from art_core.pipeline import trainer as pipeline_trainer
from art_core.pipeline.overlap import StepSplit, predicted_choice
from art_core.pipeline.trainer import PROBE_STEPS, PipelineTrainer, _Sampled, choose_overlap

# Overlapped steps need two cores (one samples, one trains): under xdist these run alone, on
# every core, as on a user's machine.
WHOLE_MACHINE = pytest.mark.whole_machine


def _steps_of(group: art.TrajectoryGroup) -> list[int]:
    return [c.adapter_step for t in group.trajectories for c in t.calls]


@WHOLE_MACHINE
async def test_the_pipeline_learns_the_digits_task(tmp_path: Path) -> None:
    async with art.LocalBackend(path=tmp_path) as backend:
        model = art.TrainableModel(name="digits", project="pipeline", base_model="tiny-random")
        await model.register(backend)
        trainer = art.PipelineTrainer(
            model,
            rollout,
            scenarios(),
            group_size=8,
            groups_per_step=4,
            max_steps_off_policy=1,
            max_steps=40,
            train_config=CONFIG,
            progress=False,
        )
        rewards: list[float] = []
        # One step at a time, so the test stops as soon as the task is learned. It stops at
        # the first step >= 0.9 too: a policy that solves every scenario gives only all-equal
        # groups, which the pipeline drops, so one more step would wait for signal forever
        # (seen: 0.68, 0.97, 0.97, then no step). The timeout turns such a wait into a failure.
        while len(rewards) < 40:
            trainer.max_steps = trainer.state.steps + 1
            [result] = await asyncio.wait_for(trainer.train(), timeout=300)
            rewards.append(result.metrics["train/reward"])
            if rewards[-1] >= 0.9 or (len(rewards) >= 3 and min(rewards[-3:]) >= 0.8):
                break
    curve = " ".join(f"{r:.2f}" for r in rewards)
    learned = rewards[-1] >= 0.9 or min(rewards[-3:]) >= 0.8
    assert rewards[0] <= 0.3 and learned, curve
    folder = ModelFolder.of(tmp_path, "pipeline", "digits")
    # Staleness, from the recorded adapter steps: trained on step s = served by s or s - 1.
    for step, groups in trained_groups(folder).items():
        for group in groups:
            assert min(_steps_of(group)) >= step - 1, (step, _steps_of(group))
    records = [r for r in folder.read_history() if r.get("split") == "train"]
    assert all(r["train/pipeline_policy_age_max"] <= 1 for r in records)
    assert all("train/pipeline_dropped_stale" in r for r in records)
    print(f"\npipelined reward by step: {curve}")


@WHOLE_MACHINE
@pytest.mark.parametrize(
    ("overlap", "off_policy", "max_age"), [(False, 1, 0), (True, 0, 0), (True, 1, 1)]
)
async def test_no_group_is_started_that_would_be_stale(
    tmp_path: Path, overlap: bool, off_policy: int, max_age: int
) -> None:
    async with art.LocalBackend(path=tmp_path) as backend:
        model = art.TrainableModel(name="strict", project="pipeline", base_model="tiny-random")
        await model.register(backend)
        trainer = art.PipelineTrainer(
            model,
            rollout,
            scenarios(),
            group_size=4,
            groups_per_step=2,
            num_rollout_workers=6,  # more workers than a step takes groups: they must wait
            max_steps_off_policy=off_policy,
            overlap=overlap,
            max_steps=4,
            train_config=CONFIG,
            keep_groups_without_signal=True,
            progress=False,
        )
        results = await trainer.train()
    assert len(results) == 4
    assert trainer.state.dropped_stale == 0  # nothing was sampled only to be thrown away
    folder = ModelFolder.of(tmp_path, "pipeline", "strict")
    ages = []
    for step, groups in trained_groups(folder).items():
        for group in groups:
            ages.append(step - min(_steps_of(group)))
            if max_age == 0:
                assert set(_steps_of(group)) == {step}  # sampled by the policy it trains
    assert max(ages) == max_age and len(ages) == 8
    records = [r for r in folder.read_history() if r.get("split") == "train"]
    assert all(r["train/pipeline_policy_age_max"] <= max_age for r in records)


async def test_a_group_older_than_allowed_is_dropped_counted_and_replaced() -> None:
    trainer = PipelineTrainer(
        object(),  # type: ignore[arg-type]  # the batch is assembled without the model
        rollout,
        scenarios(),
        groups_per_step=2,
        max_steps_off_policy=1,
        overlap=True,  # overlapped, a dropped group is replaced (lock-step: the next test)
        progress=False,
    )
    mixed = [art.Trajectory(messages_and_choices=[], reward=r) for r in (0.0, 1.0)]

    def sampled(index: int, oldest_step: int) -> _Sampled:
        return _Sampled(art.TrajectoryGroup(mixed), index, oldest_step, rollouts=2)

    queue: asyncio.Queue[_Sampled | None] = asyncio.Queue()
    queue.put_nowait(sampled(0, oldest_step=3))  # two steps old at step 5: stale
    queue.put_nowait(sampled(1, oldest_step=4))
    trainer._backlog = 2  # both were started by workers, for this batch of two
    assembling = asyncio.ensure_future(trainer._next_batch(queue, current_step=5))
    for _ in range(10):  # let it take both groups off the queue and wait for a third
        await asyncio.sleep(0)
    assert queue.empty()
    # The stale group was replaced while the batch fills: one ticket for a worker.
    assert trainer._open_tickets == 1 and not assembling.done()
    trainer._backlog += 1  # as a worker does when it starts the replacement
    queue.put_nowait(sampled(2, oldest_step=5))
    batch, dropped = await assembling
    assert [item.scenario_index for item in batch] == [1, 2]
    assert dropped == {"stale": 1, "no_signal": 0} and trainer.state.dropped_stale == 1
    assert trainer.state.is_done(0) and trainer._backlog == 0


async def test_lock_step_trains_the_groups_with_a_signal_of_one_round() -> None:
    """Lock-step, a step trains those of its round of groups that have a signal, as the plain
    gather-and-train loop does, rather than replacing each dropped group with a round of its
    own; a round where no group has a signal is followed by another one."""
    trainer = PipelineTrainer(
        object(),  # type: ignore[arg-type]  # the batch is assembled without the model
        rollout,
        scenarios(),
        groups_per_step=2,
        overlap=False,
        progress=False,
    )
    mixed = [art.Trajectory(messages_and_choices=[], reward=r) for r in (0.0, 1.0)]
    equal = [art.Trajectory(messages_and_choices=[], reward=r) for r in (1.0, 1.0)]

    def sampled(index: int, trajectories: list[art.Trajectory]) -> _Sampled:
        return _Sampled(art.TrajectoryGroup(trajectories), index, 3, rollouts=2)

    queue: asyncio.Queue[_Sampled | None] = asyncio.Queue()
    trainer._backlog = 2  # the round: two groups started by workers
    queue.put_nowait(sampled(0, equal))
    queue.put_nowait(sampled(1, mixed))
    batch, dropped = await trainer._next_batch(queue, current_step=3)
    assert [item.scenario_index for item in batch] == [1]
    assert dropped == {"stale": 0, "no_signal": 1} and trainer._open_tickets == 0

    trainer._filling = 0  # as the step that trained the batch does
    trainer._backlog = 2  # the next round: neither group has a signal
    queue.put_nowait(sampled(2, equal))
    queue.put_nowait(sampled(3, equal))
    assembling = asyncio.ensure_future(trainer._next_batch(queue, current_step=3))
    for _ in range(10):
        await asyncio.sleep(0)
    assert not assembling.done() and trainer._open_tickets == 2  # a whole new round
    trainer._open_tickets, trainer._backlog = 0, 2  # as two workers do when they start it
    queue.put_nowait(sampled(4, mixed))
    queue.put_nowait(sampled(5, mixed))
    batch, dropped = await assembling
    assert [item.scenario_index for item in batch] == [4, 5]
    assert dropped == {"stale": 0, "no_signal": 2} and trainer.state.dropped_no_signal == 3


async def test_a_killed_pipeline_resumes_at_its_step_and_next_scenario(tmp_path: Path) -> None:
    here = Path(__file__).parent
    stderr = (tmp_path / "stderr.txt").open("wb")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(here / "pipeline_support.py"),
        str(tmp_path),
        "100",
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(here), *sys.path])},
        stdout=subprocess.DEVNULL,
        stderr=stderr,
    )
    folder = ModelFolder.of(tmp_path, "pipeline", "digits")
    deadline = time.monotonic() + 300
    try:
        while True:  # kill it once two steps are saved
            state = (
                json.loads(folder.pipeline_state.read_text())
                if folder.pipeline_state.exists()
                else {}
            )
            if state.get("steps", 0) >= 2:
                break
            assert process.returncode is None, (tmp_path / "stderr.txt").read_text()[-3000:]
            assert time.monotonic() < deadline, "the pipeline did not train two steps"
            await asyncio.sleep(0.2)
    finally:
        process.send_signal(signal.SIGKILL)
        await process.wait()
        stderr.close()
    saved = json.loads(folder.pipeline_state.read_text())
    step_at_kill = folder.latest_step()
    assert step_at_kill >= saved["steps"] >= 2
    done_before = set(range(saved["next_scenario"])) | set(saved["done_beyond"])

    await run_pipeline(tmp_path, max_steps=saved["steps"] + 1)  # one more step
    assert folder.latest_step() == step_at_kill + 1
    after = json.loads(folder.pipeline_state.read_text())
    assert after["steps"] == saved["steps"] + 1
    newest = max(trained_groups(folder))
    used = {t.metadata["scenario"] for g in folder.read_trajectories("train", newest) for t in g}
    # The resumed pipeline went on with scenarios it had not done, from where it stood.
    assert used and not used & done_before
    assert min(used) >= saved["next_scenario"]


async def test_one_core_is_refused_clearly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from art_core.backends import local

    monkeypatch.setattr(local, "cpu_budget", lambda: 1)
    async with art.LocalBackend(path=tmp_path) as backend:
        model = art.TrainableModel(name="one", project="pipeline", base_model="tiny-random")
        await model.register(backend)
        with pytest.raises(ValueError, match="two CPU cores"):
            backend.prepare_serve_while_training(model)


def test_overlap_is_kept_only_when_it_at_least_doubles_the_step_rate() -> None:
    assert choose_overlap(10.0, 4.0)[0] is True
    chosen, why = choose_overlap(10.0, 12.0)
    assert chosen is False and "does not pay" in why and "10.00 s lock-step" in why
    # 1.8x faster steps, as on the Xeon where overlap took 3x longer to the reward.
    assert choose_overlap(4.06, 2.25)[0] is False
    with pytest.raises(ValueError, match="periods"):
        choose_overlap(0.0, 1.0)


async def _train_pipeline(
    path: Path, steps: int, **options: object
) -> tuple[art.PipelineTrainer, int, int]:
    """A short pipeline run; the model thread's CPU threads before and after it."""
    # The model's thread starts on this (the registering) thread's count: every core.
    torch.set_num_threads(cpu_budget())
    async with art.LocalBackend(path=path) as backend:
        model = art.TrainableModel(name="mode", project="pipeline", base_model="tiny-random")
        await model.register(backend)
        engine_thread = backend._entry(model).torch_thread
        before = await asyncio.wrap_future(engine_thread.submit(torch.get_num_threads))
        trainer = art.PipelineTrainer(
            model,
            rollout,
            scenarios(),
            group_size=4,
            groups_per_step=2,
            max_steps=steps,
            train_config=CONFIG,
            keep_groups_without_signal=True,
            progress=False,
            **options,  # type: ignore[arg-type]
        )
        await trainer.train()
        after = await asyncio.wrap_future(engine_thread.submit(torch.get_num_threads))
    return trainer, before, after


@WHOLE_MACHINE
async def test_by_default_the_pipeline_decides_from_the_split_of_a_lock_step_step(
    tmp_path: Path,
) -> None:
    trainer, _, _ = await _train_pipeline(tmp_path, steps=PROBE_STEPS + 1)
    modes = [r.metrics["train/pipeline_overlap"] for r in trainer.results]
    assert modes[:PROBE_STEPS] == [0.0] * PROBE_STEPS  # no overlapped probe steps
    for result in trainer.results:  # the split of every step: its two sides fill the period
        parts = result.metrics
        assert (
            parts["train/pipeline_sample_seconds"] > 0 and parts["train/pipeline_train_seconds"] > 0
        )
        assert parts["train/pipeline_sample_cpu_seconds"] >= 0
        assert parts["train/pipeline_train_cpu_seconds"] > 0
        assert (
            parts["train/pipeline_sample_seconds"] + parts["train/pipeline_train_seconds"]
            >= parts["train/pipeline_step_seconds"]
        )
    last = trainer.results[PROBE_STEPS - 1].metrics
    split = StepSplit(
        sample_s=last["train/pipeline_sample_seconds"],
        train_s=last["train/pipeline_train_seconds"],
        sample_cpu_s=last["train/pipeline_sample_cpu_seconds"],
        train_cpu_s=last["train/pipeline_train_cpu_seconds"],
    )
    # Both sides share this process's cores (the in-process engine): the split says how.
    assert trainer._core_split is not None
    assert trainer._core_split.sampler_threads + trainer._core_split.trainer_threads == cpu_budget()
    worth_trying, reason = predicted_choice(split, trainer._core_split)
    if worth_trying:
        assert modes[PROBE_STEPS] == 1.0 and trainer.overlap_chosen is None  # trying it
    else:
        assert modes[PROBE_STEPS] == 0.0 and trainer.overlap_chosen is False
        assert trainer.overlap_reason == reason and "cannot pay" in reason
    # Each step's wait for its batch is recorded with it, for the history's readers.
    folder = ModelFolder.of(tmp_path, "pipeline", "mode")
    records = [r for r in folder.read_history() if r.get("split") == "train"]
    assert len(records) == len(modes)
    assert all(r["train/pipeline_batch_wait_seconds"] >= 0 for r in records)
    assert [r["train/pipeline_overlap"] for r in records] == modes


@WHOLE_MACHINE
async def test_overlap_is_tried_when_predicted_and_left_when_the_measured_step_disagrees(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pipeline_trainer, "predicted_choice", lambda split, cores: (True, "try"))
    monkeypatch.setattr(
        pipeline_trainer, "choose_overlap", lambda lock, over: (False, f"{lock:.2f} vs {over:.2f}")
    )
    trainer, before, after = await _train_pipeline(tmp_path, steps=PROBE_STEPS + 3)
    modes = [r.metrics["train/pipeline_overlap"] for r in trainer.results]
    # Lock-step probes, two overlapped steps (the second is measured), lock-step for good.
    assert modes == [0.0] * PROBE_STEPS + [1.0, 1.0, 0.0]
    periods = [r.metrics["train/pipeline_step_seconds"] for r in trainer.results]
    assert trainer.overlap_chosen is False
    assert trainer.overlap_reason == f"{periods[PROBE_STEPS - 1]:.2f} vs {periods[-2]:.2f}"
    assert after == before  # the engine has its threads back


@WHOLE_MACHINE
async def test_lock_step_after_overlap_gives_the_engine_its_threads_back(tmp_path: Path) -> None:
    trainer, before, after = await _train_pipeline(tmp_path / "a", steps=2, overlap=True)
    assert [r.metrics["train/pipeline_overlap"] for r in trainer.results] == [1.0, 1.0]
    # Overlapped, the engine sampled on its share of the cores; the pipeline's end gives
    # them back (sampling after it, an evaluation, runs on all of them).
    assert before == after == cpu_budget()
    trainer, before, after = await _train_pipeline(tmp_path / "b", steps=2 * PROBE_STEPS + 1)
    if trainer.overlap_chosen is False:  # the last step was lock-step, after overlapped ones
        assert after == before
    trainer, before, after = await _train_pipeline(tmp_path / "c", steps=2, overlap=False)
    assert [r.metrics["train/pipeline_overlap"] for r in trainer.results] == [0.0, 0.0]
    assert after == before


@WHOLE_MACHINE
async def test_a_model_registered_beside_a_split_samples_on_every_core(tmp_path: Path) -> None:
    """Another model's sampling/training split (its engine on its share of the cores) leaves
    the count new threads start on as it was: a model registered meanwhile gets every core.
    (torch starts new threads on the count last set in any thread.)"""
    torch.set_num_threads(cpu_budget())
    async with art.LocalBackend(path=tmp_path) as backend:
        first = art.TrainableModel(name="first", project="pipeline", base_model="tiny-random")
        await first.register(backend)
        split = backend.prepare_serve_while_training(first)
        assert split is not None
        first_thread = backend._entry(first).torch_thread
        assert first_thread.submit(torch.get_num_threads).result() == split.sampler_threads
        second = art.TrainableModel(name="second", project="pipeline", base_model="tiny-random")
        await second.register(backend)
        second_thread = backend._entry(second).torch_thread
        assert second_thread.submit(torch.get_num_threads).result() == cpu_budget()
        await backend.end_serve_while_training(first)
        assert first_thread.submit(torch.get_num_threads).result() == cpu_budget()


async def test_one_core_makes_the_default_pipeline_lock_step_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from art_core.backends import local

    monkeypatch.setattr(local, "cpu_budget", lambda: 1)
    with caplog.at_level("WARNING", logger="art_core.pipeline.trainer"):
        trainer, _, _ = await _train_pipeline(tmp_path / "auto", steps=2)
    assert trainer.overlap_chosen is False
    assert [r.metrics["train/pipeline_overlap"] for r in trainer.results] == [0.0, 0.0]
    assert "two CPU cores" in caplog.text and "not possible" in caplog.text
    with pytest.raises(ValueError, match="two CPU cores"):
        await _train_pipeline(tmp_path / "forced", steps=1, overlap=True)
