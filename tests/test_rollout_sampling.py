"""Rollout-scoped sampling settings: ``art.capture(model, sampling=art.RolloutSampling(...))``.

Every call of the rollout, in every wire API, samples with the rollout's temperature / top_p
and (when it brings no seed of its own) a seed derived from the rollout's: the same rollout
seed replays the same run, whatever the agent sends. Set over HTTP
(``PUT /rollouts/{id}/sampling``), bounded, dropped when the rollout is released.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

os.environ.setdefault(
    "ART_CORE_MODELS_DIR", str(Path(tempfile.gettempdir()) / "art-core-test-models")
)

from remote_support import ServerProcess

import art_core as art
from art_core.gateway.rollout_sampling import RolloutSamplingStore

MODEL = "tiny"
MESSAGES = [{"role": "user", "content": "Tell me a story about a fox."}]
TOKENS = 8


def root(model: art.TrainableModel) -> str:
    assert model.inference_base_url is not None
    return model.inference_base_url.removesuffix("/").removesuffix("/v1")


async def agent_turns(run: art.Run, temperature: float = 1.0) -> None:
    """What an agent without seeds sends: two chat turns, an Anthropic Messages call, a
    Responses call and a legacy completion, each unseeded."""
    client = run.openai_client()
    for _ in range(2):  # the same request twice: each call of a run draws its own tokens
        await client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=TOKENS, temperature=temperature
        )
    await run.anthropic_client().messages.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=TOKENS,
        # This client version has no temperature argument; Anthropic's range is 0-1.
        extra_body={"temperature": min(temperature, 1.0)},
    )
    await client.responses.create(
        model=MODEL,
        input="Tell me a story about a fox.",
        max_output_tokens=TOKENS,
        temperature=temperature,
    )
    await client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=TOKENS, temperature=temperature
    )


async def sampled(model: art.TrainableModel, sampling: art.RolloutSampling | None) -> list[Any]:
    async with art.capture(model, sampling=sampling) as run:
        await agent_turns(run)
    assert [c.api for c in run.calls] == [
        "chat.completions",
        "chat.completions",
        "messages",
        "responses",
        "completions",
    ]
    return run.calls


async def test_the_same_rollout_seed_replays_the_run_in_every_api(
    tiny_model: art.TrainableModel,
) -> None:
    first = await sampled(tiny_model, art.RolloutSampling(seed=7))
    again = await sampled(tiny_model, art.RolloutSampling(seed=7))
    other = await sampled(tiny_model, art.RolloutSampling(seed=8))
    tokens = [c.completion_token_ids for c in first]
    assert [c.completion_token_ids for c in again] == tokens
    assert [c.completion_token_ids for c in other] != tokens
    # Each call got its own derived seed (the two identical chat turns drew differently),
    # recorded with what the agent asked, and the same seeds again for the same rollout seed.
    seeds = [c.request_params["rollout_sampling"]["seed"] for c in first]
    assert len(set(seeds)) == len(seeds)
    assert seeds == [c.request_params["rollout_sampling"]["seed"] for c in again]
    assert tokens[0] != tokens[1]
    assert all(c.request_params["rollout_sampling"]["rollout_seed"] == 7 for c in first)
    assert "seed" not in first[0].request_params  # the agent sent none
    assert first[0].request_params["temperature"] == 1.0


async def test_a_group_of_concurrent_rollouts_replays(tiny_model: art.TrainableModel) -> None:
    """A group run at once (its calls batched together in the engine) samples the same
    tokens each time: each seeded row draws from its own generator."""

    async def one(seed: int) -> list[list[int]]:
        async with art.capture(tiny_model, sampling=art.RolloutSampling(seed=seed)) as run:
            await agent_turns(run)
        return [c.completion_token_ids for c in run.calls]

    groups = [await asyncio.gather(*(one(seed) for seed in range(4))) for _ in range(2)]
    assert groups[0] == groups[1]
    assert len({str(tokens) for tokens in groups[0]}) == 4  # and the rollouts differ


async def test_a_rollout_temperature_of_zero_samples_greedily(
    tiny_model: art.TrainableModel,
) -> None:
    async with art.capture(tiny_model) as reference:  # the request itself asks for greedy
        await agent_turns(reference, temperature=0.0)
    runs = []
    for seed in (1, 2):
        sampling = art.RolloutSampling(temperature=0.0, seed=seed)
        async with art.capture(tiny_model, sampling=sampling) as run:
            await agent_turns(run, temperature=1.5)
        runs.append(run)
    expected = [c.completion_token_ids for c in reference.calls]
    for run in runs:
        assert [c.completion_token_ids for c in run.calls] == expected
        chat, messages, responses, completions = run.calls[0], *run.calls[2:]
        # The agent's own value is kept; what was applied is recorded next to it.
        assert chat.request_params["temperature"] == 1.5
        assert responses.request_params["temperature"] == 1.5
        assert completions.request_params["temperature"] == 1.5
        assert messages.request_params["temperature"] == 1.0
        for call in run.calls:
            assert call.request_params["rollout_sampling"]["temperature"] == 0.0


async def test_responses_answer_with_the_applied_settings(tiny_model: art.TrainableModel) -> None:
    sampling = art.RolloutSampling(temperature=0.0, top_p=0.5)
    async with art.capture(tiny_model, sampling=sampling) as run:
        response = await run.openai_client().responses.create(
            model=MODEL, input="hi", max_output_tokens=4, temperature=1.5, top_p=1.0
        )
    assert (response.temperature, response.top_p) == (0.0, 0.5)
    recorded = run.calls[0].request_params
    assert (recorded["temperature"], recorded["top_p"]) == (1.5, 1.0)
    assert recorded["rollout_sampling"] == {"temperature": 0.0, "top_p": 0.5}


async def test_a_call_with_its_own_seed_keeps_it(tiny_model: art.TrainableModel) -> None:
    request = {"model": MODEL, "messages": MESSAGES, "max_tokens": TOKENS, "seed": 5}
    async with art.capture(tiny_model) as plain:
        await plain.openai_client().chat.completions.create(**request)
    async with art.capture(tiny_model, sampling=art.RolloutSampling(seed=99)) as run:
        await run.openai_client().chat.completions.create(**request)
    (call,) = run.calls
    assert call.completion_token_ids == plain.calls[0].completion_token_ids
    assert call.request_params["seed"] == 5
    assert call.request_params["rollout_sampling"] == {"rollout_seed": 99}


async def test_settings_come_before_any_call_and_go_at_release(
    backend: art.LocalBackend, tiny_model: art.TrainableModel
) -> None:
    settings = backend.gateway.rollout_sampling
    async with httpx.AsyncClient(timeout=30) as http:
        # A rollout that has not called yet (or never will): fine.
        url = f"{root(tiny_model)}/rollouts/not-yet-called/sampling"
        response = await http.put(url, json={"seed": 3, "top_p": 0.9})
        assert response.status_code == 200, response.text
        assert response.json() == {
            "rollout_id": "not-yet-called",
            "sampling": {"seed": 3, "temperature": None, "top_p": 0.9},
        }
        assert settings.get("not-yet-called") == art.RolloutSampling(seed=3, top_p=0.9)
        # All null removes them.
        response = await http.put(url, json={})
        assert response.json()["sampling"] is None and settings.get("not-yet-called") is None
    sampling = art.RolloutSampling(seed=4)
    async with art.capture(tiny_model, sampling=sampling) as run:
        assert run.sampling == sampling
        assert settings.get(run.rollout_id) == sampling
    assert settings.get(run.rollout_id) is None  # released with the rollout's calls


BAD = [
    pytest.param({"temperature": 3}, "temperature", id="temperature-over-2"),
    pytest.param({"temperature": -0.1}, "temperature", id="temperature-negative"),
    pytest.param({"temperature": "hot"}, "temperature", id="temperature-a-string"),
    pytest.param({"top_p": 0}, "top_p", id="top-p-zero"),
    pytest.param({"top_p": 1.5}, "top_p", id="top-p-over-1"),
    pytest.param({"seed": 2**64}, "seed", id="seed-over-64-bits"),
    pytest.param({"seed": 1.5}, "seed", id="seed-a-float"),
    pytest.param({"seed": True}, "seed", id="seed-a-boolean"),
    pytest.param({"temprature": 1.0}, "temprature", id="unknown-field"),
    pytest.param(b"{not json", "JSON", id="not-json"),
    pytest.param(b"[1, 2]", "JSON object", id="not-an-object"),
]


@pytest.mark.parametrize(("body", "needle"), BAD)
async def test_bad_bodies_are_refused_clearly(
    backend: art.LocalBackend, tiny_model: art.TrainableModel, body: Any, needle: str
) -> None:
    url = f"{root(tiny_model)}/rollouts/bad-body/sampling"
    async with httpx.AsyncClient(timeout=30) as http:
        if isinstance(body, bytes):
            response = await http.put(
                url, content=body, headers={"content-type": "application/json"}
            )
        else:
            response = await http.put(url, json=body)
    assert response.status_code == 400, response.text
    assert needle in response.json()["error"]["message"]
    assert backend.gateway.rollout_sampling.get("bad-body") is None


async def test_bad_rollout_ids_and_settings_are_refused(tiny_model: art.TrainableModel) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.put(f"{root(tiny_model)}/rollouts/{'x' * 300}/sampling", json={})
    assert response.status_code == 400 and "rollout ids" in response.json()["error"]["message"]
    with pytest.raises(ValueError, match="temperature"):
        art.RolloutSampling(temperature=2.5)
    with pytest.raises(TypeError, match="RolloutSampling"):
        async with art.capture(tiny_model, sampling={"seed": 1}):  # type: ignore[arg-type]
            pass


async def test_the_settings_held_are_bounded(
    backend: art.LocalBackend, tiny_model: art.TrainableModel
) -> None:
    settings = backend.gateway.rollout_sampling
    capacity = settings.capacity
    settings.capacity = 2
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            for i in range(3):
                url = f"{root(tiny_model)}/rollouts/bounded-{i}/sampling"
                response = await http.put(url, json={"seed": i})
                assert response.status_code == 200, response.text
        assert settings.get("bounded-0") is None  # the oldest went
        assert settings.get("bounded-1") == art.RolloutSampling(seed=1)
        assert settings.get("bounded-2") == art.RolloutSampling(seed=2)
        assert len(settings) <= 2
    finally:
        settings.capacity = capacity
        settings.discard("bounded-1")
        settings.discard("bounded-2")


def test_the_store_keeps_the_most_recently_used() -> None:
    store = RolloutSamplingStore(capacity=2)
    for name in ("a", "b"):
        store.set(name, art.RolloutSampling(seed=1))
    assert store.get("a") is not None  # "a" is still calling: "b" is now the oldest
    store.set("c", art.RolloutSampling(seed=1))
    assert (store.get("a") is not None, store.get("b"), len(store)) == (True, None, 2)
    with pytest.raises(ValueError, match="capacity"):
        RolloutSamplingStore(capacity=0)


def test_call_seeds_are_deterministic_and_distinct() -> None:
    sampling = art.RolloutSampling(seed=-(2**63))
    seeds = [sampling.call_seed(i) for i in range(1000)]
    assert len(set(seeds)) == 1000 and all(0 <= s < 2**62 for s in seeds)
    assert seeds == [art.RolloutSampling(seed=-(2**63)).call_seed(i) for i in range(1000)]
    assert art.RolloutSampling().call_seed(0) is None


@pytest.mark.slow
async def test_a_remote_gateway_applies_the_settings_behind_its_token(tmp_path: Path) -> None:
    """``art-core serve`` in its own process: ``capture`` sets the settings (and a call
    bound) over HTTP with the model's token (the same code path as a local gateway); without
    it, 401."""
    server = ServerProcess(tmp_path / "art").start()
    backend = server.backend()
    try:
        model = art.TrainableModel(name="m", project="remote", base_model="tiny-random")
        await model.register(backend)
        runs = []
        for _ in range(2):
            sampling = art.RolloutSampling(seed=11)
            # The call bound goes the same way (tests/test_rollout_limits.py, locally).
            async with art.capture(model, sampling=sampling, max_calls=1) as run:
                client = run.openai_client(max_retries=0)
                for answered in (True, False):
                    try:
                        await client.chat.completions.create(
                            model=run.model_name, messages=MESSAGES, max_tokens=TOKENS
                        )
                    except openai.PermissionDeniedError:
                        assert not answered
                    else:
                        assert answered
                assert await run.calls_refused() == 1
            runs.append(run)
        assert [len(r.calls) for r in runs] == [1, 1]
        first, again = (r.calls[0] for r in runs)
        assert first.completion_token_ids == again.completion_token_ids
        assert first.request_params["rollout_sampling"]["rollout_seed"] == 11
        async with httpx.AsyncClient(timeout=30) as http:
            response = await http.put(f"{server.url}/rollouts/r/sampling", json={"seed": 1})
        assert response.status_code == 401
    finally:
        await backend.close()
        assert server.stop() == 0, server.describe()
