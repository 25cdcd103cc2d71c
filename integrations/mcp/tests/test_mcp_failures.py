"""Tools that raise, hang or return 1 MB, and servers that crash mid-rollout."""

from __future__ import annotations

import os
import re
from pathlib import Path

import openai
import pytest
from art_mcp import HttpServer, ServerConnectionError, StdioServer, rollout, spawn_http_server
from mcp_support import FAULTY_HTTP, FAULTY_SCRIPT, FAULTY_STDIO, forced, tool_messages

import art_core as art


@pytest.fixture(params=["stdio", "http"])
def server(request: pytest.FixtureRequest, faulty_http: HttpServer) -> object:
    return FAULTY_STDIO if request.param == "stdio" else faulty_http


async def test_a_tool_that_raises_is_a_tool_error_for_the_model(
    mcp_model: art.TrainableModel,
    server: object,
) -> None:
    trajectory = await rollout(
        mcp_model, "explode please", server, settings=forced("explode", max_turns=3)
    )
    # the later calls read the errors as tool messages, and the run went on
    assert tool_messages(trajectory) == ["Error executing tool explode"] * 2
    assert trajectory.metrics["tool_errors"] == 3 and trajectory.metrics["turns"] == 3
    assert trajectory.calls[1].messages[-1]["content"] == "Error executing tool explode"


async def test_a_tool_that_hangs_times_out_as_a_tool_error(
    mcp_model: art.TrainableModel,
    server: object,
) -> None:
    trajectory = await rollout(
        mcp_model, "hang please", server, settings=forced("hang", max_turns=3, tool_timeout_s=1.0)
    )
    assert tool_messages(trajectory) == ["tool 'hang' timed out after 1 s"] * 2
    assert trajectory.metrics["tool_timeouts"] == 3 and trajectory.metrics["tool_errors"] == 3


async def test_a_one_megabyte_result_is_truncated_with_a_marker(
    mcp_model: art.TrainableModel,
    server: object,
) -> None:
    trajectory = await rollout(
        mcp_model,
        "big please",
        server,
        settings=forced("big", max_turns=1, max_tool_result_chars=300),
    )
    [text] = tool_messages(trajectory) or [None]
    # a single turn: the result is in the trajectory's record of the conversation only if a
    # later call read it, so check the recorded metrics and run a second turn for the text
    assert text is None and trajectory.metrics["truncated_results"] == 1
    trajectory = await rollout(
        mcp_model,
        "big please",
        server,
        settings=forced("big", max_turns=2, max_tool_result_chars=300),
    )
    first = tool_messages(trajectory)[0]
    assert first == "x" * 300 + "\n[... truncated: showing 300 of 1048576 characters]"
    assert trajectory.metrics["truncated_results"] == 2 and trajectory.metrics["tool_errors"] == 0


async def test_a_server_crash_fails_only_its_rollout_and_keeps_its_calls(
    backend: art.LocalBackend,
    mcp_model: art.TrainableModel,
    tmp_path: Path,
) -> None:
    marker = tmp_path / "crashed"
    crashing = StdioServer(
        command="python",
        args=(FAULTY_STDIO.split(" ", 1)[1],),
        env={"ART_MCP_CRASH_MARKER": str(marker)},
        name="crashing",
    )
    groups = await art.gather_trajectory_groups(
        [
            art.TrajectoryGroup(
                [
                    rollout(mcp_model, "fine 1", FAULTY_STDIO, settings=forced("lookup")),
                    rollout(mcp_model, "crash", crashing, settings=forced("crash")),
                    rollout(mcp_model, "fine 2", FAULTY_STDIO, settings=forced("lookup")),
                ]
            ),
            art.TrajectoryGroup(
                rollout(mcp_model, f"other {i}", FAULTY_STDIO, settings=forced("lookup"))
                for i in range(2)
            ),
        ],
        max_exceptions=1,
        pbar_desc=None,
    )
    assert marker.read_text() == "crashed"
    first, second = groups
    assert [len(first.trajectories), len(first.exceptions)] == [2, 1]
    assert [len(second.trajectories), len(second.exceptions)] == [2, 0]
    [failure] = first.exceptions
    assert failure.type == "ServerConnectionError"
    assert "MCP server 'crashing' closed the connection during tool call 'crash'" in failure.message
    # the other rollouts ran to the end with their own sessions
    for trajectory in [*first.trajectories, *second.trajectories]:
        assert trajectory.metrics["turns"] == 2 and trajectory.metrics["tool_errors"] == 0
        assert len(tool_messages(trajectory)) == 1
    # nothing recorded is lost: the crashed rollout's LLM call is in calls.sqlite
    rollout_id = re.search(r"rollout (rollout_\w+) failed", failure.message).group(1)  # type: ignore[union-attr]
    assert "its 1 recorded LLM calls are kept" in failure.message
    [kept] = backend.store(mcp_model).load_rollout(rollout_id)
    assert kept.response_message["tool_calls"][0]["function"]["name"] == "crash"
    assert kept.completion_token_ids and kept.metadata["mcp_server"] == "crashing"


async def test_an_http_server_that_dies_fails_the_rollout_cleanly(
    mcp_model: art.TrainableModel,
) -> None:
    async with spawn_http_server(FAULTY_HTTP) as server:
        with pytest.raises(
            ServerConnectionError, match=r"rollout rollout_\w+ failed: .*MCP server"
        ):
            await rollout(mcp_model, "crash", server, settings=forced("crash"))


async def test_a_conversation_that_outgrows_the_context_ends_the_run_cleanly(
    mcp_model: art.TrainableModel,
) -> None:
    # 60,000 characters of tool result are far more than tiny-random's 2048-token context
    trajectory = await rollout(
        mcp_model,
        "big please",
        FAULTY_STDIO,
        settings=forced("big", max_turns=3, max_tool_result_chars=60_000),
    )
    assert trajectory.metadata["stop_reason"] == "context_length"
    assert trajectory.metrics["turns"] == 1 and len(trajectory.calls) == 1
    assert trajectory.metrics["truncated_results"] == 1


async def test_the_server_process_is_stopped_when_a_rollout_fails_for_another_reason(
    mcp_model: art.TrainableModel,
    tmp_path: Path,
) -> None:
    pid_file = tmp_path / "pid"
    server = StdioServer(
        command="python", args=(str(FAULTY_SCRIPT),), env={"ART_MCP_PID_FILE": str(pid_file)}
    )
    # the gateway rejects the request (a bad parameter): the run fails inside its session
    with pytest.raises(openai.BadRequestError, match="temperature"):
        await rollout(mcp_model, "anything", server, settings=forced("lookup", temperature=-1.0))
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
