"""A second third-party MCP server from PyPI, beside the shop demo: ``mcp-server-git``, run
unchanged over stdio against a throwaway repository built here, with tasks whose answers are
read back from git itself. ``art_mcp.rollout`` runs it through the gateway (token-exact) and
``model.train`` takes a GRPO step on the groups it scores with ``art_mcp.answer_reward``."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import art_mcp
import pytest
from art_mcp import RolloutSettings, Scenario

import art_core as art
from art_core.testing.checks import assert_token_exact, tool_call_in_text
from art_core.testing.pytest_plugin import register_tiny_model


@pytest.fixture(scope="module", autouse=True)
def git_and_its_server() -> None:
    """Skip without git and mcp-server-git (the mcp integration's dev extra) on a developer's
    machine; fail under CI, which must run these tests."""
    if shutil.which("git") is not None and importlib.util.find_spec("mcp_server_git") is not None:
        return
    reason = "needs git and mcp-server-git (the mcp integration's dev extra)"
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the third-party server tests: {reason}")
    pytest.skip(reason)


# Read-only tools only: a run must not be able to change the repository its answers come from.
READ_ONLY_TOOLS = ["git_log", "git_show", "git_status", "git_branch"]
SETTINGS = RolloutSettings(
    tool_choice="required",
    tools=READ_ONLY_TOOLS,
    parallel_tool_calls=False,
    max_turns=2,
    max_tokens=40,
    max_answer_chars=24,
    # The server may start slowly on a busy machine: its first stdio round trip takes ~1 s.
    connect_timeout_s=60.0,
)
CONFIG = art.TrainConfig(learning_rate=1e-3, lora_rank=4, lora_alpha=8)
COMMITS = [
    ("README.md", "hello\n", "Add the readme"),
    ("app.py", "print('hi')\n", "Write the app"),
    ("app.py", "print('hello')\n", "Fix the greeting"),
]


def git(repo: Path, *args: str) -> str:
    """Run git in ``repo`` with a fixed identity and clock (the repository is the same on
    every run), returning its stripped output."""
    env = {
        "GIT_AUTHOR_NAME": "Ada",
        "GIT_AUTHOR_EMAIL": "ada@example.com",
        "GIT_COMMITTER_NAME": "Ada",
        "GIT_COMMITTER_EMAIL": "ada@example.com",
        "GIT_AUTHOR_DATE": "2026-01-02T03:04:05+00:00",
        "GIT_COMMITTER_DATE": "2026-01-02T03:04:05+00:00",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_CONFIG_NOSYSTEM": "1",
        "PATH": "/usr/bin:/bin",
    }
    done = subprocess.run(
        ["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True
    )
    return done.stdout.strip()


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("git-repo")
    git(path, "init", "-q", "-b", "main")
    for name, text, message in COMMITS:
        (path / name).write_text(text)
        git(path, "add", name)
        git(path, "commit", "-q", "-m", message)
    git(path, "branch", "release")
    return path


def git_scenarios(repo: Path) -> list[Scenario]:
    """Tasks on ``repo`` whose expected answers are read from git, not written by hand."""
    where = f"The repository is at {repo}."
    return [
        Scenario(
            task=f"{where} What is the message of the latest commit?",
            answer=git(repo, "log", "-1", "--format=%s"),
            difficulty=1,
        ),
        Scenario(
            task=f"{where} What is the message of the first commit?",
            answer=git(repo, "log", "--reverse", "--format=%s").splitlines()[0],
            difficulty=2,
        ),
        Scenario(
            task=f"{where} Who is the author of the latest commit?",
            answer=git(repo, "log", "-1", "--format=%an"),
            difficulty=1,
        ),
    ]


def server_command(repo: Path) -> str:
    return f"mcp-server-git --repository {repo}"


def test_scenarios_are_checked_against_git(repo: Path) -> None:
    scenarios = git_scenarios(repo)
    assert [s.answer for s in scenarios] == ["Fix the greeting", "Add the readme", "Ada"]
    # the check itself: the right answer scores 1.0, a wrong one given as final less
    right = art.Trajectory(metadata={"final_answer": "It is: Fix the greeting"})
    wrong = art.Trajectory(metadata={"final_answer": "Write the app"})
    assert art_mcp.answer_reward(scenarios[0], right) == 1.0
    assert art_mcp.answer_reward(scenarios[0], wrong) == 0.2


async def test_git_server_runs_unchanged_and_trains_a_step(
    backend: art.LocalBackend, repo: Path
) -> None:
    model = await register_tiny_model(backend, "git-tiny", "mcp-third-party")
    scenarios = git_scenarios(repo)
    head = git(repo, "rev-parse", "HEAD")

    # Each run has its own seed: which runs answer (0.2) and which spend their turns on
    # tools (0.0) is then the same on every machine. Unseeded, about 2 runs in 3 answered, so
    # all 12 did in about 1 try of 130 (one CI run), and the step had no signal to train on.
    groups = await art.gather_trajectory_groups(
        art.TrajectoryGroup(
            art_mcp.rollout(
                model,
                scenario,
                server_command(repo),
                reward_fn=art_mcp.answer_reward,
                settings=replace(SETTINGS, extra_body={"seed": 4 * task + run}),
            )
            for run in range(4)
        )
        for task, scenario in enumerate(scenarios)
    )

    # (the Engine protocol does not declare it; every engine here has one)
    tokenizer = backend.engine(model).tokenizer  # type: ignore[attr-defined]
    tools_called: set[str] = set()
    for group in groups:
        assert len(group.trajectories) == 4
        for trajectory in group.trajectories:
            assert trajectory.metadata["mcp_server"].startswith("mcp-server-git")
            assert 0.0 <= trajectory.reward <= 1.0
            # token-exact: every recorded call decodes to the text the loop acted on
            assert_token_exact(trajectory, tokenizer)
            for call in trajectory.calls:
                for tool_call in call.response_message.get("tool_calls") or []:
                    name = tool_call["function"]["name"]
                    assert name in {*READ_ONLY_TOOLS, "complete_task"}
                    # (a call cut by max_tokens was completed by the parser: not in the text)
                    assert call.finish_reason == "length" or tool_call_in_text(
                        tool_call, call.completion_text
                    )
                    tools_called.add(name)
    assert tools_called & set(READ_ONLY_TOOLS), "no run reached the git server's tools"
    # the server only read: the repository the answers come from is unchanged
    assert git(repo, "rev-parse", "HEAD") == head

    rewards = [t.reward for g in groups for t in g.trajectories]
    assert len(set(rewards)) > 1, f"every run scored the same ({rewards[0]}): no signal"
    result = await model.train(groups, config=CONFIG)
    assert result.step == 1
    assert result.nothing_trained is None
