"""A real verifiers environment (``environments/reverse_words.py``, written the way verifiers'
documentation shows one) run unchanged in the verifiers runtime, through the gateway, scored
by its own rubric, and trained on for a step."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from art_verifiers import VerifiersEnv, VerifiersError, is_installed, rollout_groups, runtime
from art_verifiers.rollout import validate_results

import art_core as art
from art_core.testing.checks import assert_token_exact
from art_core.testing.pytest_plugin import register_tiny_model

# run.sh installs the verifiers runtime in the background while other tests run
pytestmark = pytest.mark.needs_install("verifiers")

ENVIRONMENTS = Path(__file__).parent / "environments"
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "VF_LOG_LEVEL": "WARNING"}
ENV = VerifiersEnv("reverse_words", paths=[str(ENVIRONMENTS)], env_vars=OFFLINE)
CONFIG = art.TrainConfig(learning_rate=1e-3, lora_rank=4, lora_alpha=8)
# The environment's rubric: lcs_reward (weight 1.0) + exact_reward (weight 0.5).
WEIGHTS = {"lcs_reward": 1.0, "exact_reward": 0.5}


def need_runtime() -> None:
    """Skip without the verifiers runtime (fail under CI, which must run these tests)."""
    if is_installed():
        return
    reason = "the verifiers runtime is not installed: art-core verifiers install"
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the verifiers tests: {reason}")
    pytest.skip(reason)


async def test_environment_runs_unchanged_scores_and_trains_a_step(
    backend: art.LocalBackend,
) -> None:
    need_runtime()
    model = await register_tiny_model(backend, "vf-tiny", "verifiers-tests")
    groups = await rollout_groups(
        model,
        ENV,
        [0, 1, 2],
        rollouts_per_example=4,
        sampling_args={"max_tokens": 16, "temperature": 1.0},
        # tiny-random sometimes ends its reply at once: verifiers fails such a rollout
        # (EmptyModelResponseError), which is then kept in its group's exceptions
        raise_on_error=False,
    )
    assert [g.metadata["example"] for g in groups] == [0, 1, 2]
    # (the Engine protocol does not declare it; every engine here has one)
    tokenizer = backend.engine(model).tokenizer  # type: ignore[attr-defined]
    for group in groups:
        assert len(group.trajectories) + len(group.exceptions) == 4
        for failure in group.exceptions:
            assert "EmptyModelResponseError" in failure.message, failure.message
        for trajectory in group.trajectories:
            # one call (a SingleTurnEnv), recorded token-exactly under this rollout
            (call,) = trajectory.calls
            assert_token_exact(trajectory, tokenizer)
            assert call.prompt_token_ids and call.completion_token_ids
            assert call.messages[-1]["content"].startswith("Reverse the text: ")
            # the completion the environment scored is the text of the sampled ids
            seen = trajectory.metadata["completion"]
            assert [m["role"] for m in seen] == ["assistant"]
            assert seen[0]["content"] == call.response_message["content"]
            decoded = tokenizer.decode(call.completion_token_ids, skip_special_tokens=True)
            assert decoded.strip() == seen[0]["content"].strip()
            # the reward is the rubric's weighted sum of its functions' scores (the metrics
            # also hold verifiers' own, e.g. num_turns)
            assert set(WEIGHTS) <= set(trajectory.metrics)
            assert trajectory.metrics["num_turns"] == 1
            expected = sum(w * trajectory.metrics[k] for k, w in WEIGHTS.items())
            assert trajectory.reward == pytest.approx(expected)
            assert trajectory.metadata["answer"] == call.messages[-1]["content"][18:][::-1]

    rewards = [t.reward for g in groups for t in g.trajectories]
    assert len(set(rewards)) > 1, f"every rollout scored {rewards[0]}: no signal to train on"
    result = await model.train(groups, config=CONFIG)
    assert result.step == 1
    assert result.nothing_trained is None


async def test_a_multi_turn_tool_environment_runs_and_the_step_says_why_it_learned_nothing(
    backend: art.LocalBackend,
) -> None:
    """A ``vf.ToolEnv``: the environment runs the tool between the model's turns, each turn one
    recorded call reading the tool results before it; tiny-random never earns the rubric's
    exact-answer reward, so the step trains nothing and its diagnoses say why."""
    need_runtime()
    model = await register_tiny_model(backend, "vf-tools", "verifiers-tests")
    env = VerifiersEnv("adder_tools", paths=[str(ENVIRONMENTS)], env_vars=OFFLINE)
    groups = await rollout_groups(
        model,
        env,
        [0, 1],
        rollouts_per_example=2,
        # every turn a call of the tool (grammar-forced), so the environment runs it
        sampling_args={"max_tokens": 96, "tool_choice": "required"},
    )
    tokenizer = backend.engine(model).tokenizer  # type: ignore[attr-defined]
    for trajectory in [t for g in groups for t in g.trajectories]:
        assert_token_exact(trajectory, tokenizer)
        calls = sorted(trajectory.calls, key=lambda c: c.index)
        roles = [m["role"] for m in trajectory.metadata["completion"]]
        # one recorded call per assistant turn, the environment's tool results in between
        assert len(calls) == roles.count("assistant") == trajectory.metrics["num_turns"] > 1
        # the tool ran for every call but those of the last turn (the turn limit came first)
        called = [len(c.response_message.get("tool_calls") or []) for c in calls]
        assert sum(called) == trajectory.metrics["total_tool_calls"]
        assert roles.count("tool") == sum(called[:-1]) >= 1
        tools_read = [m for m in calls[1].messages if m["role"] == "tool"]
        assert tools_read and all(isinstance(m["content"], str) for m in tools_read)
        assert [t["function"]["name"] for t in calls[0].tools or []] == ["add"]
    result = await model.train(groups, config=CONFIG)
    assert result.nothing_trained is not None
    constant = next(d for d in result.diagnoses if d.code == "constant_reward")
    assert constant.finding.startswith("every one of the 4 runs got reward 0")


async def test_a_broken_environment_fails_with_the_runtime_s_own_words(
    backend: art.LocalBackend,
) -> None:
    need_runtime()
    model = await register_tiny_model(backend, "vf-broken", "verifiers-tests")
    missing = VerifiersEnv("no_such_environment_here", env_vars=OFFLINE, timeout_s=120)
    with pytest.raises(VerifiersError, match="no_such_environment_here"):
        await rollout_groups(model, missing, [0], rollouts_per_example=2)
    # a row the dataset does not have is that rollout's error, named
    with pytest.raises(VerifiersError, match=r"example 99 is not in 0\.\.5"):
        await rollout_groups(model, ENV, [99], rollouts_per_example=1)
    (group,) = await rollout_groups(model, ENV, [99], rollouts_per_example=2, raise_on_error=False)
    assert not group.trajectories and len(group.exceptions) == 2


def test_inputs_and_runtime_output_are_validated() -> None:
    with pytest.raises(ValueError, match="split must be"):
        VerifiersEnv("x", split="test")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="environment is empty"):
        VerifiersEnv(" ")
    with pytest.raises(VerifiersError, match="expected 2 results"):
        validate_results({"results": []}, 2)
    with pytest.raises(VerifiersError, match="not the result of rollout 0"):
        validate_results({"results": [{"index": 1, "error": "x"}]}, 1)
    bad_metrics = {"index": 0, "reward": 1.0, "metrics": {"a": "high"}, "completion": []}
    with pytest.raises(VerifiersError, match="metrics must map names"):
        validate_results({"results": [bad_metrics]}, 1)
    bad_completion = {"index": 0, "reward": 1.0, "metrics": {}, "completion": "text"}
    with pytest.raises(VerifiersError, match="completion must be a list"):
        validate_results({"results": [bad_completion]}, 1)
    nan = {"index": 0, "reward": float("nan"), "metrics": {}, "completion": []}
    with pytest.raises(VerifiersError, match="finite number"):
        validate_results({"results": [nan]}, 1)


def test_install_keeps_the_venv_and_adds_only_missing_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ART_CORE_RUNTIMES_DIR", str(tmp_path))
    monkeypatch.delenv(runtime.PYTHON_ENV, raising=False)
    commands: list[list[str]] = []
    # What the runtime asks art_core.venvs to do: a new venv, packages into a venv's python.
    monkeypatch.setattr(
        runtime.venvs, "create_venv", lambda target: commands.append(["venv", str(target)])
    )
    monkeypatch.setattr(
        runtime.venvs,
        "install",
        lambda python, packages, quiet: commands.append(["install", str(python), *packages]),
    )
    assert not runtime.is_installed()
    target = runtime.runtime_dir()
    target.mkdir()
    marker = target / runtime.MARKER
    marker.write_text(json.dumps({"pins": [*runtime.PINS, "my-env"]}))
    assert runtime.is_installed()
    # installed already (run.sh's install, without extras, must not wipe a user's environments)
    assert runtime.install_runtime() == target and runtime.install_runtime(extra=("my-env",))
    assert commands == []
    runtime.install_runtime(extra=("my-env", "other-env"))
    assert commands == [["install", str(target / "bin" / "python"), "other-env"]]
    assert json.loads(marker.read_text())["pins"] == [*runtime.PINS, "my-env", "other-env"]
    # another verifiers pin: a fresh venv
    marker.write_text(json.dumps({"pins": ["verifiers==0.0.1"]}))
    assert not runtime.is_installed()
    commands.clear()
    runtime.install_runtime()
    assert commands[0] == ["venv", str(target)]
    assert commands[-1] == ["install", str(target / "bin" / "python"), *runtime.PINS]
