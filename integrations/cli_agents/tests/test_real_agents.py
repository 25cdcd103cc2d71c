"""Real command-line agents from the npm registry, unchanged, as rollouts: OpenAI's Codex CLI
(Responses API), Anthropic's Claude Code (Messages API) and opencode (Chat Completions).

A protocol test: ``bash run.sh test`` installs them (pinned) under ``.art/cli-agents`` (or
``$ART_CLI_AGENTS_DIR``); each runs with its real system prompt and its default (coding) tools
against tiny-qwen2.5 (random weights, a 32k context); every call it makes is recorded in its
rollout, through its own API, each turn continuing the ids sampled before; and the task's
check, which a run passes only by writing the answer, scores the run's folder. A random model
never writes it: its runs score 0.0 (a stand-in agent that writes it scores 1.0). Learning
from real agents' runs on a real model is test_real_model_agents.py's.
"""

from __future__ import annotations

import os
from pathlib import Path

import art_cli_agents as cli
import pytest

import art_core as art
from art_core.testing.checks import assert_prefix_chain

# run.sh installs it in the background while other tests run
pytestmark = pytest.mark.needs_install("cli-agents")

HERE = Path(__file__).parent
ROOT = HERE.parents[2]
BIN = (
    Path(os.environ.get("ART_CLI_AGENTS_DIR", ROOT / ".art" / "cli-agents"))
    / "node_modules"
    / ".bin"
)
WORD = "marmalade"
# A check that fails unless the run did the task: grep exits 1 for another text, 2 for no file.
TASK = cli.Task(
    f"Create a file named answer.txt in this folder containing only the word {WORD}.",
    folder=HERE / "task",
    check=f"grep -qx {WORD} answer.txt",
)
LIMITS = cli.Limits(timeout_s=300)


def binary(name: str) -> str:
    path = BIN / name
    if not path.exists():
        pytest.fail(
            f"{path} is missing: `bash run.sh test` installs the command-line agents (npm), "
            "or set ART_CLI_AGENTS_DIR to a folder where they are installed"
        )
    return str(path)


def agent(name: str) -> cli.CLIAgent:
    # Each with its default tools, a few for coding (Claude Code's full set is 51k tokens of
    # this model's 1024-token vocabulary, over the 32k context). Answers capped where the
    # agent allows it: a random model otherwise writes until the context is full.
    if name == "codex":
        return cli.codex(binary("codex"))
    if name == "claude":
        return cli.claude_code(binary("claude"), max_output_tokens=64)
    return cli.opencode(binary("opencode"), max_output_tokens=64)


def empty_reply(call: art.LLMCall) -> bool:
    """The call answered nothing: no text, no tool call, no reasoning."""
    message = call.response_message
    return not (
        message.get("content") or message.get("tool_calls") or message.get("reasoning_content")
    )


async def test_the_check_passes_only_a_run_that_did_the_task(
    cli_model: art.TrainableModel,
) -> None:
    """The check can pass and can fail: a stand-in agent that writes the answer scores 1.0,
    one that writes another word 0.0 (both without a model call)."""
    for word, reward, check_exit in ((WORD, 1.0, 0), ("jam", 0.0, 1)):
        writer = cli.CLIAgent("writer", ["sh", "-c", f"echo {word} > answer.txt"])
        trajectory = await cli.rollout(cli_model, writer, TASK, limits=LIMITS)
        assert trajectory.metrics["check_exit_code"] == check_exit, trajectory.logs
        assert trajectory.reward == reward


def check_run(trajectory: art.Trajectory, name: str, api: str) -> None:
    """One run of ``name``: recorded through ``api``, token-exact, scored by the check."""
    logs = "\n".join(trajectory.logs)
    # A random model rarely ends an answer by itself. Claude Code and Codex end with an error
    # when their answers are cut by the output cap: Claude Code at its
    # CLAUDE_CODE_MAX_OUTPUT_TOKENS; Codex 0.169 when a response comes back `incomplete`
    # (it sends no max_output_tokens: the gateway's default limit, 1024) and its retry is
    # cut too (seen in a CI run). The gateway must really have cut the answer. opencode
    # takes a cut answer as its last and exits 0.
    cut = bool(trajectory.calls) and trajectory.calls[-1].finish_reason == "length"
    capped = {
        "claude": "output token maximum" in logs,
        "codex": cut and "Incomplete response returned, reason: max_output_tokens" in logs,
        "opencode": False,
    }
    assert trajectory.metrics["exit_code"] == 0 or capped[name], logs
    assert trajectory.calls, logs
    assert {c.api for c in trajectory.calls} == {api}
    # Each turn continues the sampled ids. A reply with nothing in it (the random model
    # ended at once) is not sent back: the Messages API refuses an empty text block, so
    # Claude Code drops that turn and the next call continues the one before it.
    assert_prefix_chain([c for c in trajectory.calls if not empty_reply(c)])
    # The agent's own system prompt and tools: thousands of tokens.
    assert max(c.num_prompt_tokens for c in trajectory.calls) > 5000
    # The check ran in the run's copy of the folder, and failed: no answer was written.
    assert trajectory.metrics["check_exit_code"] in (1, 2), logs
    assert trajectory.reward == 0.0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "api"),
    [("codex", "responses"), ("claude", "messages"), ("opencode", "chat.completions")],
)
async def test_a_real_cli_agent_runs_and_is_recorded(
    cli_model: art.TrainableModel, name: str, api: str
) -> None:
    # Two concurrent runs: each its own rollout, folder and HOME.
    group = await cli.rollout_group(cli_model, agent(name), TASK, 2, limits=LIMITS)
    for trajectory in group:
        check_run(trajectory, name, api)
    ids = [{c.id for c in t.calls} for t in group]
    assert not ids[0] & ids[1]  # no call recorded in both rollouts
