"""OpenAI protocol details, checked with the real openai client: a forced tool call cut by
``max_tokens``, incremental streaming with tools and stop strings, ``models.retrieve``."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import httpx
import openai
import pytest

import art_core as art
from art_core.gateway.pacing import StreamPacing

NOTE_TOOL = {
    "type": "function",
    "function": {
        "name": "write_note",
        "description": "Write a note",
        "parameters": {
            "type": "object",
            "properties": {"text": {"type": "string", "minLength": 20, "maxLength": 40}},
            "required": ["text"],
            "additionalProperties": False,
        },
    },
}
FORCED = {"tools": [NOTE_TOOL], "tool_choice": "required", "parallel_tool_calls": False}
USER = [{"role": "user", "content": "note something"}]


async def _stream(client: openai.AsyncOpenAI, **kwargs: Any) -> tuple[list[Any], list[str]]:
    chunks = [c async for c in await client.chat.completions.create(stream=True, **kwargs)]
    contents = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    return chunks, contents


async def test_a_forced_tool_call_cut_by_max_tokens_is_a_partial_tool_call(
    tiny_model: art.TrainableModel,
) -> None:
    client = tiny_model.openai_client()
    full = await client.chat.completions.create(
        model="tiny",
        messages=USER,
        max_tokens=200,
        seed=7,
        **FORCED,  # type: ignore[arg-type]
    )
    [whole] = full.choices[0].message.tool_calls or []
    ids: list[int] = full.choices[0].model_extra["token_ids"]  # type: ignore[index]
    tokenizer = tiny_model.backend().served(tiny_model).tokenizer  # type: ignore[attr-defined]
    # The shortest cut after which the arguments have begun but are not finished.
    cut = next(
        k
        for k in range(1, len(ids))
        if '"text": "' in tokenizer.decode(ids[:k], skip_special_tokens=True)
    )
    cut += 2
    assert cut < len(ids) - 3, tokenizer.decode(ids)

    short = await client.chat.completions.create(
        model="tiny",
        messages=USER,
        max_tokens=cut,
        seed=7,
        **FORCED,  # type: ignore[arg-type]
    )
    choice = short.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.content is None  # no <tool_call> markup leaks into the content
    [partial] = choice.message.tool_calls or []
    assert partial.function.name == "write_note"
    assert partial.function.arguments.startswith('{"text": "')
    assert whole.function.arguments.startswith(partial.function.arguments)
    with pytest.raises(json.JSONDecodeError):
        json.loads(partial.function.arguments)

    chunks, contents = await _stream(
        client, model="tiny", messages=USER, max_tokens=cut, seed=7, **FORCED
    )
    assert not any("<tool_call>" in text for text in contents) and not contents
    last = next(c for c in reversed(chunks) if c.choices and c.choices[0].finish_reason)
    assert last.choices[0].finish_reason == "length"
    [streamed] = last.choices[0].delta.tool_calls or []
    assert streamed.function.arguments == partial.function.arguments


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param({"stop": ["zqzqzq"]}, id="stop-string"),
        pytest.param({"tools": [NOTE_TOOL], "tool_choice": "auto"}, id="tools-auto"),
    ],
)
async def test_streaming_is_incremental_with_stop_strings_and_tools(
    backend: art.LocalBackend, tiny_model: art.TrainableModel, extra: dict[str, Any]
) -> None:
    client = tiny_model.openai_client()
    request = {"model": "tiny", "messages": USER, "max_tokens": 24, "seed": 3, **extra}
    plain = await client.chat.completions.create(**request)
    gateway = backend.gateway
    pacing = gateway.stream_pacing
    gateway.stream_pacing = StreamPacing(0, math.inf)  # every batch of tokens as it comes
    try:
        _, contents = await _stream(client, **request)
    finally:
        gateway.stream_pacing = pacing
    # Text arrives as it is sampled (several chunks), and adds up to the full answer.
    assert len(contents) >= 3, contents
    assert "".join(contents) == (plain.choices[0].message.content or "")


async def test_a_stream_writes_its_first_text_at_once_and_the_rest_after_its_interval(
    backend: art.LocalBackend, tiny_model: art.TrainableModel
) -> None:
    """With an interval longer than the answer takes, a stream writes twice: its first
    text as soon as it is sampled, then everything else once the call is recorded (the end
    does not wait out the interval); the text still adds up to the answer."""
    client = tiny_model.openai_client()
    request = {"model": "tiny", "messages": USER, "max_tokens": 48, "seed": 5}
    plain = await client.chat.completions.create(**request)
    gateway = backend.gateway
    pacing = gateway.stream_pacing
    gateway.stream_pacing = StreamPacing(interval_s=3600)
    try:
        chunks, contents = await asyncio.wait_for(_stream(client, **request), 60)
    finally:
        gateway.stream_pacing = pacing
    assert len(contents) == 2, contents
    assert "".join(contents) == plain.choices[0].message.content
    last = next(c for c in reversed(chunks) if c.choices and c.choices[0].finish_reason)
    assert last.choices[0].finish_reason == plain.choices[0].finish_reason


async def test_models_retrieve(tiny_model: art.TrainableModel) -> None:
    client = tiny_model.openai_client()
    model = await client.models.retrieve("tiny")
    assert model.id == "tiny" and model.object == "model"
    assert (await client.models.retrieve("tiny@0")).id == "tiny@0"
    with pytest.raises(openai.NotFoundError):
        await client.models.retrieve("no-such-model")


async def test_a_client_that_hangs_up_mid_stream_leaves_its_call_recorded(
    backend: art.LocalBackend, tiny_model: art.TrainableModel
) -> None:
    """Reading one event and hanging up: the sampling goes on, the call is recorded whole,
    and the stream no longer counts as open for the gateway's write budget."""
    served = backend.served(tiny_model)
    rollout = "hangs-up-mid-stream"
    body = {"model": "tiny", "messages": USER, "max_tokens": 200, "seed": 9, "stream": True}
    url = f"{backend.server.base_url}/rollouts/{rollout}/v1/chat/completions"
    async with httpx.AsyncClient(timeout=60) as client, client.stream("POST", url, json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                break  # hang up after the first event
    for _ in range(600):  # the sampling goes on without a reader: wait for its record
        if served.store.calls_for(rollout):
            break
        await asyncio.sleep(0.05)
    [call] = served.store.calls_for(rollout)
    assert call.finish_reason in ("stop", "length") and call.completion_token_ids
    for _ in range(600):  # the stream's generator is closed once the server sees the hang-up
        if backend.gateway.stream_pacing.open == 0:
            break
        await asyncio.sleep(0.05)
    assert backend.gateway.stream_pacing.open == 0
