"""``art_mcp.train`` end to end on tiny-random: the shop example server, a programmatic reward
or RULER (stand-in judge), checkpoints, history, resume."""

from __future__ import annotations

import importlib
import itertools
import json
import sys
from typing import Any

import art_mcp
import pytest
from art_mcp import HttpServer, Judge, RolloutSettings, Scenario
from mcp_support import SHOP_SCRIPT

import art_core as art
from art_core.rewards import build_judge_prompt, ruler_score_group
from art_core.testing.judge import StandInJudge
from art_core.testing.pytest_plugin import register_tiny_model

sys.path.insert(0, str(SHOP_SCRIPT.parent))
import shop_server

SETTINGS = RolloutSettings(
    tool_choice="required",
    parallel_tool_calls=False,
    max_turns=2,
    max_tokens=40,
    max_answer_chars=12,
)
CONFIG = art.TrainConfig(learning_rate=1e-3, lora_rank=4, lora_alpha=8)


def shop_scenarios() -> list[Scenario]:
    return [Scenario.model_validate(s) for s in shop_server.scenarios()]


def varied_answer_reward() -> art_mcp.RewardFn:
    """``answer_reward`` plus a different small amount for every run: each GRPO group has a
    signal whatever tiny-random samples, so these tests of the warm start's mechanics (which
    step is which, what the history holds) do not depend on sampling luck."""
    runs = itertools.count()

    def reward(scenario: art_mcp.Scenario, trajectory: art.Trajectory) -> float:
        # kept in [0, 1] like the answer reward itself
        return min(1.0, art_mcp.answer_reward(scenario, trajectory) + 0.001 * (next(runs) % 100))

    return reward


async def test_train_two_steps_then_resume_for_a_third(
    backend: art.LocalBackend,
    shop: HttpServer,
) -> None:
    model = await register_tiny_model(backend, "shop-tiny", "mcp-tests")
    scenarios = shop_scenarios()
    run: dict[str, Any] = {
        "groups_per_step": 2,
        "rollouts_per_group": 3,
        # a signal in every group, so each step trains whatever tiny-random samples
        "reward_fn": varied_answer_reward(),
        "val_scenarios": scenarios[6:8],
        "val_rollouts_per_scenario": 1,
        "settings": SETTINGS,
        "config": CONFIG,
    }
    steps_seen: list[int] = []
    report = await art_mcp.train(
        model, shop, scenarios[:6], steps=2, on_step=lambda r: steps_seen.append(r.step), **run
    )
    assert steps_seen == [0, 1] and [r.step for r in report.steps] == [0, 1]
    assert await model.get_step() == 2
    assert (report.before.step, report.after.step) == (0, 2)
    for record in report.steps:
        assert record.rollouts == 6 and record.failed == 0
        assert 0.0 <= record.reward <= 1.0 and "train/loss" in record.metrics
    assert len(report.before.rewards) == len(report.after.rewards) == 2
    assert "mean reward" in report.table() and "after (step 2)" in report.table()

    folder = backend.model_folder(model)
    history = [json.loads(line) for line in (folder / "history.jsonl").read_text().splitlines()]
    val_steps = [h["step"] for h in history if h.get("split") == "val"]
    assert val_steps == [0, 2]
    trained = (folder / "trajectories" / "train" / "0000.jsonl").read_text().splitlines()
    group = art.TrajectoryGroup.model_validate_json(trained[0])
    assert group.trajectories[0].metadata["mcp_server"] == shop.label
    assert group.trajectories[0].metadata["split"] == "train"

    # running again resumes from the checkpoint step: only step 2 remains
    again = await art_mcp.train(model, shop, scenarios[:6], steps=3, **run)
    assert [r.step for r in again.steps] == [2]
    assert (again.before.step, again.after.step) == (2, 3)
    # the same step takes the same scenarios, so a resumed run follows the same schedule
    assert art_mcp.scenarios_for_step(scenarios[:6], 2, 2) == art_mcp.scenarios_for_step(
        scenarios[:6], 2, 2
    )


