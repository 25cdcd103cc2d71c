"""The judge prompt and the reply validator, without a server."""

from __future__ import annotations

import json
import re

import pytest

from art_core.rewards import RulerReplyError, build_judge_prompt, parse_reply
from art_core.rewards.prompt import common_prefix_length, render_conversation, truncate
from art_core.rewards.reply import extract_json

IDS = ["1", "2"]


def reply(*entries: dict) -> str:
    return json.dumps({"scores": list(entries)})


def entry(run_id: object = "1", score: object = 0.5, **extra: object) -> dict:
    return {"run_id": run_id, "explanation": "because", "score": score, **extra}


def test_valid_reply_in_any_order():
    scores = parse_reply(reply(entry("2", 0.25), entry("1", 1)), IDS)
    assert {k: v.score for k, v in scores.items()} == {"1": 1.0, "2": 0.25}
    assert scores["1"].explanation == "because"


@pytest.mark.parametrize(
    "content",
    [
        "Sure!\n```json\n" + reply(entry("1"), entry("2")) + "\n```\nDone.",
        "<think>run 2 is weaker {not json}</think>" + reply(entry("1"), entry("2")),
        "My verdict: " + reply(entry("1"), entry("2")) + " Hope that helps.",
        json.dumps([entry("1"), entry("2")]),  # a bare list
        reply({"id": 1, "score": "0.5"}, {"trajectory_id": "2", "score": 0}),  # lenient keys
    ],
)
def test_plain_json_replies_are_parsed(content):
    assert set(parse_reply(content, IDS)) == {"1", "2"}


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "reply is empty"),
        ("   ", "reply is empty"),
        ("Run 1 wins.", "reply is not JSON"),
        ('{"verdict": "1"}', 'no "scores" list'),
        (reply(entry("1")), "expected 2 scores, got 1"),
        (reply(entry("1"), entry("2"), entry("2")), "expected 2 scores, got 3"),
        (reply(entry("1"), entry("1")), "run 1 was scored twice"),
        (reply(entry("1"), entry("3")), "unknown run id '3'"),
        (reply(entry("1"), entry("2", 1.01)), "is 1.01, outside [0, 1]"),
        (reply(entry("1"), entry("2", -0.1)), "outside [0, 1]"),
        (reply(entry("1"), entry("2", "high")), "not a number"),
        (reply(entry("1"), entry("2", True)), "not a number"),
        (reply(entry("1"), entry("2", None)), "not a number"),
        ('{"scores": [{"run_id": "1", "score": NaN}, {"run_id": "2", "score": 0}]}', "outside"),
        (reply(entry("1"), {"score": 0.1}), "has no run_id"),
        (reply(entry("1"), "2: 0.5"), "not an object"),
        (reply(entry("1"), entry(["2"])), "must be a string"),
    ],
)
def test_malformed_replies_name_the_problem(content, problem):
    with pytest.raises(RulerReplyError, match=re.escape(problem)):
        parse_reply(content, IDS)


def test_extract_json_prefers_the_whole_text():
    assert extract_json('{"a": "```json {} ```"}') == {"a": "```json {} ```"}


def test_truncate_keeps_head_and_tail():
    text, cut = truncate("x" * 50 + "END", 20)
    assert cut and text.startswith("x" * 10) and text.endswith("xxxxxxxEND")
    assert "[... 33 characters omitted ...]" in text
    assert truncate("short", 20) == ("short", False)
    assert truncate("long" * 100, 0) == ("long" * 100, False)  # 0 = no cap


def test_render_shows_calls_results_and_odd_content():
    lines = render_conversation(
        [
            {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "r1",
                        "type": "function",
                        "function": {"name": "f", "arguments": "{bad"},
                    },
                    {"id": "r2", "type": "function", "function": {"name": "g", "arguments": "{}"}},
                ],
            },
            {"role": "tool", "tool_call_id": "r2", "content": "G!"},
            {"role": "tool", "tool_call_id": "r1", "content": "F!"},
            {"role": "assistant", "content": ""},
        ],
        100,
    ).lines
    assert lines == [
        "[user]\nlook\n[image_url]",
        "[assistant]\n[tool call #1] f({bad)\n[tool call #2] g({})",
        "[tool result #2 g]\nG!",
        "[tool result #1 f]\nF!",
        "[assistant]\n(empty reply)",
    ]


def test_prefix_and_dedup():
    assert common_prefix_length([["a", "b"], ["a", "b"]]) == 2
    assert common_prefix_length([["a", "b"], ["a"]]) == 1
    assert common_prefix_length([["a"], ["b"]]) == 0

    user = {"role": "user", "content": "hi"}
    runs = [
        [user, {"role": "assistant", "content": "A"}],
        [user],  # a run that stopped before answering: a strict prefix of the others
        [user, {"role": "assistant", "content": "A"}],
    ]
    prompt = build_judge_prompt(runs)
    assert prompt.run_ids == ["1", "2"]
    assert prompt.run_of_input == [0, 1, 0]
    assert prompt.prefix_messages == 1
    text = prompt.messages[1]["content"]
    assert "(no messages after the shared context)" in text
    assert "<tools>" not in text and "shortened" not in text


def test_empty_input_is_rejected():
    with pytest.raises(ValueError, match="at least one run"):
        build_judge_prompt([])
