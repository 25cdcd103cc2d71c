"""Bad input gets a 4xx naming the problem; the gateway keeps serving and loses nothing."""

from __future__ import annotations

import httpx
import pytest
from rollout_checks import WEATHER_TOOL

import art_core as art

GOOD = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
BAD_TOOL = {
    "type": "function",
    "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": 12}}}},
}

CASES = [
    pytest.param(b"{not json", 400, "not valid JSON", id="malformed-json"),
    pytest.param(b"[1, 2]", 400, "JSON object", id="not-an-object"),
    pytest.param({**GOOD, "messages": "hello"}, 400, "messages", id="messages-wrong-type"),
    pytest.param({**GOOD, "messages": []}, 400, "messages", id="messages-empty"),
    pytest.param({**GOOD, "temperature": "hot"}, 400, "temperature", id="temperature-wrong-type"),
    pytest.param({**GOOD, "temperature": 7}, 400, "temperature", id="temperature-out-of-range"),
    pytest.param({**GOOD, "model": "nope"}, 404, "does not exist", id="unknown-model"),
    pytest.param({**GOOD, "model": "tiny@99"}, 404, "step", id="unknown-adapter-step"),
    pytest.param(
        {**GOOD, "tools": [BAD_TOOL]}, 400, "invalid JSON Schema", id="invalid-tool-schema"
    ),
    pytest.param(
        {**GOOD, "tools": [{"type": "function", "function": {"name": "bad name!"}}]},
        400,
        "tool names",
        id="invalid-tool-name",
    ),
    pytest.param(
        {
            **GOOD,
            "tool_choice": {"type": "function", "function": {"name": "other"}},
            "tools": [WEATHER_TOOL],
        },
        400,
        "not in `tools`",
        id="tool-choice-unknown",
    ),
    pytest.param(
        {**GOOD, "tool_choice": "required"}, 400, "needs `tools`", id="required-without-tools"
    ),
    pytest.param({**GOOD, "max_tokens": 0}, 400, "max_tokens", id="max-tokens-zero"),
    # A max_tokens over the context is lowered to fit, not refused: test_chat_completions_fit.
    pytest.param(
        {**GOOD, "messages": [{"role": "user", "content": "word " * 5000}]},
        400,
        "context",
        id="prompt-too-long",
    ),
    pytest.param(
        {**GOOD, "messages": [{"role": "wizard", "content": "hi"}]}, 400, "role", id="unknown-role"
    ),
    pytest.param({**GOOD, "n": 1000}, 400, "n", id="n-too-large"),
    pytest.param(
        {**GOOD, "response_format": {"type": "json_schema"}},
        400,
        "json_schema",
        id="json-schema-missing",
    ),
]


@pytest.mark.parametrize(("body", "status", "needle"), CASES)
async def test_bad_input_is_rejected_clearly(
    backend: art.LocalBackend,
    tiny_model: art.TrainableModel,
    body: object,
    status: int,
    needle: str,
) -> None:
    store = backend.store(tiny_model)
    async with art.capture(tiny_model) as run:
        client = run.openai_client()
        await client.chat.completions.create(**GOOD)  # a call recorded before the bad one
        before = store.count()
        async with httpx.AsyncClient(timeout=60) as http:
            url = f"{run.base_url}/chat/completions"
            if isinstance(body, bytes):
                response = await http.post(
                    url, content=body, headers={"content-type": "application/json"}
                )
            else:
                response = await http.post(url, json=body)
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert needle in error["message"]
        assert error["type"] in ("invalid_request_error", "not_found_error")
        # the server still answers, and nothing recorded was lost
        after = await client.chat.completions.create(**GOOD)
        assert after.choices[0].finish_reason in ("stop", "length")
    assert store.count() == before + 1
    assert len(run.trajectory().calls) == 2
    assert [c.id for c in store.load_rollout(run.rollout_id)] == [
        c.id for c in run.trajectory().calls
    ]


async def test_bad_rollout_id_is_rejected(tiny_model: art.TrainableModel) -> None:
    root = tiny_model.inference_base_url.removesuffix("/v1")
    async with httpx.AsyncClient() as http:
        response = await http.post(f"{root}/rollouts/{'x' * 300}/v1/chat/completions", json=GOOD)
    assert response.status_code == 400 and "rollout ids" in response.json()["error"]["message"]


async def test_errors_keep_the_connection_alive(tiny_model: art.TrainableModel) -> None:
    """A 4xx answer must not close the client's keep-alive connection (no reset under load)."""
    url = f"{tiny_model.inference_base_url}/chat/completions"
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        for _ in range(5):
            bad = await http.post(url, json={**GOOD, "model": "nope"})
            good = await http.post(url, json=GOOD)
            assert (bad.status_code, good.status_code) == (404, 200)
            assert bad.headers.get("connection", "keep-alive").lower() != "close"
