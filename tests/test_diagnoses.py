"""The diagnoses (``art_core.diagnoses``): one tiny run built to show each rule, a healthy run on
which none fires, and a real step through the gateway whose diagnoses reach the result, the
history and the log."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

import art_core as art
from art_core.diagnoses import RunDiagnoses, diagnose
from art_core.diagnoses.facts import ToolCall, argument_error
from art_core.diagnoses.rules import (
    ALL_EQUAL_GROUP_SHARE,
    ANSWER_WITH_LOOKUP_SHARE,
    REPEATED_CALL_SHARE,
    TOOL_ERROR_SHARE,
    TRUNCATED_SHARE,
)
from art_core.testing.pytest_plugin import register_tiny_model

LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup_order",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
            "additionalProperties": False,
        },
    },
}
ANSWER = {
    "type": "function",
    "function": {
        "name": "complete_task",
        "parameters": {
            "type": "object",
            "properties": {"answer": {"type": "string"}},
            "required": ["answer"],
        },
    },
}
TOOLS = [LOOKUP, ANSWER]


def call(index: int, *tool_calls: tuple[str, dict[str, Any] | str], **fields: Any) -> art.LLMCall:
    """One recorded response calling ``tool_calls`` (name, arguments)."""
    message: dict[str, Any] = {"role": "assistant", "content": None}
    if tool_calls:
        message["tool_calls"] = [
            {
                "id": f"c{index}_{n}",
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
            for n, (name, args) in enumerate(tool_calls)
        ]
    else:
        message["content"] = "the answer"
    return art.LLMCall(
        model="m",
        index=index,
        messages=[{"role": "user", "content": "Where is order A1?"}],
        tools=TOOLS,
        request_params=fields.pop("request_params", {"max_tokens": 64}),
        prompt_token_ids=[1, 2],
        completion_token_ids=[3, 4],
        logprobs=[-0.1, -0.2],
        response_message=message,
        **fields,
    )


def run(
    reward: float, *calls: art.LLMCall, answered: bool = True, **metrics: Any
) -> art.Trajectory:
    metadata = {
        "answer_tool": "complete_task",
        "final_answer": f"answer {reward}" if answered else None,
        "stop_reason": "complete_task" if answered else "max_turns",
    }
    return art.Trajectory(reward=reward, calls=list(calls), metadata=metadata, metrics=metrics)


def healthy_run(reward: float) -> art.Trajectory:
    """Look up, read the result, then answer: one call per turn, no errors."""
    return run(
        reward,
        call(0, ("lookup_order", {"order_id": "A1"})),
        call(1, ("complete_task", {"answer": "shipped"})),
        tool_calls=1,
        tool_errors=0,
    )


def groups_of(runs: list[art.Trajectory], size: int = 4) -> list[art.TrajectoryGroup]:
    return [art.TrajectoryGroup(runs[i : i + size]) for i in range(0, len(runs), size)]


def codes(groups: list[art.TrajectoryGroup]) -> list[str]:
    return [d.code for d in diagnose(groups)]


def test_a_healthy_run_fires_nothing() -> None:
    rewards = [0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.5, 1.0]
    assert codes(groups_of([healthy_run(r) for r in rewards])) == []
    assert RunDiagnoses().table() == ""


def test_the_answer_given_in_the_same_turn_as_the_lookup() -> None:
    # Qwen2.5-0.5B on a PyPI MCP server: the lookup and complete_task with a guess, in one turn.
    guessing = [
        run(
            0.0,
            call(
                0,
                ("lookup_order", {"order_id": "A1"}),
                ("complete_task", {"answer": "delivered"}),
                request_params={"max_tokens": 64},
            ),
            tool_calls=1,
            tool_errors=0,
        )
        for _ in range(8)
    ]
    # Every guess scored 0 (as on that server): the specific cause is named first.
    diagnosis, second = diagnose(groups_of(guessing))
    assert (diagnosis.code, second.code) == ("answer_with_lookup", "constant_reward")
    assert diagnosis.share == 1.0 and diagnosis.threshold == ANSWER_WITH_LOOKUP_SHARE
    assert "in 8 of 8 runs" in diagnosis.finding and "lookup_order" in diagnosis.finding
    assert "parallel_tool_calls requested: None" in diagnosis.finding
    assert "parallel_tool_calls=False" in diagnosis.setting
    assert "--one-call-per-turn" in diagnosis.setting
    # Asked for already, under tool_choice "auto": the gateway samples free text there and the
    # model wrote both calls anyway (the real Qwen2.5-0.5B did): how to have it enforced.
    for trajectory in guessing:
        trajectory.calls[0].request_params.update(parallel_tool_calls=False, tool_choice="auto")
    asked = diagnose(groups_of(guessing))[0]
    assert "parallel_tool_calls requested: False" in asked.finding
    assert asked.setting.startswith(
        "parallel_tool_calls=False was asked for but tool_choice 'auto' does not enforce it: "
        "tool_choice='required' with parallel_tool_calls=False"
    )
    # Below the threshold (1 of 8 runs) it stays quiet.
    mixed = guessing[:1] + [healthy_run(r) for r in [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0]]
    assert 1 / 8 < ANSWER_WITH_LOOKUP_SHARE
    assert "answer_with_lookup" not in codes(groups_of(mixed))


def test_invented_arguments_are_counted_by_kind() -> None:
    inventing = [
        run(
            float(i % 2),
            call(0, ("lookup_order", {"order_number": "A1"})),  # not in the schema
            call(1, ("lookup_order", {"order_id": "ZZ"})),  # fits; the tool says no such order
            call(2, ("complete_task", {"answer": "x"})),
            tool_calls=2,
            tool_errors=2,
        )
        for i in range(4)
    ]
    (diagnosis,) = diagnose(groups_of(inventing))
    assert diagnosis.code == "tool_errors" and diagnosis.unit == "tool calls"
    # 12 tool calls (complete_task counts), 8 failed: 4 invented, 4 returned by the tool
    assert diagnosis.finding.startswith("8 of 12 tool calls failed")
    assert "invented argument 4, e.g. lookup_order(" in diagnosis.finding
    assert "error returned by the tool 4" in diagnosis.finding
    assert diagnosis.share == pytest.approx(8 / 12) and diagnosis.threshold == TOOL_ERROR_SHARE
    assert "strict_schemas=True" in diagnosis.setting
    # Seen with the real Qwen2.5-0.5B: the schema was closed already (art_mcp's default) and the
    # model wrote `"additionalProperties": false` as an argument; only tool_choice="required"
    # makes a grammar enforce the schema.
    closed = {**ANSWER["function"]["parameters"], "additionalProperties": False}
    for trajectory in inventing:
        for recorded in trajectory.calls:
            recorded.tools = [
                LOOKUP,
                {"type": "function", "function": {"name": "complete_task", "parameters": closed}},
            ]
            recorded.request_params["tool_choice"] = "auto"
    (closed_schemas,) = diagnose(groups_of(inventing))
    assert closed_schemas.setting.startswith(
        "the schemas are closed (additionalProperties: false) but tool_choice 'auto' does not "
        "enforce them: tool_choice='required'"
    )


def test_a_hostile_schema_pattern_cannot_hang_the_check() -> None:
    """A tool's own regular expression is not run on model-written text: ``(a+)+$`` on 40
    a's and a b would backtrack for longer than any step."""
    schemas = {
        "f": {"type": "object", "properties": {"x": {"type": "string", "pattern": "(a+)+$"}}}
    }
    assert argument_error(ToolCall("f", json.dumps({"x": "a" * 40 + "b"})), schemas) is None
    assert (
        argument_error(ToolCall("f", json.dumps({"x": 3})), schemas)
        == "argument of the wrong type or value"
    )


