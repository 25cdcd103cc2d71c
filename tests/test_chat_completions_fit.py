"""Chat Completions fits a token limit the context cannot hold, as the Messages and Responses
APIs do: agents send the limit of their usual hosted model (opencode and Claude Code ask for
32000) to a model with a small context, and a refusal would stop them on every call. A prompt
that fills the context alone is still refused with a 400."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

import art_core as art

# A schema of one short answer: the constrained call ends in a few tokens, whatever its limit.
CITY = {
    "type": "json_schema",
    "json_schema": {
        "name": "city",
        "schema": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Lima"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def _context(model: art.TrainableModel) -> int:
    backend: Any = model.backend()  # a LocalBackend: its engine knows the context
    return int(backend.engine(model).context_length)


@pytest.mark.parametrize(
    ("field", "stream"), [("max_tokens", False), ("max_completion_tokens", True)]
)
async def test_a_token_limit_over_the_context_is_lowered_to_fit(
    tiny_model: art.TrainableModel, field: str, stream: bool
) -> None:
    async with art.capture(tiny_model) as run:
        body = {
            "model": run.model_name,
            "messages": [{"role": "user", "content": "Which city?"}],
            "response_format": CITY,
            "stream": stream,
            field: 32000,
        }
        async with httpx.AsyncClient(timeout=60) as http:
            answer = await http.post(f"{run.base_url}/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
    if not stream:
        content = answer.json()["choices"][0]["message"]["content"]
        assert json.loads(content)["city"] in ("Paris", "Lima")
    (call,) = run.calls
    params = call.request_params
    assert params[field] == 32000  # what the agent asked for, as it asked
    assert params["max_tokens_fitted"] == _context(tiny_model) - call.num_prompt_tokens


async def test_a_prompt_that_fills_the_context_alone_is_refused(
    tiny_model: art.TrainableModel,
) -> None:
    context = _context(tiny_model)
    async with art.capture(tiny_model) as run:
        body = {
            "model": run.model_name,
            # More tokens than the context, too few characters to be refused by length alone:
            # refused by its token count, whatever the token limit.
            "messages": [{"role": "user", "content": "x " * context}],
            "max_tokens": 5,
        }
        async with httpx.AsyncClient(timeout=60) as http:
            answer = await http.post(f"{run.base_url}/chat/completions", json=body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert f"the model's context is {context}" in error["message"]
    assert run.calls == []
