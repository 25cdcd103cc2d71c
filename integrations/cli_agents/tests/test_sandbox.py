"""A command-line agent as a rollout: its calls recorded, its folder and HOME its own, its
processes and output bounded, and (where the OS allows) no network but the gateway."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from pathlib import Path

import art_cli_agents as cli
import pytest

import art_core as art

HERE = Path(__file__).parent
AGENT = [sys.executable, str(HERE / "fake_agent.py")]


def fake(mode: str, *args: str) -> cli.CLIAgent:
    return cli.CLIAgent("fake", [*AGENT, mode, *args])


async def test_an_agent_run_is_a_scored_trajectory(
    cli_model: art.TrainableModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ART_TEST_SECRET", "must not reach the agent")
    task = cli.Task(
        "answer",
        folder=HERE / "task",
        check=[sys.executable, "-c", "print(0.75 if open('answer.txt').read() == '42\\n' else 0)"],
    )
    trajectory = await cli.rollout(cli_model, fake("work"), task)
    assert trajectory.metrics["exit_code"] == 0, trajectory.logs
    assert trajectory.reward == 0.75
    assert trajectory.metadata["agent"] == "fake"
    calls = trajectory.calls
    assert [c.api for c in calls] == ["chat.completions", "chat.completions", "responses"]
    first, second, _ = calls
    assert second.prompt_token_ids[: first.num_prompt_tokens + first.num_completion_tokens] == (
        first.prompt_token_ids + first.completion_token_ids
    )
    report = next(line for line in trajectory.logs if line.startswith("stdout"))
    assert '"home": []' in report  # a fresh, empty HOME
    assert "ART_TEST_SECRET" not in report and "OPENAI_BASE_URL" in report
    assert '"cwd_files": ["README.md", "answer.txt"]' in report  # a copy of the task folder
    # The task folder itself is unchanged; the run's copy is gone.
    assert sorted(os.listdir(HERE / "task")) == ["README.md"]
    assert trajectory.metrics["network_isolated"] == (cli.isolation_prefix() is not None)


async def test_only_the_gateway_is_reachable(cli_model: art.TrainableModel) -> None:
    """Another server on this machine's loopback is out of reach when isolated."""

    async def hello(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(hello, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        trajectory = await cli.rollout(
            cli_model, fake("probe", "127.0.0.1", str(port)), cli.Task("probe")
        )
        opened = await cli.rollout(
            cli_model, fake("probe", "127.0.0.1", str(port)), cli.Task("probe"), network="open"
        )
    assert "reached" in next(line for line in opened.logs if line.startswith("stdout"))
    assert not opened.metrics["network_isolated"]
    output = next(line for line in trajectory.logs if line.startswith("stdout"))
    if cli.isolation_prefix() is not None:
        assert trajectory.metrics["network_isolated"]
        assert "unreachable" in output
    else:  # this machine allows no namespaces: the run says its network was open
        assert not trajectory.metrics["network_isolated"]
        assert "reached" in output


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
        except OSError:
            pass
    return found


async def test_timeout_kills_the_agent_and_what_it_started(cli_model: art.TrainableModel) -> None:
    marker = f"art-linger-{uuid.uuid4().hex}"
    limits = cli.Limits(timeout_s=3)
    trajectory = await cli.rollout(
        cli_model, fake("linger", marker), cli.Task("wait"), limits=limits
    )
    assert trajectory.metrics["timed_out"] and trajectory.metrics["exit_code"] == -1
    assert trajectory.metrics["agent_seconds"] < 3 + 10
    assert trajectory.calls == []
    left = _processes_with(marker)
    try:
        if cli.isolation_prefix() is not None:
            # Its own PID namespace: even a child in a session of its own is gone.
            assert left == []
    finally:
        for pid in left:  # where nothing isolates it, a child that left the group survives
            os.kill(pid, signal.SIGKILL)


async def test_output_is_bounded(cli_model: art.TrainableModel) -> None:
    limits = cli.Limits(max_output_bytes=1000)
    trajectory = await cli.rollout(
        cli_model, fake("flood", str(5_000_000)), cli.Task("flood"), limits=limits
    )
    assert trajectory.metrics["output_bytes"] == 5_000_000, trajectory.logs
    assert trajectory.metrics["exit_code"] == 0
    stdout = next(line for line in trajectory.logs if line.startswith("stdout"))
    assert len(stdout) < 1100


def test_reward_of_a_check() -> None:
    def result(code: int | None, out: str, timed_out: bool = False) -> cli.ProcessResult:
        return cli.ProcessResult(code, timed_out, 0.1, out, "", len(out), "open")

    assert cli.reward_of(result(0, "ok\n0.5\n\n")) == 0.5
    assert cli.reward_of(result(0, "all passed")) == 1.0
    assert cli.reward_of(result(2, "failed")) == 0.0
    assert cli.reward_of(result(0, "nan")) == 1.0
    assert cli.reward_of(result(None, "0.9", timed_out=True)) == 0.0
    assert cli.reward_of(None) == 0.0


def test_agents_refuse_config_paths_outside_home() -> None:
    with pytest.raises(ValueError, match="inside HOME"):
        cli.CLIAgent("x", ["x"], files={"../etc/passwd": ""})
    with pytest.raises(ValueError, match="empty command"):
        cli.CLIAgent("x", [])
