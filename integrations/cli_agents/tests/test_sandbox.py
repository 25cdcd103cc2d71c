"""A command-line agent as a rollout: its calls recorded, its folder and HOME its own
(hostile agents: test_hostile_agents.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import art_cli_agents as cli
import pytest
from art_cli_agents.sandbox import RUN_ROOT, Limits, filesystem_isolation, run_sandboxed

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
    # Its folder, HOME and TMPDIR writable, the rest read-only, the gateway still reached.
    assert trajectory.metrics["filesystem_isolated"] == filesystem_isolation()


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


async def test_an_isolated_command_sees_its_folders_where_it_is_told(tmp_path: Path) -> None:
    """``seen_at``: its folder bound at another path in its own /tmp, where it starts (PWD
    too); nothing made at that path on this machine."""
    if not filesystem_isolation():
        pytest.fail("this test needs an isolated filesystem (Linux namespaces): none here")
    made_here = RUN_ROOT.exists()
    (tmp_path / "work" / "sub").mkdir(parents=True)
    seen = RUN_ROOT / "work"
    result = await run_sandboxed(
        ["sh", "-c", 'pwd; echo "$PWD"; echo hi > here.txt'],
        cwd=tmp_path / "work" / "sub",
        env={"PATH": os.environ["PATH"], "PWD": str(tmp_path / "work" / "sub")},
        limits=Limits(),
        timeout_s=10,
        filesystem="isolated",
        writable=[tmp_path / "work"],
        seen_at={tmp_path / "work": seen},
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout.split() == [str(seen / "sub")] * 2
    assert (tmp_path / "work" / "sub" / "here.txt").read_text() == "hi\n"
    if not made_here:
        assert not RUN_ROOT.exists()
    # Only in the run's own /tmp, and only isolated.
    for where in (Path("/var/art-run"), Path("/tmp")):
        with pytest.raises(RuntimeError, match="only inside the run's own /tmp"):
            await run_sandboxed(
                ["true"],
                cwd=tmp_path / "work",
                env={},
                limits=Limits(),
                timeout_s=10,
                writable=[tmp_path / "work"],
                seen_at={tmp_path / "work": where},
            )
    with pytest.raises(RuntimeError, match="only with an isolated filesystem"):
        await run_sandboxed(
            ["true"],
            cwd=tmp_path / "work",
            env={},
            limits=Limits(),
            timeout_s=10,
            filesystem="open",
            seen_at={tmp_path / "work": seen},
        )
