"""A fixed wall clock for an agent (libfaketime, ``art_cli_agents.clock``): the agent's command
sees it, isolated or not; the sandbox's launcher and the check keep the real one."""

from __future__ import annotations

from datetime import date

import art_cli_agents as cli
import pytest

import art_core as art

# run.sh installs Debian's faketime under CI, in the background.
pytestmark = pytest.mark.needs_install("faketime")

# The agent writes the date it sees; the check passes only if that is the fixed one and its
# own date is the real one.
AGENT = cli.CLIAgent("date", ["sh", "-c", "date +%F > when.txt"])
TASK = cli.Task(
    "say the date",
    check='test "$(cat when.txt)" = 2020-02-29 && test "$(date +%F)" != 2020-02-29',
)


def clocked() -> cli.CLIAgent:
    if cli.libfaketime() is None:
        pytest.fail("libfaketime is not installed: apt install faketime (CI installs it)")
    return cli.fixed_clock(AGENT, "2020-02-29 12:00:00")


@pytest.mark.parametrize("isolation", ["auto", "open"])
async def test_the_agent_sees_the_fixed_date_and_the_check_the_real_one(
    cli_model: art.TrainableModel, isolation: str
) -> None:
    isolated = isolation == "auto"
    trajectory = await cli.rollout(
        cli_model,
        clocked(),
        TASK,
        network="auto" if isolated else "open",
        filesystem="auto" if isolated else "open",
    )
    assert trajectory.metrics["exit_code"] == 0, trajectory.logs
    assert trajectory.reward == 1.0, trajectory.logs
    assert date.today().isoformat() != "2020-02-29"


def test_a_fixed_clock_names_its_instant_and_refuses_without_the_library(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    agent = clocked()
    assert agent.env["FAKETIME"] == "@2020-02-29 12:00:00"
    assert agent.env["DONT_FAKE_MONOTONIC"] == "1"
    assert "LD_PRELOAD" not in agent.env  # the sandbox sets it for the command alone
    monkeypatch.setenv("ART_FAKETIME_LIB", "/nonexistent/libfaketime.so.1")
    with pytest.raises(RuntimeError, match="apt install faketime"):
        cli.fixed_clock(AGENT)
