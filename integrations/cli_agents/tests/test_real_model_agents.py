"""Real command-line agents doing a real task with a real model, then a GRPO step on it.

Codex CLI, Claude Code and opencode, unchanged (``bash run.sh test`` installs them, pinned),
each run twice on one task with the real Qwen2.5-Coder-0.5B-Instruct (a hash-pinned
GGUF from PyPI, ``art_core.embedded.qwen_gguf``; converted once into the shared models
folder), in fp32 so that what it samples does not depend on the CPU's bf16 support. Each
agent gets a prompt for small models (``cli.small_model_prompt``: its own system prompt is
2-5k tokens a 0.5B model gets lost in), only the tools the task needs, and a seeded rollout
temperature (``art.RolloutSampling``): the runs of a group differ, and the same seed replays
them. The check is real and fails on a wrong answer: one run of the pair solves the task and
the other does not, and the GRPO step on the group changes the adapter.

Sized to what the check needs: the task is to write one file, so Claude Code gets only
``Write`` and one turn (its tool call runs, then the turn limit ends the run), opencode only
``edit`` (its ``write``) and two steps (at its last step it may not call tools), answers
capped at 64 tokens (a write call takes 23-40), and Codex and opencode one call each
(``Limits(max_calls=1)``: the gateway refuses the second unsampled, and the run ends as the
agent asks for it, its tool call run). Their first prompts are 0.5-1.3k
tokens (1.9-2.8k with every coding tool and three turns, which made each test 2-5 minutes).
A group is two runs, the fewest that hold a solving and a failing run: each seed of ``AGENTS``
was chosen by running groups of two (Claude Code: 6 of seeds 1-8 gave one of each; opencode:
1 of seeds 1-3; Codex: seeds 1 and 2). In a whole run under CI, groups of four took 82 s
(Codex), 73 s (opencode) and 24 s (Claude Code), groups of two 72 s, 52 s and 18 s: the first
prompt's prefill is shared by the group (prefix cache), its decoding and the training step are
not. Each run ended at its call bound (instead of 10 s after Codex's first answer, in which
its runs made 3 more calls, and after opencode's second step), a group alone on 2 idle cores
takes 27 s instead of 32 s (Codex) and 21 s instead of 38 s (opencode), with the same
rewards. Nothing smaller shows an agent solving a real task with a real model.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import art_cli_agents as cli
import pytest
import pytest_asyncio
from safetensors.torch import load_file

import art_core as art
from art_core.embedded import models_dir
from art_core.embedded.qwen_gguf import fetch_qwen25_coder

# The real 0.5B model: never beside another memory-heavy test under xdist; run.sh installs
# the agents in the background while other tests run.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.memory_heavy,
    pytest.mark.needs_install("cli-agents", "faketime"),
]

ROOT = Path(__file__).parents[3]
BIN = (
    Path(os.environ.get("ART_CLI_AGENTS_DIR", ROOT / ".art" / "cli-agents"))
    / "node_modules"
    / ".bin"
)
TASK = cli.Task(
    "Create a file named hello.txt in the current folder whose whole content is the word hello.",
    # $(cat ...) drops the trailing newline: `echo hello > hello.txt` counts, "hello world"
    # or a file elsewhere does not.
    check='test "$(cat hello.txt)" = hello',
)


def binary(name: str) -> str:
    path = BIN / name
    if not path.exists():
        pytest.fail(
            f"{path} is missing: `bash run.sh test` installs the command-line agents (npm), "
            "or set ART_CLI_AGENTS_DIR to a folder where they are installed"
        )
    return str(path)


# Each agent with its tools and prompt, the rollout seed and temperature of its group (chosen
# once by running: a seed decides the group's runs), and its limits. Claude Code stops after
# its turn; opencode's second step may not call tools, so its run ends when it asks for that
# step (Limits.max_calls=1); Codex has no turn bound, and a 0.5B model rarely ends a run by
# itself: its run ends when it asks for a second call too. The gateway refuses that call
# unsampled, so the calls end the runs, never the clock, and the check scores what the first
# call's tool left (each solving run writes the file there). Before, a Codex run was stopped
# 10 s after its first answer (its runs made 3 more calls in those 10 s, computed and trained
# on), and a time limit before that (90 s): the first answers of the group take 15-20 s with
# this 2-core machine to itself but 46-90 s under CI (one core, beside the background
# installs), so how far a run got, and the test, depended on the machine.
# The agents write today's date into their prompts: a seeded group replays only if that date
# is always the same (art_cli_agents.clock). Claude Code and opencode run on a fixed clock;
# Codex (a static binary libfaketime cannot reach) leaves its date out.
AGENTS: dict[str, tuple[Callable[[], cli.CLIAgent], art.RolloutSampling, cli.Limits]] = {
    "codex": (
        lambda: cli.codex(
            binary("codex"), system_prompt=cli.CODEX_SMALL_MODEL_PROMPT, environment_context=False
        ),
        art.RolloutSampling(seed=1, temperature=1.0),
        cli.Limits(timeout_s=600, max_calls=1),
    ),
    "claude": (
        lambda: cli.fixed_clock(
            cli.claude_code(
                binary("claude"),
                tools=("Write",),
                max_output_tokens=64,
                system_prompt=cli.small_model_prompt(
                    "Write (file_path, content) creates a file.",
                    'Write with {"file_path": "notes.txt", "content": "hi"}',
                ),
                max_turns=1,
            )
        ),
        art.RolloutSampling(seed=1, temperature=1.0),
        cli.Limits(timeout_s=600),
    ),
    "opencode": (
        lambda: cli.fixed_clock(
            cli.opencode(
                binary("opencode"),
                tools=("edit",),
                max_output_tokens=64,
                system_prompt=cli.small_model_prompt(
                    "write (filePath, content) creates a file.",
                    'write with {"filePath": "notes.txt", "content": "hi"}',
                ),
                max_turns=2,
            )
        ),
        art.RolloutSampling(seed=2, temperature=1.0),
        cli.Limits(timeout_s=600, max_calls=1),
    ),
}


# Qwen2.5-0.5B's last two of its 24 layers, every projection (peft matches a name's suffix).
TOP_LAYERS = tuple(
    f"layers.{layer}.{module}"
    for layer in (22, 23)
    for module in (
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    )
)


@pytest_asyncio.fixture(loop_scope="session")
async def backend(tmp_path: Path) -> AsyncIterator[art.LocalBackend]:
    """Each test's own backend in fp32, closed after it: one agent's model and trainer (the
    0.5B model, its fp32 training on 2 runs of 0.5-1.3k-token turns) are gone before the next
    agent's load (three at once went past 22 GB and the kernel killed the worker)."""
    async with art.LocalBackend(path=tmp_path / "cli-qwen", dtype="float32") as local:
        yield local


