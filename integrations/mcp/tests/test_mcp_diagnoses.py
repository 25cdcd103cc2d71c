"""What ``art_mcp.train`` says when a run cannot learn: the diagnoses in each step line, the
step table and the final table; and the answer tool a task declares."""

from __future__ import annotations

import json
import sys

import art_mcp
import pytest
from art_mcp import HttpServer, RolloutSettings, Scenario
from mcp_support import SHOP_SCRIPT

import art_core as art
from art_core.testing.pytest_plugin import register_tiny_model

sys.path.insert(0, str(SHOP_SCRIPT.parent))
import shop_server

SETTINGS = RolloutSettings(
    tool_choice="required", parallel_tool_calls=False, max_turns=2, max_tokens=40
)


async def test_a_reward_that_never_varies_is_named_in_the_step_line_and_the_table(
    backend: art.LocalBackend, shop: HttpServer, capsys: pytest.CaptureFixture[str]
) -> None:
    model = await register_tiny_model(backend, "shop-flat", "mcp-diagnoses")
    scenarios = [Scenario.model_validate(s) for s in shop_server.scenarios()]
    report = await art_mcp.train(
        model,
        shop,
        scenarios[:4],
        steps=1,
        groups_per_step=2,
        rollouts_per_group=2,
        reward_fn=lambda scenario, trajectory: 0.0,  # a reward no run can move
        val_scenarios=scenarios[4:5],
        val_rollouts_per_scenario=1,
        settings=SETTINGS,
        config=art.TrainConfig(learning_rate=1e-3, lora_rank=4, lora_alpha=8),
    )
    [record] = report.steps
    codes = [d.code for d in record.diagnoses]
    assert "constant_reward" in codes
    out = capsys.readouterr().out
    step_line = next(line for line in out.splitlines() if line.startswith("step 0: reward"))
    assert "trained nothing" in step_line and f"why: {', '.join(codes)}" in step_line
    assert "    constant_reward: every one of the 4 runs got reward 0" in out
    table = report.table()
    assert "why it learned little (diagnoses)" in table
    assert "constant_reward (at 1 of 1 steps): every one of the 4 runs got reward 0" in table
    assert "check the reward function on a run you know is right" in table
    history = backend.model_folder(model).read_history()
    [diagnosed] = [r for r in history if r["split"] == "diagnoses"]
    assert [d["code"] for d in diagnosed["diagnoses"]] == codes


async def test_a_task_declares_its_answer_tool(backend: art.LocalBackend, shop: HttpServer) -> None:
    model = await register_tiny_model(backend, "shop-answer-tool", "mcp-diagnoses")
    settings = RolloutSettings(
        tool_choice="required",
        parallel_tool_calls=False,
        complete_task=False,
        tools=["get_price"],
        max_turns=3,
        max_tokens=60,
    )
    task = Scenario(task="What does a kettle cost?", answer_tool="get_price")
    trajectory = await art_mcp.rollout(model, task, shop, settings=settings)
    # The only tool is the answer tool: the first call of it ends the run, after running it.
    if trajectory.metadata["stop_reason"] == "answer_tool":
        assert trajectory.metrics["turns"] == 1 and trajectory.metrics["tool_calls"] == 1
        assert isinstance(json.loads(trajectory.metadata["final_answer"]), dict)
    else:  # a forced call cut by max_tokens: no call made, no answer
        assert trajectory.metadata["stop_reason"] == "no_tool_call"
    assert trajectory.metadata["answer_tool"] == "get_price"
    default = await art_mcp.rollout(
        model,
        task.model_copy(update={"answer_tool": None}),
        shop,
        settings=SETTINGS.__class__(max_turns=1, max_tokens=20),
    )
    assert default.metadata["answer_tool"] == "complete_task"
    with pytest.raises(ValueError, match="answer_tool 'submit' is not among the tools offered"):
        await art_mcp.rollout(
            model, task.model_copy(update={"answer_tool": "submit"}), shop, settings=settings
        )