def test_arguments_cut_by_the_token_limit_are_not_blamed_on_the_schema() -> None:
    cut = [
        run(
            0.0,
            call(0, ("lookup_order", '{"order_id": "A1'), finish_reason="length"),
            tool_calls=1,
            tool_errors=1,
        )
        for _ in range(4)
    ]
    diagnosis = diagnose(groups_of(cut))[0]
    assert diagnosis.code == "tool_errors"
    assert diagnosis.finding.startswith("4 of 4 tool calls failed: arguments cut by max_tokens 4")
    assert diagnosis.setting.startswith("raise max_tokens")


def test_the_same_call_repeated_until_the_turn_limit() -> None:
    looping = [
        run(
            0.0,
            *(call(i, ("lookup_order", {"order_id": "A1"})) for i in range(4)),
            answered=False,
            tool_calls=4,
            tool_errors=0,
        )
        for _ in range(3)
    ]
    rest = [healthy_run(r) for r in [1.0, 0.0, 1.0, 0.0, 1.0]]
    diagnoses = diagnose(groups_of(looping + rest))
    assert [d.code for d in diagnoses] == ["repeated_calls"]
    (diagnosis,) = diagnoses
    assert "3 of 8 runs" in diagnosis.finding
    assert 'lookup_order({"order_id": "A1"}) 4 times' in diagnosis.finding
    assert diagnosis.share == 3 / 8 >= REPEATED_CALL_SHARE
    assert "--system-prompt" in diagnosis.setting
    # A run that repeated a call but then answered is not stuck.
    answered = [
        run(
            float(i % 2),
            call(0, ("lookup_order", {"order_id": "A1"})),
            call(1, ("lookup_order", {"order_id": "A1"})),
            call(2, ("complete_task", {"answer": "x"})),
        )
        for i in range(8)
    ]
    assert "repeated_calls" not in codes(groups_of(answered))


def test_answers_cut_by_max_tokens() -> None:
    cut = [
        run(
            float(i % 2),
            call(0, finish_reason="length", request_params={"max_tokens": 16}),
            tool_calls=0,
        )
        for i in range(3)
    ]
    diagnoses = diagnose(groups_of(cut + [healthy_run(r) for r in [1.0, 0.0, 1.0, 0.0, 1.0]]))
    (diagnosis,) = diagnoses
    assert diagnosis.code == "truncated"
    assert diagnosis.finding == "3 of 8 runs had a response cut by max_tokens (16)"
    assert diagnosis.share == 3 / 8 >= TRUNCATED_SHARE
    assert "--max-tokens" in diagnosis.setting


