"""RULER against a real OpenAI-compatible judge on loopback (the stand-in judge server).

The stand-in scores each run it is shown by the ``score-hint: X`` written in the run's own
text, so these tests decide the scores through the trajectories and check that they come
back to the right trajectory, with the judge's explanation, metrics and cache behaviour.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from types import SimpleNamespace
from typing import Any

import pytest

from art_core.rewards import (
    DEFAULT_RUBRIC,
    RulerScore,
    default_cache_path,
    ruler,
    ruler_score_group,
)
from art_core.trajectories import LLMCall, Trajectory, TrajectoryGroup

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search_flights",
        "description": "Find flights between two airports",
        "parameters": {
            "type": "object",
            "properties": {"origin": {"type": "string"}, "destination": {"type": "string"}},
        },
    },
}
SHARED = [
    {"role": "system", "content": "You are a travel agent. Use the tools."},
    {"role": "user", "content": "Book me the cheapest flight from CDG to NRT."},
]


def agent_run(
    answer: str, hint: float, *, call_id: str = "call_a", result: str = "", to: str = "NRT"
) -> list[dict]:
    """A tool-using run: search, read the result, answer (with the stand-in's score hint)."""
    return [
        *SHARED,
        {
            "role": "assistant",
            "content": "Let me search.",
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {
                        "name": "search_flights",
                        "arguments": json.dumps({"origin": "CDG", "destination": to}),
                    },
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": call_id,
            "content": result or "AF276 EUR 612; JL46 EUR 598",
        },
        {"role": "assistant", "content": f"{answer} score-hint: {hint}"},
    ]


def make_group(*runs: tuple[str, float], reward: float = 0.25) -> TrajectoryGroup:
    return TrajectoryGroup(
        Trajectory(
            # runs alternate between two airports, so they differ from their tool call on
            messages_and_choices=agent_run(
                answer, hint, call_id=f"call_{i}", to=("NRT", "HND")[i % 2]
            ),
            tools=[SEARCH_TOOL],
            reward=reward,
            metrics={"turns": 2},
        )
        for i, (answer, hint) in enumerate(runs)
    )


def user_prompt(request: dict[str, Any]) -> str:
    return request["messages"][-1]["content"]


async def test_scores_replace_rewards_in_order_with_explanations_and_metrics(judge):
    judge.reverse = True  # the reply lists runs backwards: scores must be matched by id
    group = make_group(("JL46 at EUR 598.", 0.9), ("AF276.", 0.4), ("I could not book.", 0.05))

    result = await ruler_score_group(group, "judge-1", judge_base_url=judge.base_url)

    assert result is group
    assert [t.reward for t in group] == [0.9, 0.4, 0.05]
    for trajectory, hint in zip(group, ["0.9", "0.4", "0.05"], strict=True):
        assert trajectory.metrics["independent_reward"] == 0.25
        assert trajectory.metrics["ruler_score"] == float(hint)
        assert trajectory.metrics["turns"] == 2  # other metrics untouched
        assert len(trajectory.logs) == 1
        # the stand-in's explanation is derived from the run it saw: one call, one result
        assert "1 tool calls, 1 tool results, hint " + hint in trajectory.logs[0]
        assert trajectory.logs[0].startswith("RULER (judge-1) score")
        verdict = trajectory.metadata["ruler"]
        assert verdict["judge_model"] == "judge-1" and verdict["score"] == float(hint)
        assert "1 tool calls, 1 tool results, hint " + hint in verdict["explanation"]
    assert len(judge.requests) == 1
    m = group.metrics
    assert m["ruler_judge_calls"] == 1
    assert m["ruler_cache_hit"] is False
    assert m["ruler_unique_runs"] == 3
    assert m["ruler_prompt_tokens"] == len(
        "\n".join(msg["content"] for msg in judge.requests[0]["messages"]).split()
    )
    assert m["ruler_completion_tokens"] > 0
    assert 0 < m["ruler_judge_latency_s"] < 10


async def test_prompt_shows_prefix_once_tools_calls_results_and_rubric(judge):
    group = make_group(("JL46.", 0.9), ("AF276.", 0.4))
    group.trajectories[1].messages_and_choices[3]["content"] = "AF276 EUR 612 (sold out)"

    await ruler_score_group(group, "judge-1", judge_base_url=judge.base_url)

    request = judge.requests[0]
    assert request["model"] == "judge-1"
    prompt = user_prompt(request)
    # the shared system/user messages are shown once, as context
    assert prompt.count("Book me the cheapest flight from CDG to NRT.") == 1
    assert prompt.index("<shared_context>") < prompt.index('<run id="1">')
    # the tools the agent had
    assert '"name": "search_flights"' in prompt
    assert "Find flights between two airports" in prompt
    # each run's tool call (with arguments) and tool result, in its own block
    assert (
        prompt.count('[tool call #1] search_flights({"destination": "NRT", "origin": "CDG"})') == 1
    )
    run1 = prompt.split('<run id="1">')[1].split("</run>")[0]
    run2 = prompt.split('<run id="2">')[1].split("</run>")[0]
    assert "AF276 EUR 612; JL46 EUR 598" in run1 and "JL46." in run1
    assert "AF276 EUR 612 (sold out)" in run2 and "AF276." in run2
    # the rubric, and a structured-output request naming exactly the run ids
    assert DEFAULT_RUBRIC.splitlines()[0] in request["messages"][0]["content"]
    schema = request["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["scores"]["items"]["properties"]["run_id"]["enum"] == ["1", "2"]
    assert schema["properties"]["scores"]["minItems"] == 2


async def test_plain_json_reply_in_a_fenced_block_is_accepted(judge):
    judge.script = ["fenced"]
    group = make_group(("a", 0.7), ("b", 0.2))
    await ruler_score_group(group, "judge-1", judge_base_url=judge.base_url, cache=False)
    assert [t.reward for t in group] == [0.7, 0.2]
    assert len(judge.requests) == 1


async def test_identical_runs_are_judged_once_and_share_the_score(judge):
    # Runs 0 and 2 differ only in their random tool-call ids: the same run for the judge.
    group = make_group(("JL46.", 0.8), ("AF276.", 0.3), ("JL46.", 0.8), ("AF276.", 0.3))

    await ruler_score_group(group, "judge-1", judge_base_url=judge.base_url)

    prompt = user_prompt(judge.requests[0])
    assert prompt.count("<run id=") == 2
    assert [t.reward for t in group] == [0.8, 0.3, 0.8, 0.3]
    assert group.metrics["ruler_unique_runs"] == 2
    assert group.trajectories[2].logs == group.trajectories[0].logs


async def test_long_tool_results_are_truncated_and_the_prompt_says_so(judge):
    long_result = "ROW " * 5000 + "TOTAL: 2 flights"
    group = TrajectoryGroup(
        [
            Trajectory(messages_and_choices=agent_run("JL46.", 0.9, result=long_result)),
            Trajectory(messages_and_choices=agent_run("AF276.", 0.1, to="HND")),
        ]
    )

    await ruler_score_group(
        group, "judge-1", judge_base_url=judge.base_url, max_tool_result_chars=300
    )

    prompt = user_prompt(judge.requests[0])
    assert long_result not in prompt
    assert "[... 19716 characters omitted ...]" in prompt
    assert "TOTAL: 2 flights" in prompt  # the tail is kept
    assert "tool results longer than 300 characters were shortened" in prompt
    assert group.metrics["ruler_truncated_tool_results"] == 1
    assert len(prompt) < 6000


async def test_captured_trajectories_and_a_model_object_as_judge(judge):
    """Trajectories built from recorded LLM calls; the judge given as a Model-like object."""

    def captured(answer: str) -> Trajectory:
        call = LLMCall(
            model="agent",
            messages=list(SHARED),
            tools=[SEARCH_TOOL],
            prompt_token_ids=[1, 2],
            completion_token_ids=[3],
            logprobs=[-0.1],
            response_message={"role": "assistant", "content": answer},
        )
        return Trajectory(calls=[call], reward=1.0)

    group = TrajectoryGroup([captured("Done. score-hint: 0.6"), captured("No. score-hint: 0.1")])
    judge_model = SimpleNamespace(
        name="our-judge",
        inference_model_name="Qwen/Qwen3-8B",
        inference_base_url=judge.base_url,
        inference_api_key="secret-key",
    )

    await ruler_score_group(group, judge_model)

    assert [t.reward for t in group] == [0.6, 0.1]
    assert judge.requests[0]["model"] == "Qwen/Qwen3-8B"
    assert judge.headers[0]["authorization"] == "Bearer secret-key"
    assert '"name": "search_flights"' in user_prompt(judge.requests[0])  # tools of the calls


async def test_base_url_and_key_fall_back_to_the_environment(judge, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", judge.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "env-key")
    scores = await ruler(
        [agent_run("x", 0.3), agent_run("y", 0.7, to="HND")], "judge-env", tools=[SEARCH_TOOL]
    )
    assert scores == [
        RulerScore(trajectory_id="1", score=0.3, explanation=scores[0].explanation),
        RulerScore(trajectory_id="2", score=0.7, explanation=scores[1].explanation),
    ]
    assert "hint 0.3" in scores[0].explanation
    assert judge.headers[0]["authorization"] == "Bearer env-key"


async def test_second_scoring_is_served_from_the_cache(judge, tmp_path):
    cache_file = tmp_path / "ruler.sqlite"
    first = make_group(("JL46.", 0.9), ("AF276.", 0.4))
    await ruler_score_group(first, "judge-1", judge_base_url=judge.base_url, cache_path=cache_file)
    assert len(judge.requests) == 1

    again = make_group(("JL46.", 0.9), ("AF276.", 0.4))  # same content, new objects
    await ruler_score_group(again, "judge-1", judge_base_url=judge.base_url, cache_path=cache_file)

    assert len(judge.requests) == 1  # no request reached the judge
    assert [t.reward for t in again] == [0.9, 0.4]
    assert again.trajectories[0].logs == first.trajectories[0].logs
    assert again.metrics["ruler_cache_hit"] is True
    assert again.metrics["ruler_judge_calls"] == 0
    assert again.metrics["ruler_prompt_tokens"] == 0
    with sqlite3.connect(cache_file) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        (stored,) = conn.execute("SELECT value FROM ruler_cache").fetchone()
    assert [s["score"] for s in json.loads(stored)["scores"]] == [0.9, 0.4]


async def test_cache_key_covers_model_rubric_content_and_can_be_disabled(judge):
    # the default location follows ART_CORE_CACHE_DIR (set by the fixture)
    runs = [agent_run("x", 0.3), agent_run("y", 0.7)]
    await ruler(runs, "judge-1", judge_base_url=judge.base_url)
    assert default_cache_path().is_file()
    await ruler(runs, "judge-1", judge_base_url=judge.base_url)
    assert len(judge.requests) == 1
    await ruler(runs, "judge-2", judge_base_url=judge.base_url)  # another judge model
    await ruler(runs, "judge-1", judge_base_url=judge.base_url, rubric="Prefer brevity.")
    await ruler(
        [agent_run("x", 0.3), agent_run("z", 0.7)], "judge-1", judge_base_url=judge.base_url
    )
    assert len(judge.requests) == 4
    await ruler(runs, "judge-1", judge_base_url=judge.base_url, cache=False)
    assert len(judge.requests) == 5
    assert "Prefer brevity." in judge.requests[2]["messages"][0]["content"]


async def test_concurrent_groups_share_one_cache_file(judge, tmp_path):
    cache_file = tmp_path / "shared.sqlite"
    groups = [make_group((f"answer {i}", 0.5), (f"other {i}", i / 10)) for i in range(8)]

    async def score_all() -> None:
        await asyncio.gather(
            *(
                ruler_score_group(
                    g, "judge-1", judge_base_url=judge.base_url, cache_path=cache_file
                )
                for g in groups
            )
        )

    await score_all()
    assert len(judge.requests) == 8  # one judge call per group
    await score_all()
    assert len(judge.requests) == 8
    assert [g.trajectories[1].reward for g in groups] == [i / 10 for i in range(8)]
    with sqlite3.connect(cache_file) as conn:
        assert conn.execute("SELECT COUNT(*) FROM ruler_cache").fetchone()[0] == 8


async def test_rescoring_keeps_the_original_independent_reward(judge):
    group = make_group(("a", 0.9), ("b", 0.4), reward=0.5)
    await ruler_score_group(group, "judge-1", judge_base_url=judge.base_url)
    await ruler_score_group(group, "judge-1", judge_base_url=judge.base_url, rubric="Other.")
    assert [t.metrics["independent_reward"] for t in group] == [0.5, 0.5]
    assert [t.reward for t in group] == [0.9, 0.4]
    assert len(group.trajectories[0].logs) == 2


async def test_a_single_run_is_judged_with_its_conversation_as_context(judge):
    group = make_group(("only", 0.6))
    await ruler_score_group(group, "judge-1", judge_base_url=judge.base_url)
    prompt = user_prompt(judge.requests[0])
    assert prompt.count("<run id=") == 1
    assert "[tool call #1] search_flights" in prompt.split('<run id="1">')[1]
    assert group.trajectories[0].reward == 0.6


async def test_an_empty_group_is_returned_without_a_judge_call(judge):
    group = TrajectoryGroup([], exceptions=[RuntimeError("rollout failed")])
    assert await ruler_score_group(group, "judge-1", judge_base_url=judge.base_url) is group
    assert judge.requests == []


async def test_configuration_errors_raise_even_when_swallowing(judge):
    group = make_group(("a", 0.9), ("b", 0.4))
    with pytest.raises(ValueError, match="no API key"):
        await ruler_score_group(group, "gpt-4.1", swallow_exceptions=True)
    with pytest.raises(ValueError, match="rubric"):
        await ruler_score_group(
            group, "judge-1", judge_base_url=judge.base_url, rubric=" ", swallow_exceptions=True
        )
    assert [t.reward for t in group] == [0.25, 0.25]
    assert judge.requests == []
