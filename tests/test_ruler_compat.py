"""ART's way of calling RULER: positional ``extra_litellm_params`` and ``rubric``, ``debug``,
LiteLLM model ids (``"openai/o3"``, ``"anthropic/..."``, ``"hosted_vllm/..."``, ``"azure/..."``)
mapped to each provider's OpenAI-compatible endpoint. Every request goes to the loopback
stand-in judge; providers are pointed at it through their base-URL variables."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import pytest

from art_core.rewards import (
    DEFAULT_RUBRIC,
    PROVIDERS,
    RulerError,
    RulerOptions,
    resolve_judge,
    ruler,
    ruler_score_group,
)
from art_core.rewards.cli import add_parser
from art_core.rewards.cli import run as run_cli
from art_core.testing.judge import StandInJudge
from art_core.trajectories import Trajectory, TrajectoryGroup


def run(answer: str, hint: float) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "Answer the question."},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": f"{answer} score-hint: {hint}"},
    ]


def group(*hints: float) -> TrajectoryGroup:
    return TrajectoryGroup(
        Trajectory(messages_and_choices=run(f"answer {i}", h), reward=0.5)
        for i, h in enumerate(hints)
    )


async def test_art_positional_call_with_litellm_params_and_debug(
    judge: StandInJudge, capsys: pytest.CaptureFixture[str]
) -> None:
    scored = group(0.8, 0.3)
    params = {
        "api_base": judge.base_url,
        "api_key": "litellm-key",
        "temperature": 0.4,
        "max_tokens": 512,
        "reasoning_effort": "low",
        "extra_body": {"top_k": 20},
        "extra_headers": {"X-Team": "rl"},
        "caching": False,
        "num_retries": 3,
        "metadata": {"run": "x"},
    }

    result = await ruler_score_group(
        scored, "hosted_vllm/qwen3-judge", params, DEFAULT_RUBRIC, debug=True
    )

    assert result is scored and [t.reward for t in scored] == [0.8, 0.3]
    [body] = judge.requests
    assert body["model"] == "qwen3-judge"  # the provider prefix is not sent
    assert body["temperature"] == 0.4 and body["max_tokens"] == 512 and body["top_k"] == 20
    assert body["reasoning_effort"] == "low"
    for ignored in ("caching", "num_retries", "metadata", "api_base", "api_key", "extra_body"):
        assert ignored not in body
    assert judge.headers[0]["authorization"] == "Bearer litellm-key"
    assert judge.headers[0]["x-team"] == "rl"
    out = capsys.readouterr().out
    assert "[RULER] judge prompt for qwen3-judge:" in out and "score-hint: 0.8" in out
    reply = out.split("[RULER] judge reply (attempt 1):\n", 1)[1]
    assert json.loads(reply[: reply.rindex("}") + 1])["scores"][0]["score"] == 0.8

    # The same call again is answered by the cache, and debug says so.
    await ruler_score_group(group(0.8, 0.3), "hosted_vllm/qwen3-judge", params, debug=True)
    assert len(judge.requests) == 1
    assert "[RULER] judge reply (from the cache):" in capsys.readouterr().out


async def test_the_default_judge_is_arts_openai_o3(
    judge: StandInJudge, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", judge.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "openai-key")
    scored = await ruler_score_group(group(0.2, 0.9))
    assert scored is not None and [t.reward for t in scored] == [0.2, 0.9]
    assert judge.requests[0]["model"] == "o3"
    assert judge.headers[0]["authorization"] == "Bearer openai-key"
    assert scored.trajectories[0].metadata["ruler"]["judge_model"] == "o3"


HOSTED = [name for name, p in PROVIDERS.items() if p.needs_key and not p.needs_base and p.base_url]


@pytest.mark.parametrize("prefix", HOSTED)
async def test_each_provider_prefix_uses_its_key_variable_and_endpoint(
    judge: StandInJudge, monkeypatch: pytest.MonkeyPatch, prefix: str
) -> None:
    provider = PROVIDERS[prefix]
    monkeypatch.setenv(provider.key_vars[0], f"{prefix}-key")
    endpoint = resolve_judge(f"{prefix}/vendor/model-1")
    assert endpoint.base_url == provider.base_url and endpoint.model == "vendor/model-1"
    assert endpoint.api_key == f"{prefix}-key"

    # The same request, sent to the stand-in through the provider's base-URL variable.
    monkeypatch.setenv(provider.base_vars[0], judge.base_url)
    scores = await ruler([run("a", 0.1), run("b", 0.6)], f"{prefix}/vendor/model-1")
    assert [s.score for s in scores] == [0.1, 0.6]
    assert judge.requests[0]["model"] == "vendor/model-1"
    assert judge.headers[0]["authorization"] == f"Bearer {prefix}-key"


def test_public_endpoints_and_what_is_missing(
    judge: StandInJudge, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (the judge fixture clears the machine's judge variables; its server is not used here)
    with pytest.raises(ValueError, match="ANTHROPIC_API_KEY"):
        resolve_judge("anthropic/claude-sonnet-4-5")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "a-key")
    anthropic = resolve_judge("anthropic/claude-sonnet-4-5")
    assert (anthropic.base_url, anthropic.model) == (
        "https://api.anthropic.com/v1/",
        "claude-sonnet-4-5",
    )
    with pytest.raises(ValueError, match="OPENAI_API_KEY"):
        resolve_judge("openai/gpt-4.1")
    with pytest.raises(ValueError, match="HOSTED_VLLM_API_BASE"):
        resolve_judge("hosted_vllm/qwen3")
    with pytest.raises(ValueError, match="AZURE_API_BASE"):
        resolve_judge("azure/my-deployment", judge_api_key="k")
    # a local server needs no key
    local = resolve_judge("vllm/qwen3", "http://127.0.0.1:8000/v1")
    assert (local.model, local.api_key) == ("qwen3", "EMPTY")
    # with an explicit judge_base_url, names are sent as written (OpenRouter's own ids)
    assert resolve_judge("openai/gpt-4.1", "https://openrouter.ai/api/v1").model == (
        "openai/gpt-4.1"
    )
    # an unknown prefix is part of the model name
    assert resolve_judge("Qwen/Qwen3-8B", "http://h/v1").model == "Qwen/Qwen3-8B"
    # LiteLLM's custom_llm_provider names the provider of an unprefixed name
    provided = resolve_judge("claude-x", extra_litellm_params={"custom_llm_provider": "anthropic"})
    assert (provided.model, provided.base_url) == ("claude-x", "https://api.anthropic.com/v1/")
    with pytest.raises(ValueError, match="unknown custom_llm_provider"):
        resolve_judge("m", extra_litellm_params={"custom_llm_provider": "nope"})


async def test_azure_deployments_with_and_without_an_api_version(judge: StandInJudge) -> None:
    runs = [run("a", 0.3), run("b", 0.7)]
    params = {"api_base": judge.url, "api_key": "azure-key", "api_version": "2024-10-21"}
    scores = await ruler(runs, "azure/my-judge", params, cache=False)
    assert [s.score for s in scores] == [0.3, 0.7]
    assert judge.urls[-1] == "/openai/deployments/my-judge/chat/completions?api-version=2024-10-21"
    assert judge.headers[-1]["api-key"] == "azure-key"

    # Azure's v1 API: plain OpenAI-compatible, the deployment as the model
    await ruler(runs, "azure/my-judge", {"api_base": judge.url, "api_key": "k"}, cache=False)
    assert judge.urls[-1] == "/openai/v1/chat/completions"
    assert judge.requests[-1]["model"] == "my-judge"


async def test_litellm_timeout_applies_and_extra_params_win(judge: StandInJudge) -> None:
    judge.script = ["slow", "slow"]
    with pytest.raises(RulerError, match="timeout"):
        await ruler(
            [run("a", 0.3), run("b", 0.7)],
            "judge",
            {"timeout": 0.3},
            judge_base_url=judge.base_url,
            cache=False,
        )
    options = RulerOptions(
        extra_litellm_params={"temperature": 1.0, "timeout": 5},
        extra_params={"temperature": 0.0},
        request_timeout=60,
    )
    assert options.body_params == {"temperature": 0.0} and options.timeout_s == 60


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        ("temperature=0", "must be a dict"),
        ({"api_base": 42}, "api_base"),
        ({"timeout": -1}, "timeout"),
        ({"extra_headers": {"X": 1}}, "extra_headers"),
        ({"extra_body": [1]}, "extra_body"),
    ],
)
async def test_bad_litellm_params_fail_before_any_request(
    judge: StandInJudge, params: object, problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        await ruler_score_group(
            group(0.1, 0.2),
            "judge",
            params,  # type: ignore[arg-type]
            judge_base_url=judge.base_url,
            swallow_exceptions=True,
        )
    assert judge.requests == []


async def test_the_cli_takes_litellm_ids(judge: StandInJudge, tmp_path: Path) -> None:
    source = tmp_path / "groups.jsonl"
    source.write_text(group(0.4, 0.6).model_dump_json() + "\n")
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(
        [
            "ruler",
            str(source),
            "--judge-model",
            "hosted_vllm/qwen3",
            "--judge-base-url",
            judge.base_url,
        ]
    )
    assert await asyncio.to_thread(run_cli, args) == 0  # the CLI runs its own event loop
    assert judge.requests[0]["model"] == "qwen3"
