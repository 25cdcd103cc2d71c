"""Real command-line agents from the npm registry, unchanged, as rollouts: OpenAI's Codex CLI
(Responses API) and Anthropic's Claude Code (Messages API).

``bash run.sh test`` installs them (pinned) under ``.art/cli-agents`` (or
``$ART_CLI_AGENTS_DIR``). Each sends its real system prompt and tools (10-25k tokens: the
test model, tiny-qwen2.5, has a 32k context), its calls are recorded in its rollout, and a
train step on a group of their runs changes the adapter.
"""

from __future__ import annotations

import os
from pathlib import Path

import art_cli_agents as cli
import pytest
from safetensors.torch import load_file

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
TASK = cli.Task(
    "Read README.md and say what this folder holds.",
    folder=HERE / "task",
    check="test -f README.md",
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
    if name == "codex":
        return cli.codex(binary("codex"))
    # Answers capped: a random model otherwise writes until the context is full. Three of
    # its tools: with all 25 (and this model's 1024-token vocabulary) its request is 50k
    # tokens, over the 32k context; with these, 7.6k.
    return cli.claude_code(
        binary("claude"), max_output_tokens=64, extra_args=["--tools", "Read,Bash,Edit"]
    )


def empty_reply(call: art.LLMCall) -> bool:
    """The call answered nothing: no text, no tool call, no reasoning."""
    message = call.response_message
    return not (
        message.get("content") or message.get("tool_calls") or message.get("reasoning_content")
    )


@pytest.mark.slow
@pytest.mark.parametrize(("name", "api"), [("codex", "responses"), ("claude", "messages")])
async def test_a_real_cli_agent_runs_records_and_trains(
    backend: art.LocalBackend, name: str, api: str
) -> None:
    model = art.TrainableModel(name=f"cli-{name}", project="tests", base_model="tiny-qwen2.5")
    await model.register(backend)
    group = await cli.rollout_group(model, agent(name), TASK, 2, limits=LIMITS)
    for i, trajectory in enumerate(group):
        logs = "\n".join(trajectory.logs)
        # A random model rarely ends an answer by itself. Both agents end with an error when
        # their answers are cut by the output cap: Claude Code at its
        # CLAUDE_CODE_MAX_OUTPUT_TOKENS; Codex 0.169 when a response comes back `incomplete`
        # (max_output_tokens, which the gateway lowers to what the context leaves) and its
        # retry is cut too (seen in a CI run). The gateway must really have cut the answer.
        cut = bool(trajectory.calls) and trajectory.calls[-1].finish_reason == "length"
        capped = {
            "claude": "output token maximum" in logs,
            "codex": cut and "Incomplete response returned, reason: max_output_tokens" in logs,
        }
        assert trajectory.metrics["exit_code"] == 0 or capped[name], logs
        # Each turn continues the sampled ids. A reply with nothing in it (the random model
        # ended at once) is not sent back: the Messages API refuses an empty text block, so
        # Claude Code drops that turn and the next call continues the one before it.
        assert_prefix_chain([c for c in trajectory.calls if not empty_reply(c)])
        assert trajectory.reward == 1.0  # the check ran in the run's copy of the folder
        assert trajectory.calls, "\n".join(trajectory.logs)
        assert {c.api for c in trajectory.calls} == {api}
        # The agent's own system prompt and tools: thousands of tokens.
        assert max(c.num_prompt_tokens for c in trajectory.calls) > 5000
        trajectory.reward = float(i)  # unequal rewards: the group has something to learn
    result = await model.train([group], config=art.TrainConfig())
    assert await model.get_step() == 1, result
    folder = backend.model_folder(model).checkpoint(1)
    weights = load_file(str(folder / "adapter_model.safetensors"))
    assert any(k.endswith("lora_B.weight") and v.abs().sum() > 0 for k, v in weights.items())
