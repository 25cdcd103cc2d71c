"""``art_mcp`` warm start on tiny-random and the shop server: traces from the model's own best
runs or from a teacher (another model behind an OpenAI-compatible gateway), SFT, then GRPO;
and the time budget that makes runs with and without it comparable."""

from __future__ import annotations

import json
from dataclasses import replace

import art_mcp
import pytest
from art_mcp import HttpServer, WarmStart
from test_mcp_train import CONFIG, SETTINGS, shop_scenarios, varied_answer_reward

import art_core as art


def scored_runs(trajectory_groups: list[art.TrajectoryGroup]) -> list[float]:
    return [t.reward for g in trajectory_groups for t in g.trajectories]


async def test_warm_start_from_its_own_best_runs_then_grpo(
    backend: art.LocalBackend,
    shop: HttpServer,
) -> None:
    model = art.TrainableModel(name="shop-warm", project="mcp-tests", base_model="tiny-random")
    await model.register(backend)
    scenarios = shop_scenarios()
    varied = varied_answer_reward()
    # Every run reaches 0.0: the best run of each group is a trace, whatever was sampled.
    warm = WarmStart(traces=3, rollouts_per_scenario=2, min_reward=0.0, max_rollouts=12)
    report = await art_mcp.train(
        model,
        shop,
        scenarios[:6],
        steps=2,
        groups_per_step=2,
        rollouts_per_group=2,
        reward_fn=varied,
        val_scenarios=scenarios[6:8],
        val_rollouts_per_scenario=1,
        settings=SETTINGS,
        config=CONFIG,
        warm_start=warm,
    )
    warm_report = report.warm_start
    assert warm_report is not None and warm_report.source == "the model itself"
    assert warm_report.step == 1 and warm_report.traces == 3
    assert warm_report.rollouts == 6  # one round: 3 groups of 2
    assert warm_report.metrics["sft/records_token_exact"] == warm_report.traces
    assert "traces from the model itself" in warm_report.line()
    # The SFT step is step 1; one GRPO step follows to reach step 2.
    assert [r.step for r in report.steps] == [1] and report.after.step == 2
    assert report.training_s > 0
    history = backend.model_folder(model).read_history()
    # (besides the validation passes, and what the diagnoses found in tiny-random's runs)
    assert [h["split"] for h in history if h["split"] not in ("val", "diagnoses")] == [
        "sft",
        "train",
    ]
    sft = next(h for h in history if h["split"] == "sft")
    assert sft["checkpoint_step"] == 1 and sft["sft/num_records"] == warm_report.traces

    # A resumed run does not warm-start again.
    again = await art_mcp.train(
        model,
        shop,
        scenarios[:6],
        steps=3,
        groups_per_step=2,
        rollouts_per_group=2,
        reward_fn=varied,
        val_scenarios=scenarios[6:8],
        val_rollouts_per_scenario=1,
        settings=SETTINGS,
        config=CONFIG,
        warm_start=warm,
    )
    assert again.warm_start is None and [r.step for r in again.steps] == [2]


async def test_warm_start_from_a_teacher_and_a_time_budget(
    backend: art.LocalBackend,
    shop: HttpServer,
) -> None:
    teacher_model = art.TrainableModel(
        name="shop-teacher", project="mcp-tests", base_model="tiny-random-1"
    )
    await teacher_model.register(backend)
    teacher = art.Model(
        name="teacher",
        inference_base_url=backend.base_url,
        inference_model_name="shop-teacher",
        inference_api_key="x",
    )
    student = art.TrainableModel(name="shop-student", project="mcp-tests", base_model="tiny-random")
    await student.register(backend)
    scenarios = shop_scenarios()
    report = await art_mcp.warm_start(
        student,
        shop,
        scenarios[:4],
        WarmStart(
            traces=2,
            teacher=teacher,
            rollouts_per_scenario=2,
            min_reward=0.0,
            config=art.SFTConfig(lora_rank=4, lora_alpha=8, precision="fp32"),
        ),
        reward_fn=art_mcp.answer_reward,
        # Seeded: which of the teacher's runs end a turn within max_tokens (a trace) and which
        # are cut (dropped) is then the same on every machine. Unseeded, a run of the CI found
        # 1 trace in its 16 runs, not 2.
        settings=replace(SETTINGS, extra_body={"seed": 0}),
    )
    assert report.source == "teacher shop-teacher"
    assert report.step == 1 and report.traces == 2
    assert report.metrics["sft/records_rendered"] == 2
    # The teacher's runs were its own: recorded by the proxy, never in the student's record.
    logged = backend.model_folder(student).read_trajectories("sft", 0)
    calls = [c for g in logged for t in g.trajectories for c in t.calls]
    assert calls and all(c.model == "shop-teacher" and not c.prompt_token_ids for c in calls)
    assert all(json.dumps(c.metadata).count("teacher") for c in calls)

    # No step starts once the time budget is spent (here: at once).
    budgeted = await art_mcp.train(
        student,
        shop,
        scenarios[:4],
        steps=50,
        groups_per_step=1,
        rollouts_per_group=2,
        reward_fn=art_mcp.answer_reward,
        val_scenarios=scenarios[6:7],
        val_rollouts_per_scenario=1,
        settings=SETTINGS,
        config=CONFIG,
        time_budget_s=0.0,
    )
    assert budgeted.steps == [] and budgeted.after.step == 1
    with pytest.raises(ValueError, match="needs reward_fn"):
        await art_mcp.train(
            student,
            shop,
            scenarios[:4],
            judge=art_mcp.Judge("judge"),
            rollouts_per_group=2,
            warm_start=WarmStart(traces=1),
        )
    with pytest.raises(ValueError, match="at least 1 trace"):
        WarmStart(traces=0)