def test_a_reward_that_never_varies() -> None:
    runs = [healthy_run(0.0) for _ in range(8)]
    for n, trajectory in enumerate(runs):
        trajectory.metadata["final_answer"] = f"answer {n % 3}"
    (diagnosis,) = diagnose(groups_of(runs))
    assert diagnosis.code == "constant_reward"
    assert diagnosis.finding.startswith("every one of the 8 runs got reward 0")
    assert "final answers differed (3 distinct)" in diagnosis.finding
    assert "check the reward function" in diagnosis.setting


def test_groups_all_equal_while_rewards_vary_across_groups() -> None:
    solved = [healthy_run(1.0) for _ in range(4)]
    unsolved = [healthy_run(0.0) for _ in range(8)]
    mixed = [healthy_run(r) for r in [0.0, 1.0, 0.0, 1.0]]
    (diagnosis,) = diagnose(groups_of(solved + unsolved + mixed))
    assert diagnosis.code == "all_equal_groups" and diagnosis.unit == "groups"
    # The solved group is all-equal at the best reward: a task learned, not a problem.
    assert diagnosis.finding.startswith("2 of 4 groups had all-equal rewards below the best")
    assert diagnosis.share == 0.5 >= ALL_EQUAL_GROUP_SHARE
    assert "--rollouts-per-group" in diagnosis.setting
    # Dynamic sampling handed over only the group with a signal; its report says how many
    # all-equal groups it discarded: those count.
    kept = groups_of(mixed)
    kept[0].metrics["sampling_groups_all_equal"] = 5.0
    assert codes(kept) == ["all_equal_groups"]
    assert "5 of 6 groups" in diagnose(kept)[0].finding
    assert "5 of them discarded by dynamic sampling" in diagnose(kept)[0].finding
    # Mostly solved: the all-equal groups sit at the best reward, nothing fires.
    assert codes(groups_of(solved + solved + mixed)) == []


def test_rewards_flat_over_the_steps_in_the_run_table() -> None:
    run_diagnoses = RunDiagnoses()
    constant = diagnose(groups_of([healthy_run(0.0) for _ in range(4)]))
    for step in range(3):
        run_diagnoses.add(step, reward=0.0, trained=False, diagnoses=constant)
    table = run_diagnoses.table()
    assert table.startswith("why it learned little (diagnoses)")
    assert "constant_reward (at 3 of 3 steps): every one of the 4 runs got reward 0" in table
    assert "flat_rewards: over 3 steps no step trained" in table
    # A run that trains and moves has no run-level diagnosis.
    moving = RunDiagnoses()
    for step, reward in enumerate([0.1, 0.3, 0.6]):
        moving.add(step, reward=reward, trained=True, diagnoses=[])
    assert moving.run_level() == [] and moving.table() == ""


async def test_a_real_step_reports_its_diagnoses(
    backend: art.LocalBackend, caplog: pytest.LogCaptureFixture
) -> None:
    """Rollouts through the gateway with a 2-token limit and a reward that is always 0: the
    step trains nothing, and says why (truncated, constant reward) in its result, the history
    and the log."""
    model = await register_tiny_model(backend, "diagnosed", "diagnoses-tests")

    async def rollout(n: int) -> art.Trajectory:
        async with art.capture(model) as run:
            async with run.openai_client() as client:
                await client.chat.completions.create(
                    model=run.model_name,
                    messages=[{"role": "user", "content": f"Count to {n}."}],
                    max_tokens=2,
                    temperature=1.0,
                    # Seeded: unseeded, tiny-random ended 1 of 8 answers within 2 tokens in one
                    # CI run, and the finding counted 7 of 8 runs cut.
                    seed=n,
                )
        return run.trajectory(reward=0.0)

    groups = [art.TrajectoryGroup([rollout(4 * g + i) for i in range(4)]) for g in range(2)]
    groups = await art.gather_trajectory_groups(groups, pbar_desc=None)
    with caplog.at_level(logging.WARNING, logger="art_core.backends.local"):
        result = await model.train(groups, config=art.TrainConfig(learning_rate=1e-3))
    assert result.nothing_trained is not None and result.step == 0
    found = {d.code: d for d in result.diagnoses}
    assert set(found) == {"truncated", "constant_reward"}
    # Every call of tiny-random is cut at 2 tokens: the limit the requests asked for is named.
    assert found["truncated"].finding == "8 of 8 runs had a response cut by max_tokens (2)"
    records = [
        r for r in backend.model_folder(model).read_history() if r.get("split") == "diagnoses"
    ]
    assert len(records) == 1 and records[0]["step"] == 0
    assert [d["code"] for d in records[0]["diagnoses"]] == [d.code for d in result.diagnoses]
    assert "why step 1 trained nothing" in caplog.text and "truncated: 8 of 8 runs" in caplog.text
