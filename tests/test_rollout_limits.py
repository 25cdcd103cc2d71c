"""A bound on a rollout's calls: ``art.capture(model, max_calls=N)``.

The gateway answers the rollout's first N calls, in any wire API, and refuses every later
one with a 403 (``rollout_limit_error``) before anything is sampled or recorded; the refusals
are counted (``run.calls_refused()``, ``GET /rollouts/{id}/limits``). Set over HTTP
(``PUT /rollouts/{id}/limits``), bounded, dropped when the rollout is released. The remote
path (``art-core serve``) is checked in ``test_rollout_sampling``'s remote test.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pydantic
import pytest

os.environ.setdefault(
    "ART_CORE_MODELS_DIR", str(Path(tempfile.gettempdir()) / "art-core-test-models")
)

import art_core as art
from art_core.gateway.errors import APIError
from art_core.gateway.rollout_limits import RolloutLimits, RolloutLimitsStore

MODEL = "tiny"
MESSAGES = [{"role": "user", "content": "Tell me a story about a fox."}]
TOKENS = 4


def root(model: art.TrainableModel) -> str:
    assert model.inference_base_url is not None
    return model.inference_base_url.removesuffix("/").removesuffix("/v1")


async def test_calls_past_the_bound_are_refused_in_every_api_and_never_recorded(
    backend: art.LocalBackend, tiny_model: art.TrainableModel
) -> None:
    limits = backend.gateway.rollout_limits
    async with art.capture(tiny_model, max_calls=2) as run:
        client = run.openai_client(max_retries=0)
        await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=TOKENS)
        await run.anthropic_client(max_retries=0).messages.create(
            model=MODEL, messages=MESSAGES, max_tokens=TOKENS
        )
        assert await run.calls_refused() == 0
        # Every later call, in each wire API, is refused: the agent learns its run is over.
        with pytest.raises(openai.PermissionDeniedError, match="max_calls") as chat:
            await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=TOKENS)
        assert chat.value.body["type"] == "rollout_limit_error"  # type: ignore[index]
        with pytest.raises(openai.PermissionDeniedError, match="max_calls"):
            await client.responses.create(model=MODEL, input="Hi", max_output_tokens=TOKENS)
        with pytest.raises(openai.PermissionDeniedError, match="max_calls"):
            await client.completions.create(model=MODEL, prompt="Once", max_tokens=TOKENS)
        with pytest.raises(anthropic.PermissionDeniedError, match="max_calls"):
            await run.anthropic_client(max_retries=0).messages.create(
                model=MODEL, messages=MESSAGES, max_tokens=TOKENS
            )
        assert await run.calls_refused() == 4
        assert limits.state(run.rollout_id) == {
            "max_calls": 2,
            "calls_admitted": 2,
            "calls_refused": 4,
        }
    # Only the answered calls were recorded, at the indices they were issued with.
    assert [c.api for c in run.calls] == ["chat.completions", "messages"]
    assert [c.index for c in run.calls] == [0, 1]
    assert limits.state(run.rollout_id)["max_calls"] is None  # released with the rollout


async def test_a_bad_request_counts_nothing_and_a_batch_is_admitted_whole(
    tiny_model: art.TrainableModel,
) -> None:
    async with art.capture(tiny_model, max_calls=2) as run:
        client = run.openai_client(max_retries=0)
        with pytest.raises(openai.NotFoundError):  # refused for itself, before the bound
            await client.chat.completions.create(
                model="no-such-model", messages=MESSAGES, max_tokens=TOKENS
            )
        # Three prompts are three calls: past the bound of 2, the request is refused whole.
        with pytest.raises(openai.PermissionDeniedError, match="max_calls"):
            await client.completions.create(model=MODEL, prompt=["a", "b", "c"], max_tokens=TOKENS)
        await client.completions.create(model=MODEL, prompt=["a", "b"], max_tokens=TOKENS)
        assert await run.calls_refused() == 3
    assert [c.api for c in run.calls] == ["completions", "completions"]


async def test_limits_are_set_and_read_over_http_before_any_call(
    backend: art.LocalBackend, tiny_model: art.TrainableModel
) -> None:
    url = f"{root(tiny_model)}/rollouts/not-yet-called/limits"
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.put(url, json={"max_calls": 3})
        assert response.status_code == 200, response.text
        state = {"max_calls": 3, "calls_admitted": 0, "calls_refused": 0}
        assert response.json() == {"rollout_id": "not-yet-called", **state}
        assert (await http.get(url)).json() == {"rollout_id": "not-yet-called", **state}
        # Null removes the bound.
        response = await http.put(url, json={"max_calls": None})
        assert response.json()["max_calls"] is None
    assert backend.gateway.rollout_limits.state("not-yet-called")["max_calls"] is None


BAD = [
    pytest.param({"max_calls": 0}, "max_calls", id="zero"),
    pytest.param({"max_calls": -1}, "max_calls", id="negative"),
    pytest.param({"max_calls": 2**40}, "max_calls", id="too-large"),
    pytest.param({"max_calls": "2"}, "max_calls", id="a-string"),
    pytest.param({"max_calls": True}, "max_calls", id="a-boolean"),
    pytest.param({"max_calls": 1.5}, "max_calls", id="a-float"),
    pytest.param({"max_call": 1}, "max_call", id="unknown-field"),
    pytest.param(b"{not json", "JSON", id="not-json"),
]


@pytest.mark.parametrize(("body", "needle"), BAD)
async def test_bad_bodies_are_refused_clearly(
    backend: art.LocalBackend, tiny_model: art.TrainableModel, body: Any, needle: str
) -> None:
    url = f"{root(tiny_model)}/rollouts/bad-limits/limits"
    async with httpx.AsyncClient(timeout=30) as http:
        if isinstance(body, bytes):
            response = await http.put(
                url, content=body, headers={"content-type": "application/json"}
            )
        else:
            response = await http.put(url, json=body)
    assert response.status_code == 400, response.text
    assert needle in response.json()["error"]["message"]
    assert backend.gateway.rollout_limits.state("bad-limits")["max_calls"] is None


async def test_capture_refuses_a_bound_below_one(tiny_model: art.TrainableModel) -> None:
    with pytest.raises(pydantic.ValidationError, match="max_calls"):
        async with art.capture(tiny_model, max_calls=0):
            pass


def test_the_store_is_bounded_and_keeps_the_most_recently_used() -> None:
    store = RolloutLimitsStore(capacity=2)
    for name in ("a", "b"):
        store.set(name, RolloutLimits(max_calls=1))
    store.admit("a")  # "a" is still calling: "b" is now the oldest
    store.set("c", RolloutLimits(max_calls=1))
    assert len(store) == 2 and store.state("b")["max_calls"] is None
    # A bound raised keeps what the rollout already admitted.
    store.set("a", RolloutLimits(max_calls=2))
    store.admit("a")
    with pytest.raises(APIError) as refused:
        store.admit("a")
    assert refused.value.status == 403
    assert store.state("a") == {"max_calls": 2, "calls_admitted": 2, "calls_refused": 1}
    store.admit(None)  # a call outside any rollout: never bounded
    store.admit("unbounded")
    with pytest.raises(ValueError, match="capacity"):
        RolloutLimitsStore(capacity=0)
