"""SFT data without a model: what ``train_sft`` accepts, how records are named and checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sft_support import TOOLS, shop_record, tool_call

import art_core as art
from art_core.sft.data import (
    Demonstration,
    chat_record_to_trajectory,
    chat_turns,
    check_demonstration,
    demonstrations,
    load_chat_jsonl,
)


def write_jsonl(path: Path, lines: list) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


# ------------------------------------------------------------------------------ inputs
def test_a_jsonl_file_of_chat_records_trajectories_and_groups(tmp_path: Path) -> None:
    trajectory = art.Trajectory(
        messages_and_choices=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
        ]
    )
    group = art.TrajectoryGroup([trajectory, trajectory.model_copy(update={"reward": 1.0})])
    path = write_jsonl(
        tmp_path / "data.jsonl",
        [shop_record(), "", trajectory.model_dump(mode="json"), group.model_dump(mode="json")],
    )
    demos = demonstrations(path)
    assert [d.label for d in demos] == [
        "data.jsonl:1",
        "data.jsonl:3",
        "data.jsonl:4.trajectories[0]",
        "data.jsonl:4.trajectories[1]",
    ]
    assert demos[0].trajectory.tools == TOOLS
    assert demos[0].trajectory.metadata == {"source": "data.jsonl:1"}
    assert [t.metadata.get("source") for t in load_chat_jsonl(str(path))][:1] == ["data.jsonl:1"]


def test_an_iterable_of_trajectories_groups_and_records() -> None:
    recorded = art.Trajectory(id="rollout_1")
    loaded = art.Trajectory(metadata={"source": "demos.jsonl:9"})
    group = art.TrajectoryGroup([art.Trajectory(id="rollout_2"), art.Trajectory(id="rollout_3")])
    demos = demonstrations([recorded, loaded, group, shop_record()])
    assert [d.label for d in demos] == [
        "data[0] (trajectory rollout_1)",
        "data[1] (demos.jsonl:9)",
        "data[2].trajectories[0] (trajectory rollout_2)",
        "data[2].trajectories[1] (trajectory rollout_3)",
        "data[3]",
    ]
    kept = Demonstration("mine", recorded)
    assert demonstrations([kept]) == [kept]
    assert demonstrations(recorded)[0].trajectory is recorded  # a single trajectory


def test_inputs_that_are_not_sft_data_are_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no SFT data file"):
        demonstrations(tmp_path / "missing.jsonl")
    bad = write_jsonl(tmp_path / "bad.jsonl", [shop_record(), "{not json"])
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: not valid JSON"):
        demonstrations(bad)
    wrong = write_jsonl(tmp_path / "wrong.jsonl", [[1, 2]])
    with pytest.raises(ValueError, match=r"wrong\.jsonl:1: expected a JSON object"):
        demonstrations(wrong)
    with pytest.raises(
        ValueError,
        match=r"data\[1\]: a chat record has 'messages'.*unknown keys \['completion', 'prompt'\]",
    ):
        demonstrations([shop_record(), {"prompt": "hi", "completion": "there"}])
    with pytest.raises(ValueError, match=r"data\[0\]: 'messages' must be a list"):
        demonstrations([{"messages": "hi"}])
    with pytest.raises(TypeError, match=r"data\[0\]: expected a Trajectory"):
        demonstrations([42])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="a path to a JSONL file or an iterable"):
        demonstrations({"messages": []})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"data\[0\]: not a valid trajectory"):
        demonstrations([{"calls": "x"}])

    async def later() -> art.Trajectory:
        return art.Trajectory()

    pending = art.TrajectoryGroup([later()])
    with pytest.raises(ValueError, match="rollouts that have not run"):
        demonstrations([pending])
    pending.cancel_pending()


def test_chat_record_to_trajectory() -> None:
    trajectory = chat_record_to_trajectory(shop_record(), source="x.jsonl:1")
    assert trajectory.messages()[-1]["content"] == "A pear costs 3."
    assert trajectory.reward == 1.0
    with pytest.raises(ValueError, match="x: 'tools' must be a list"):
        chat_record_to_trajectory({"messages": [], "tools": {"a": 1}}, source="x")


# ------------------------------------------------------------------------------ rejection sampling
def test_best_trajectories_per_group_and_threshold() -> None:
    def group(*rewards: float) -> art.TrajectoryGroup:
        return art.TrajectoryGroup([art.Trajectory(id=f"t{r}", reward=r) for r in rewards])

    groups = [group(0.1, 0.9, 0.5), group(0.0, 0.0), group(1.0, 1.0, 0.2)]
    assert [t.id for t in art.best_trajectories(groups)] == ["t0.9", "t0.0", "t1.0"]
    assert [t.reward for t in art.best_trajectories(groups, per_group=2)] == [
        0.9,
        0.5,
        0.0,
        0.0,
        1.0,
        1.0,
    ]
    assert [t.reward for t in art.best_trajectories(groups, min_reward=0.5)] == [0.9, 1.0]
    with pytest.raises(ValueError, match="per_group"):
        art.best_trajectories(groups, per_group=0)
    with pytest.raises(TypeError, match=r"groups\[0\] is a Trajectory"):
        art.best_trajectories([art.Trajectory()])  # type: ignore[list-item]


# ------------------------------------------------------------------------------ checks
def demo(record: dict, label: str = "rec") -> Demonstration:
    return Demonstration(label, chat_record_to_trajectory(record))


def test_turns_of_a_tool_conversation() -> None:
    turns = chat_turns(demo(shop_record()))
    assert [t.answer["content"] for t in turns] == ["", "A pear costs 3."]
    assert [len(t.messages) for t in turns] == [2, 4]
    # Arguments are canonical JSON, as the gateway's tool-call grammar writes them.
    assert turns[0].answer["tool_calls"][0]["function"]["arguments"] == '{"item": "pear"}'
    assert turns[1].messages[2]["tool_calls"][0]["function"]["arguments"] == '{"item": "pear"}'
    last = chat_turns(demo(shop_record()), "last")
    assert [t.trained for t in last] == [False, True]


def test_weight_zero_turns_are_context() -> None:
    record = shop_record()
    record["messages"][2]["weight"] = 0
    assert [t.trained for t in chat_turns(demo(record))] == [False, True]
    record["messages"][4]["weight"] = 0
    with pytest.raises(ValueError, match=r"rec: no assistant turn to train on \(each has weight 0"):
        chat_turns(demo(record))
    record["messages"][1]["weight"] = 1
    with pytest.raises(ValueError, match=r"messages\[1\]: 'weight' is 0 or 1, on assistant"):
        chat_turns(demo(record))


def test_answers_cut_by_max_tokens_are_context_unless_recorded() -> None:
    cut_choice = {
        "finish_reason": "length",
        "index": 0,
        "message": tool_call("get_price", '{"item": "pe'),
    }
    trajectory = art.Trajectory(
        messages_and_choices=[
            {"role": "user", "content": "pear?"},
            {"role": "assistant", "content": "Let me look."},
            {"role": "user", "content": "go on"},
            cut_choice,
        ],
        tools=TOOLS,
    )
    turns = chat_turns(Demonstration("t", trajectory))
    assert [t.trained for t in turns] == [True, False]
    assert [t.trained for t in chat_turns(Demonstration("t", trajectory), "last")] == [True, False]
    only_cut = art.Trajectory(
        messages_and_choices=[{"role": "user", "content": "x"}, cut_choice], tools=TOOLS
    )
    with pytest.raises(
        ValueError, match=r"t: no assistant turn to train on .each has weight 0 or was cut"
    ):
        chat_turns(Demonstration("t", only_cut))


def test_bad_records_are_named() -> None:
    with pytest.raises(ValueError, match="q: no assistant turn to train on"):
        check_demonstration(demo({"messages": [{"role": "user", "content": "hi"}]}, "q"))
    unknown = shop_record()
    unknown["messages"][2] = tool_call("get_stock", '{"item": "pear"}')
    with pytest.raises(
        ValueError, match=r"rec: messages\[2\] calls tool 'get_stock', which is not listed"
    ):
        check_demonstration(demo(unknown))
    no_tools = shop_record()
    del no_tools["tools"]
    with pytest.raises(ValueError, match="the record lists no tools"):
        check_demonstration(demo(no_tools))
    bad_arguments = shop_record()
    bad_arguments["messages"][2] = tool_call("get_price", "pear")
    with pytest.raises(ValueError, match="arguments must be a JSON object"):
        check_demonstration(demo(bad_arguments))
    listed = shop_record()
    listed["messages"][2] = tool_call("get_price", "[1, 2]")
    with pytest.raises(ValueError, match="arguments must be a JSON object"):
        check_demonstration(demo(listed))
    bad_role = {
        "messages": [{"role": "robot", "content": "x"}, {"role": "assistant", "content": "y"}]
    }
    with pytest.raises(ValueError, match=r"rec: messages\[0\] is not a valid message: role"):
        check_demonstration(demo(bad_role))
    bad_tool = shop_record()
    bad_tool["tools"] = [{"type": "function", "function": {"name": "has space"}}]
    with pytest.raises(ValueError, match=r"rec: tools\[0\] is not a valid tool"):
        check_demonstration(demo(bad_tool))


def test_recorded_calls_are_turns() -> None:
    call = art.LLMCall(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        tools=TOOLS,
        prompt_token_ids=[1],
        completion_token_ids=[2],
        logprobs=[-0.1],
        response_message=tool_call("get_price", '{"item": "apple"}'),
    )
    (turn,) = chat_turns(Demonstration("r", art.Trajectory(calls=[call])))
    assert turn.messages == call.messages and turn.tools == TOOLS
    wrong = call.model_copy(update={"response_message": tool_call("nope", "{}")})
    with pytest.raises(ValueError, match=r"r: calls\[0\] calls tool 'nope'"):
        chat_turns(Demonstration("r", art.Trajectory(calls=[wrong])))


def test_a_recorded_call_cut_by_max_tokens_is_trained_as_sampled() -> None:
    """GRPO trains on the ids of a tool call cut by ``max_tokens``; token-exact SFT too. From
    elsewhere (a teacher's call) it is no finished turn: not trained on."""
    cut = art.LLMCall(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        tools=TOOLS,
        prompt_token_ids=[1],
        completion_token_ids=[2],
        logprobs=[-0.1],
        finish_reason="length",
        response_message={**tool_call("get_price", '{"item": "pe'), "content": None},
    )
    demo = Demonstration("r", art.Trajectory(calls=[cut]))
    (turn,) = chat_turns(demo, recorded=True)
    assert turn.answer["tool_calls"][0]["function"]["arguments"] == '{"item": "pe'
    with pytest.raises(ValueError, match=r"r: no assistant turn to train on .each has weight 0"):
        chat_turns(demo)
