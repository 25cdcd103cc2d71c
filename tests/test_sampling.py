"""Dynamic sampling, adaptive group size and the scenario curriculum, on scripted rollouts.

The rollouts here are coroutines with scripted rewards (no model), so each test states
exactly which groups carry a signal and checks what was kept, discarded, spent and recorded.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import warnings
from collections import Counter

import pytest

import art_core as art
from art_core.sampling import ScenarioHistory, gather_groups_with_signal
from art_core.training.batch import prepare_batch


class Script:
    """Rollouts of scenario ``s``: the n-th run (counting from 0) of ``s`` scores
    ``rewards[s](n)``; every started run is counted."""

    def __init__(self, rewards):
        self.rewards = rewards
        self.started: Counter[str] = Counter()

    async def rollout(self, scenario: str) -> art.Trajectory:
        n = self.started[scenario]
        self.started[scenario] += 1
        await asyncio.sleep(0)
        return art.Trajectory(reward=self.rewards[scenario](n))

    @property
    def total(self) -> int:
        return sum(self.started.values())


def never(n: int) -> float:
    return 0.0


def always(n: int) -> float:
    return 1.0


def every(k: int):
    return lambda n: 1.0 if n % k == k - 1 else 0.0


# ------------------------------------------------------------------ gather_trajectory_groups
async def test_gather_keeps_only_groups_with_signal_from_an_endless_stream() -> None:
    # Scenario "s3k" has a signal (a success in every 2 runs), the others never succeed.
    names = [f"s{i}" for i in range(30)]
    script = Script({n: every(2) if int(n[1:]) % 3 == 0 else never for n in names})
    built = Counter[str]()

    def groups():
        for name in itertools.cycle(names):
            built[name] += 1
            yield art.TrajectoryGroup(script.rollout(name) for _ in range(4))

    kept = await art.gather_trajectory_groups(
        groups(), groups_with_signal=3, max_rollouts=400, pbar_desc=None
    )
    assert len(kept) == 3 and all(g.has_signal for g in kept)
    # Started in order s0 (signal), s1, s2 (all zero), s3, ..., s6: 7 groups, 28 rollouts,
    # and the stream was read no further than that.
    assert sum(built.values()) == 7 and script.total == 28
    metrics = kept[0].metrics
    assert metrics["sampling_groups_with_signal"] == 3
    assert metrics["sampling_groups_all_equal"] == 4
    assert metrics["sampling_rollouts"] == 28 == metrics["sampling_rollouts_all_equal"] + 12
    assert metrics["sampling_reward"] == pytest.approx(6 / 28)


async def test_gather_never_runs_more_rollouts_than_max_rollouts() -> None:
    script = Script({"s": never})
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no coroutine left unawaited
        kept = await art.gather_trajectory_groups(
            (art.TrajectoryGroup(script.rollout("s") for _ in range(8)) for _ in range(100)),
            groups_with_signal=2,
            max_rollouts=30,
            pbar_desc=None,
        )
        gc.collect()
    assert script.total == 24  # 3 groups of 8; the 4th would pass 30
    # No group had a signal: up to groups_with_signal all-equal groups come back so that
    # model.train still records the step (and skips them).
    assert len(kept) == 2 and not any(g.has_signal for g in kept)
    assert kept[0].metrics["sampling_groups_with_signal"] == 0
    assert kept[0].metrics["sampling_groups_all_equal"] == 3


async def test_gather_closes_prebuilt_groups_it_did_not_start() -> None:
    script = Script({"s": every(2)})
    groups = [art.TrajectoryGroup(script.rollout("s") for _ in range(2)) for _ in range(5)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        kept = await art.gather_trajectory_groups(
            groups, groups_with_signal=2, max_rollouts=100, pbar_desc=None
        )
        gc.collect()
    assert len(kept) == 2 and script.total == 4
    assert all(g.pending == 0 for g in groups)


async def test_gather_without_options_keeps_its_behaviour() -> None:
    script = Script({"a": never, "b": every(2)})
    groups = await art.gather_trajectory_groups(
        [art.TrajectoryGroup(script.rollout(s) for _ in range(2)) for s in "ab"], pbar_desc=None
    )
    assert [g.has_signal for g in groups] == [False, True]  # all groups, input order
    assert all(not g.metrics for g in groups)


async def test_gather_dynamic_options_are_validated() -> None:
    async def group() -> art.TrajectoryGroup:
        return art.TrajectoryGroup([])

    with pytest.raises(ValueError, match="max_rollouts"):
        await art.gather_trajectory_groups([], groups_with_signal=2, pbar_desc=None)
    with pytest.raises(ValueError, match="groups_with_signal"):
        await art.gather_trajectory_groups([], max_rollouts=10, pbar_desc=None)
    with pytest.raises(ValueError, match=">= 1"):
        await art.gather_trajectory_groups(
            [], groups_with_signal=0, max_rollouts=10, pbar_desc=None
        )
    with pytest.raises(ValueError, match=">= 1"):
        await art.gather_trajectory_groups(
            [], groups_with_signal=True, max_rollouts=10, pbar_desc=None
        )
    with pytest.raises(TypeError, match="TrajectoryGroup"):
        await art.gather_trajectory_groups(
            [group()], groups_with_signal=1, max_rollouts=10, pbar_desc=None
        )


async def test_gather_counts_failed_rollouts_against_max_exceptions() -> None:
    async def broken() -> art.Trajectory:
        raise ConnectionError("server down")

    with pytest.raises(art.TooManyExceptions, match="server down"):
        await art.gather_trajectory_groups(
            (art.TrajectoryGroup(broken() for _ in range(4)) for _ in range(10)),
            groups_with_signal=2,
            max_rollouts=40,
            max_exceptions=3,
            pbar_desc=None,
        )


# ------------------------------------------------------------------------- ScenarioSampler
async def test_sampler_grows_all_equal_groups_up_to_max_group_size() -> None:
    # "late" succeeds on its 7th run only: a group of 4 has no signal, grown to 8 it has.
    # "never" is given up on at max_group_size (12).
    script = Script({"late": lambda n: 1.0 if n == 6 else 0.0, "never": never})
    sampler = art.ScenarioSampler(
        ["late", "never"], script.rollout, group_size=4, max_group_size=12, seed=1
    )
    groups = await sampler.gather(2, max_rollouts=100, pbar_desc=None)
    report = sampler.last_report
    assert report is not None
    assert [len(g) for g in groups] == [8] and groups[0].metadata["scenario_key"] == "0"
    assert script.started == {"late": 8, "never": 12}
    assert report.groups_with_signal == 1 and report.groups_all_equal == 1
    assert report.groups_grown == 2 and report.rollouts_added == 4 + 8
    assert report.rollouts == 20 and report.stop_reason == "no_more_groups"


async def test_sampler_respects_the_rollout_budget_when_growing() -> None:
    script = Script({str(i): never for i in range(10)})
    sampler = art.ScenarioSampler(
        [str(i) for i in range(10)], script.rollout, group_size=4, max_group_size=32
    )
    groups = await sampler.gather(3, max_rollouts=50, pbar_desc=None)
    assert script.total == sampler.last_report.rollouts <= 50
    assert sampler.last_report.stop_reason == "max_rollouts"
    assert len(groups) <= 3 and all(len(g) <= 32 for g in groups)


async def test_sampler_without_dynamic_sampling_is_a_plain_batch_with_a_report() -> None:
    script = Script({"a": never, "b": every(2), "c": always})
    sampler = art.ScenarioSampler(list("abc"), script.rollout, group_size=2, dynamic_sampling=False)
    groups = await sampler.gather(3, max_rollouts=6, pbar_desc=None)
    assert len(groups) == 3 and script.total == 6
    report = sampler.last_report
    assert report.groups_with_signal == 1 and report.groups_all_equal == 2
    assert report.scenarios is not None
    assert (report.scenarios.never_solved, report.scenarios.always_solved) == (1, 1)
    assert report.scenarios.learning == 1
    assert groups[0].metrics["scenarios_never_solved"] == pytest.approx(1 / 3)


async def test_sampler_shuffle_visits_every_scenario_once_per_epoch() -> None:
    names = [str(i) for i in range(6)]
    script = Script(dict.fromkeys(names, every(2)))
    sampler = art.ScenarioSampler(names, script.rollout, group_size=2, seed=3)
    for _ in range(3):
        await sampler.gather(2, max_rollouts=4, pbar_desc=None)
    assert script.started == dict.fromkeys(names, 2)


async def test_curriculum_prefers_scenarios_solved_about_half_the_time() -> None:
    names = ["never", "half", "always", "rare"]
    script = Script({"never": never, "half": every(2), "always": always, "rare": every(8)})
    history = ScenarioHistory()
    for name, rewards in [
        ("never", [0.0] * 16),
        ("half", [0.0, 1.0] * 8),
        ("always", [1.0] * 16),
        ("rare", [0.0] * 15 + [1.0]),
    ]:
        history.record(str(names.index(name)), rewards)
    sampler = art.ScenarioSampler(
        names, script.rollout, group_size=4, curriculum=True, history=history, seed=0
    )
    first = Counter[str]()
    for _ in range(40):
        before = dict(script.started)
        await sampler.gather(1, max_rollouts=4, pbar_desc=None)
        first.update(k for k, v in script.started.items() if v != before.get(k, 0))
    assert first["half"] > first["rare"] > max(first["never"], first["always"])
    assert first["never"] > 0  # never-solved scenarios are still tried now and then
    # Same seed, same history: the same choices.
    again = art.ScenarioSampler(
        names, Script(script.rewards).rollout, group_size=4, curriculum=True, history=history
    )
    assert list(again._order()) == list(
        art.ScenarioSampler(
            names, script.rollout, group_size=4, curriculum=True, history=history
        )._order()
    )


async def test_sampler_scores_with_after_each_and_drops_what_it_drops() -> None:
    script = Script({"a": never, "b": never, "c": every(2)})
    scored = []

    def judge(group: art.TrajectoryGroup) -> art.TrajectoryGroup | None:
        # A judge that ranks runs; it gives up on scenario "b" (returns None).
        rewards = [t.reward for t in group.trajectories]
        scored.append(rewards)
        if group.metadata["scenario_key"] == "1":
            return None
        for rank, trajectory in enumerate(group.trajectories):
            trajectory.reward += rank * 0.1 if trajectory.reward == 0.0 and len(group) > 4 else 0
        return group

    sampler = art.ScenarioSampler(
        list("abc"), script.rollout, group_size=4, max_group_size=8, seed=0
    )
    groups = await sampler.gather(3, max_rollouts=100, after_each=judge, pbar_desc=None)
    report = sampler.last_report
    assert report.groups_dropped == 1
    # "a" had no signal at 4 runs; grown to 8 the judge saw 8 raw zeros (not its own
    # earlier scores) and gave them a ranking: now it has a signal.
    assert [0.0] * 8 in scored
    assert sorted(len(g) for g in groups) == [4, 8]


def test_sampler_rejects_bad_settings() -> None:
    async def rollout(s: str) -> art.Trajectory:
        return art.Trajectory()

    with pytest.raises(ValueError, match="no scenarios"):
        art.ScenarioSampler([], rollout)
    with pytest.raises(TypeError, match="sequence"):
        art.ScenarioSampler(iter(["a"]), rollout)
    with pytest.raises(ValueError, match="group_size"):
        art.ScenarioSampler(["a"], rollout, group_size=1)
    with pytest.raises(ValueError, match="max_group_size"):
        art.ScenarioSampler(["a"], rollout, group_size=8, max_group_size=4)
    with pytest.raises(ValueError, match="unique"):
        art.ScenarioSampler(["a", "a"], rollout, key=lambda s: s)
    with pytest.raises(ValueError, match="success_threshold"):
        art.ScenarioSampler(["a"], rollout, success_threshold=float("nan"))

    sampler = art.ScenarioSampler(["a"], rollout, group_size=4)
    with pytest.raises(ValueError, match="not even one group"):
        asyncio.run(sampler.gather(1, max_rollouts=3))
    with pytest.raises(ValueError, match="num_groups"):
        asyncio.run(sampler.gather(0, max_rollouts=8))


async def test_a_rollout_that_fails_to_start_is_a_failed_rollout() -> None:
    def rollout(s: str) -> art.Trajectory:
        raise RuntimeError("cannot start")

    sampler = art.ScenarioSampler(["a"], rollout, group_size=2)  # type: ignore[arg-type]
    with pytest.raises(art.TooManyExceptions, match="cannot start"):
        await sampler.gather(1, max_rollouts=4, pbar_desc=None)


# --------------------------------------------------------------------------- history + train
def test_history_keeps_a_bounded_window_and_round_trips() -> None:
    history = ScenarioHistory(window=3, success_threshold=0.5)
    history.record("a", [1.0, 1.0, 0.0, 0.2, 0.4])
    assert history.scenarios["a"].recent == [False, False, False]
    assert (history.scenarios["a"].attempts, history.scenarios["a"].successes) == (5, 2)
    assert history.success_rate("a") == 0.0
    assert ScenarioHistory.model_validate_json(history.model_dump_json()) == history
    weights = history.weights(["a", "untried"], 8)
    assert all(0 < w <= 1 for w in weights)


def test_train_step_records_the_sampling_report_as_group_metrics() -> None:
    from art_core.trajectories import LLMCall

    def run(reward: float) -> art.Trajectory:
        call = LLMCall(
            model="m", messages=[], prompt_token_ids=[1], completion_token_ids=[2], logprobs=[-1]
        )
        return art.Trajectory(calls=[call], reward=reward, metrics={"chars": 3})

    report = art.SamplingReport(groups_wanted=2, groups_with_signal=2, groups_all_equal=6)
    groups = [art.TrajectoryGroup([run(1.0), run(0.0)]) for _ in range(2)]
    for group in groups:
        group.metrics.update(report.metrics())
        group.metrics["chars"] = 7  # a group metric named like a trajectory metric
    metrics = prepare_batch(groups).metrics
    assert metrics["train/sampling_groups_with_signal"] == 2
    assert metrics["train/sampling_groups_all_equal"] == 6
    assert metrics["train/chars"] == 3 and metrics["train/group/chars"] == 7
    assert metrics["train/groups_skipped"] == 0


async def test_gather_groups_with_signal_validates_its_bounds() -> None:
    def none(left: int) -> None:
        return None

    for kwargs in (
        {"groups_with_signal": 0, "max_rollouts": 1},
        {"groups_with_signal": 1, "max_rollouts": 0},
        {"groups_with_signal": 1, "max_rollouts": 1, "max_group_size": 1},
        {"groups_with_signal": 1, "max_rollouts": 1, "max_concurrent_groups": 0},
    ):
        with pytest.raises(ValueError):
            await gather_groups_with_signal(none, **kwargs)
    groups, report = await gather_groups_with_signal(
        none, groups_with_signal=1, max_rollouts=1, pbar_desc=None
    )
    assert groups == [] and report.stop_reason == "no_more_groups"