async def test_train_with_ruler_judges_before_and_after_together(
    backend: art.LocalBackend,
    shop: HttpServer,
    judge: StandInJudge,  # its RULER cache is this test's: every verdict is a fresh request
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    judged: list[art.TrajectoryGroup] = []

    async def recording_ruler(group: art.TrajectoryGroup, *args: Any, **kwargs: Any) -> Any:
        judged.append(group)
        return await ruler_score_group(group, *args, **kwargs)

    # Where art_mcp.train calls it (the module: `art_mcp.train` is also the function).
    monkeypatch.setattr(
        importlib.import_module("art_mcp.train"), "ruler_score_group", recording_ruler
    )
    model = await register_tiny_model(backend, "shop-ruler", "mcp-tests")
    scenarios = shop_scenarios()
    report = await art_mcp.train(
        model,
        shop,
        scenarios[:4],
        steps=1,
        groups_per_step=2,
        rollouts_per_group=2,
        judge=Judge(model="stand-in", base_url=judge.base_url),
        val_scenarios=scenarios[4:6],
        val_rollouts_per_scenario=2,
        settings=SETTINGS,
        config=CONFIG,
    )
    # 2 training groups + 2 joint validation groups (before and after runs side by side)
    assert len(judge.requests) == 4
    joint_groups = judged[-2:]
    assert [len(group.trajectories) for group in joint_groups] == [4, 4]
    for request, group in zip(judge.requests[-2:], joint_groups, strict=True):
        # the judge sees every distinct conversation of the 2 + 2 runs once (RULER shows
        # identical runs once, and tiny-random's before and after runs can coincide)
        distinct = build_judge_prompt([t.messages() for t in group.trajectories]).run_ids
        assert request["messages"][-1]["content"].count('<run id="') == len(distinct)
    assert report.judged_jointly and "RULER" in report.table()
    assert len(report.before.rewards) == len(report.after.rewards) == 4
    assert all(0.0 <= r <= 1.0 for r in [*report.before.rewards, *report.after.rewards])
    assert report.steps[0].rollouts == 4


async def test_train_rejects_a_run_without_a_reward(
    backend: art.LocalBackend,
) -> None:
    model = art.TrainableModel(name="shop-none", project="mcp-tests", base_model="tiny-random")
    with pytest.raises(ValueError, match="train needs a reward"):
        await art_mcp.train(model, "python x.py", shop_scenarios())
    with pytest.raises(ValueError, match="rollouts_per_group must be >= 2"):
        await art_mcp.train(
            model, "python x.py", shop_scenarios(), judge=Judge("j"), rollouts_per_group=1
        )


def test_answer_reward_gives_partial_credit() -> None:
    scenario = Scenario(task="How much does a pear cost?", answer="23")

    def run(final: str | None, tool_result: str | None) -> art.Trajectory:
        messages = [{"role": "user", "content": scenario.task}]
        if tool_result is not None:
            messages.append({"role": "tool", "tool_call_id": "c", "content": tool_result})
        call = art.LLMCall(
            model="m",
            messages=messages,
            prompt_token_ids=[1],
            completion_token_ids=[2],
            logprobs=[-0.1],
        )
        return art.Trajectory(calls=[call], metadata={"final_answer": final})

    found = "One pear costs 23 coins."
    assert art_mcp.answer_reward(scenario, run("It costs 23 coins.", found)) == 1.0
    assert art_mcp.answer_reward(scenario, run("It costs 230.", found)) == 0.5
    assert art_mcp.answer_reward(scenario, run(None, found)) == 0.3
    assert art_mcp.answer_reward(scenario, run("About 20?", None)) == 0.2
    wrong_tool = run("It is 91.", "There are 91 pears in stock.")
    assert art_mcp.answer_reward(scenario, wrong_tool) == pytest.approx(0.3)
    assert art_mcp.answer_reward(scenario, run(None, "Error executing tool get_price")) == 0.0
    assert art_mcp.answer_reward(scenario, run(None, None)) == 0.0


async def test_train_with_dynamic_sampling_reports_what_it_discarded(
    backend: art.LocalBackend,
    shop: HttpServer,
) -> None:
    # A reward no run earns: every group is all-equal, grown from 2 to 4 runs and discarded,
    # until the step's budget of 12 rollouts is spent. The step is still recorded.
    model = await register_tiny_model(backend, "shop-sparse", "mcp-tests")
    report = await art_mcp.train(
        model,
        shop,
        shop_scenarios()[:6],
        steps=1,
        groups_per_step=1,
        rollouts_per_group=2,
        reward_fn=lambda scenario, trajectory: 0.0,
        val_scenarios=shop_scenarios()[6:7],
        val_rollouts_per_scenario=1,
        settings=SETTINGS,
        config=CONFIG,
        dynamic_sampling=True,
        max_group_size=4,
        max_rollouts_per_step=12,
        curriculum=True,
    )
    (record,) = report.steps
    assert record.groups_with_signal == 0 and record.groups_all_equal == 3
    assert record.rollouts_spent == 12 and record.never_solved == 1.0
    history = [
        json.loads(line)
        for line in (backend.model_folder(model) / "history.jsonl").read_text().splitlines()
    ]
    (train,) = [h for h in history if h.get("split") == "train"]
    assert train["train/sampling_rollouts"] == 12
    assert train["train/sampling_groups_all_equal"] == 3
    assert train["train/scenarios_never_solved"] == 1.0
    assert train["train/groups_skipped"] == 1  # the all-equal group returned to record the step

    with pytest.raises(ValueError, match="max_group_size"):
        await art_mcp.train(
            model, shop, shop_scenarios(), reward_fn=art_mcp.answer_reward, max_group_size=1
        )