def qwen_gguf() -> Path:
    given = os.environ.get("ART_QWEN_GGUF")
    return Path(given) if given else fetch_qwen25_coder(models_dir())


@pytest.mark.parametrize("name", list(AGENTS))
async def test_a_real_agent_solves_a_real_task_and_trains(
    backend: art.LocalBackend, name: str
) -> None:
    make_agent, sampling, limits = AGENTS[name]
    model = art.TrainableModel(name=f"qwen-{name}", project="cli", base_model=str(qwen_gguf()))
    await model.register(backend)
    group = await cli.rollout_group(model, make_agent(), TASK, 2, limits=limits, sampling=sampling)
    report = "\n\n".join(
        f"run {i}: reward {t.reward}, {len(t.calls)} calls\n" + "\n".join(t.logs)
        for i, t in enumerate(group)
    )
    rewards = [t.reward for t in group]
    # The real check ran on each run's own folder: some solved the task, some did not.
    assert 1.0 in rewards and 0.0 in rewards, report
    for trajectory in group:
        assert trajectory.calls, report
        assert trajectory.metrics["timed_out"] is False, report  # turns end the runs
        # The gateway applied the rollout's settings to every call, whatever the agent asked.
        for call in trajectory.calls:
            applied = call.request_params["rollout_sampling"]
            assert applied["temperature"] == sampling.temperature, call.request_params
    # Recomputed activations: the fp32 step on 2 runs of 0.5-1.3k-token turns stays a few GB,
    # so one micro-batch holds the whole group, its shared prompt run once (a budget of 4096
    # tokens once cut a group in two and ran its shared prompt twice). The adapter on
    # the top two layers only: the backward pass stops there, and the step takes a half to a
    # third of its time with every layer (measured: codex 18 s vs 54 s, Claude Code 62 s vs
    # 134 s); what it checks is the same, a real agent's group trains the adapter.
    config = art.TrainConfig(
        learning_rate=1e-4,
        gradient_checkpointing=True,
        max_tokens_per_batch=8192,
        lora_target_modules=TOP_LAYERS,
    )
    result = await model.train([group], config=config)
    assert result.nothing_trained is None and await model.get_step() == 1, result
    folder = backend.model_folder(model).checkpoint(1)
    weights = load_file(str(folder / "adapter_model.safetensors"))
    assert any(k.endswith("lora_B.weight") and v.abs().sum() > 0 for k, v in weights.items())
    assert all(".layers.22." in k or ".layers.23." in k for k in weights), sorted(weights)
