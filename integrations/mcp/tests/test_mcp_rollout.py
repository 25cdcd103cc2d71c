"""``art_mcp.rollout`` on real MCP servers through the gateway: multi-turn, token-exact."""

from __future__ import annotations

import asyncio

from art_mcp import HttpServer, Scenario, rollout
from mcp_support import FAULTY_STDIO, forced, tool_messages

import art_core as art
from art_core.testing.checks import assert_token_exact

CAPITALS = {
    "The capital of France is Paris.",
    "The capital of Japan is Tokyo.",
    "The capital of Peru is Lima.",
}


def check_three_turns(
    trajectory: art.Trajectory, label: str, transport: str, tokenizer: object
) -> None:
    # three forced calls of `lookup`; the 2nd and 3rd read the results of the previous ones
    assert [c.index for c in trajectory.calls] == [0, 1, 2]
    assert trajectory.metrics["turns"] == 3 and trajectory.metrics["tool_calls"] == 3
    assert trajectory.metrics["tool_errors"] == 0
    assert trajectory.metadata["stop_reason"] == "max_turns"
    assert trajectory.metadata["tools_used"] == ["lookup", "lookup", "lookup"]
    assert trajectory.metadata["mcp_server"] == label
    assert trajectory.metadata["mcp_transport"] == transport
    # the model read the results of the first two calls (the third was the last turn)
    results = tool_messages(trajectory)
    assert len(results) == 2 and set(results) <= CAPITALS
    for turn, call in enumerate(trajectory.calls):
        assert call.metadata["mcp_server"] == label
        assert call.metadata["mcp_transport"] == transport
        assert call.metadata["turn"] == turn
        assert call.metadata["mcp_tool_results"] == ([] if turn == 0 else ["lookup"])
        assert call.metadata["mcp_tools_called"] == ["lookup"]
        assert [t["function"]["name"] for t in call.tools or []] == ["lookup"]
        if turn:
            # what the tool returned is what the model was shown, verbatim
            assert call.messages[-1] == {
                "role": "tool",
                "tool_call_id": trajectory.calls[turn - 1].response_message["tool_calls"][0]["id"],
                "content": results[turn - 1],
            }
    assert_token_exact(trajectory, tokenizer)


async def test_multi_turn_rollout_over_stdio_is_token_exact(
    backend: art.LocalBackend,
    mcp_model: art.TrainableModel,
) -> None:
    scenario = Scenario(task="What is the capital of Peru?", answer="Lima")
    trajectory = await rollout(
        mcp_model,
        scenario,
        FAULTY_STDIO,
        settings=forced("lookup", max_turns=3),
        reward_fn=lambda s, t: 0.25,
    )
    assert trajectory.reward == 0.25
    assert trajectory.metadata["scenario_id"] == scenario.id
    assert trajectory.calls[0].messages[1] == {
        "role": "user",
        "content": "What is the capital of Peru?",
    }
    check_three_turns(trajectory, "mcp_faulty_server", "stdio", backend.engine(mcp_model).tokenizer)


async def test_concurrent_rollouts_over_streamable_http_keep_their_own_sessions(
    backend: art.LocalBackend,
    mcp_model: art.TrainableModel,
    faulty_http: HttpServer,
) -> None:
    async def reward(scenario: Scenario, trajectory: art.Trajectory) -> float:
        await asyncio.sleep(0)  # async rewards are awaited
        return float(len(trajectory.calls))

    trajectories = await asyncio.gather(
        *(
            rollout(
                mcp_model,
                f"task {i}: a capital",
                faulty_http,
                settings=forced("lookup", max_turns=3),
                reward_fn=reward,
            )
            for i in range(4)
        )
    )
    assert len({t.id for t in trajectories}) == 4
    tokenizer = backend.engine(mcp_model).tokenizer
    for i, trajectory in enumerate(trajectories):
        assert trajectory.reward == 3.0
        assert trajectory.calls[0].messages[1]["content"] == f"task {i}: a capital"
        check_three_turns(trajectory, faulty_http.label, "http", tokenizer)


async def test_complete_task_ends_the_run_with_its_answer(
    mcp_model: art.TrainableModel,
) -> None:
    trajectory = await rollout(
        mcp_model,
        "Say anything, then finish.",
        FAULTY_STDIO,
        # 256 tokens always hold the forced call: its answer is at most 10 characters, and
        # even 10 \uXXXX escapes plus the JSON around them stay under ~150 tokens of
        # tiny-random's byte-level vocabulary (48 cut it now and then: a flaky test).
        settings=forced(
            "lookup",
            complete_task=True,
            max_turns=1,
            max_answer_chars=10,
            max_tokens=256,
            tools=[],
        ),
    )
    [call] = trajectory.calls
    [tool_call] = call.response_message["tool_calls"]
    assert tool_call["function"]["name"] == "complete_task"
    assert trajectory.metadata["stop_reason"] == "complete_task"
    assert trajectory.metrics["completed"] is True
    answer = trajectory.metadata["final_answer"]
    assert isinstance(answer, str) and len(answer) <= 10
    assert call.metadata["mcp_tools_called"] == ["complete_task"]
