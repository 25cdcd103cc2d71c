"""A call that repeats an earlier successful call of the same run is answered with a notice
instead of running again (``RolloutSettings.repeated_call_notice``); failed calls run again.

The faulty test server's ``big`` and ``explode`` take one enum argument with a single value
(``"1mb"``) or two, so a grammar-forced tiny-random calls them with the same arguments turn
after turn: the repeats are certain for ``big`` and the test does not depend on the model."""

from __future__ import annotations

from art_mcp import rollout
from mcp_support import FAULTY_STDIO, forced, tool_messages

import art_core as art


async def test_a_repeated_successful_call_gets_a_notice_not_a_second_run(
    mcp_model: art.TrainableModel,
) -> None:
    trajectory = await rollout(
        mcp_model,
        "Fetch the big text.",
        FAULTY_STDIO,
        settings=forced("big", max_turns=3, max_tool_result_chars=64, repeated_call_notice=True),
    )
    # The record holds what the model saw: the last turn's tool message came after the last
    # call, so three turns show two tool messages.
    first, *repeats = tool_messages(trajectory)
    assert first.startswith("x" * 32)  # the tool's real (truncated) output
    assert len(repeats) == 1
    for notice in repeats:
        assert notice.startswith("You already called big with these arguments.")
        assert first in notice  # the earlier result, again
        assert notice.endswith("Do not call it again: give the final answer.")
    assert trajectory.metrics["tool_calls"] == 1  # the server ran it once
    assert trajectory.metrics["repeated_calls"] == 2
    # The notice is part of what the model saw: the next call's prompt holds it.
    assert trajectory.calls[2].messages[-1]["content"] == repeats[0]


async def test_failed_calls_and_the_setting_off_run_every_time(
    mcp_model: art.TrainableModel,
) -> None:
    failing = await rollout(
        mcp_model,
        "Make it explode.",
        FAULTY_STDIO,
        settings=forced("explode", max_turns=3, repeated_call_notice=True),
    )
    assert failing.metrics["tool_calls"] == 3  # each failed call ran again
    assert failing.metrics["repeated_calls"] == 0
    assert all("already called" not in m for m in tool_messages(failing))
    assert failing.metrics["tool_errors"] == 3

    off = await rollout(
        mcp_model,
        "Fetch the big text.",
        FAULTY_STDIO,
        settings=forced("big", max_turns=3, max_tool_result_chars=64, repeated_call_notice=False),
    )
    assert off.metrics["tool_calls"] == 3
    assert off.metrics["repeated_calls"] == 0
    assert [m[:32] for m in tool_messages(off)] == ["x" * 32] * 2
