"""Stored responses (``previous_response_id``) are scoped to the rollout and caller token
that stored them (issue 48).

The store is gateway-wide; a ``previous_response_id`` kept for another rollout, for the plain
``/v1`` route, or for another token must be answered exactly as an unknown id (same status,
same error body but for the id) and record nothing, while a rollout still continues its own.
Driven over loopback against the session's gateway (no token is enforced there, so the
token a client sends is only a scope; ``art-core serve`` accepts one token, so two callers of
one server cannot present different ones).
"""

from __future__ import annotations

from typing import Any

import httpx
import openai
from openai.types.responses import ResponseCompletedEvent, ResponseIncompleteEvent

import art_core as art
from art_core.gateway.apis.responses import ResponseStore
from art_core.trajectories import new_id


async def _store(http: httpx.AsyncClient, base_url: str, model: str, **headers: str) -> str:
    """A stored response's id (a one-token answer)."""
    answer = await http.post(
        f"{base_url}/responses",
        json={"model": model, "input": "hi", "max_output_tokens": 1},
        headers=headers,
    )
    assert answer.status_code == 200, answer.text
    return str(answer.json()["id"])


async def _continue(
    http: httpx.AsyncClient, base_url: str, model: str, previous: str, **headers: str
) -> httpx.Response:
    return await http.post(
        f"{base_url}/responses",
        json={
            "model": model,
            "previous_response_id": previous,
            "input": "more",
            "max_output_tokens": 1,
        },
        headers=headers,
    )


def _as_unknown(
    answer: httpx.Response, previous: str, unknown: httpx.Response, made_up: str
) -> None:
    """``answer`` (for ``previous``) is the answer to a made-up id, but for the id itself."""
    assert answer.status_code == unknown.status_code == 400, (answer.text, unknown.text)
    assert answer.headers["content-type"] == unknown.headers["content-type"]
    body: dict[str, Any] = answer.json()
    error, unknown_error = body["error"], unknown.json()["error"]
    assert error["type"] == unknown_error["type"] == "invalid_request_error"
    assert error["param"] == unknown_error["param"] == "previous_response_id"
    assert previous in error["message"]
    assert error["message"].replace(previous, "ID") == unknown_error["message"].replace(
        made_up, "ID"
    )
    assert answer.text.replace(previous, "ID") == unknown.text.replace(made_up, "ID")


async def test_another_rollouts_response_is_answered_as_unknown(
    tiny_model: art.TrainableModel,
) -> None:
    made_up = new_id("resp")  # the shape of a real id, kept by no one
    async with httpx.AsyncClient() as http:
        async with art.capture(tiny_model) as a:
            stored = await _store(http, a.base_url, a.model_name)
        async with art.capture(tiny_model) as b:
            foreign = await _continue(http, b.base_url, b.model_name, stored)
            unknown = await _continue(http, b.base_url, b.model_name, made_up)
    _as_unknown(foreign, stored, unknown, made_up)
    assert b.calls == []  # B's refused calls recorded nothing
    assert len(a.calls) == 1


async def test_another_rollouts_streamed_response_is_answered_as_unknown(
    tiny_model: art.TrainableModel,
) -> None:
    """A streamed response is kept under its rollout too (the stream's own store path)."""
    made_up = new_id("resp")
    async with art.capture(tiny_model) as a:
        stream = await a.openai_client().responses.create(
            model=a.model_name, input="hi", max_output_tokens=1, stream=True
        )
        events = [event async for event in stream]
        (done,) = [
            e for e in events if isinstance(e, ResponseCompletedEvent | ResponseIncompleteEvent)
        ]
        stored = done.response.id
        async with art.capture(tiny_model) as b, httpx.AsyncClient() as http:
            foreign = await _continue(http, b.base_url, b.model_name, stored)
            unknown = await _continue(http, b.base_url, b.model_name, made_up)
        # A continues its own streamed response.
        second = await a.openai_client().responses.create(
            model=a.model_name, previous_response_id=stored, input="more", max_output_tokens=1
        )
    _as_unknown(foreign, stored, unknown, made_up)
    assert b.calls == []
    assert second.previous_response_id == stored
    first_call, second_call = a.calls
    assert second_call.messages[: len(first_call.messages)] == first_call.messages


async def test_a_rollout_continues_its_own_response(tiny_model: art.TrainableModel) -> None:
    async with art.capture(tiny_model) as run:
        client = run.openai_client()
        first = await client.responses.create(model=run.model_name, input="hi", max_output_tokens=1)
        second = await client.responses.create(
            model=run.model_name, previous_response_id=first.id, input="more", max_output_tokens=1
        )
        third = await client.responses.create(
            model=run.model_name, previous_response_id=second.id, input="end", max_output_tokens=1
        )
    assert third.previous_response_id == second.id
    calls = run.calls
    assert len(calls) == 3
    assert calls[1].messages[:1] == [{"role": "user", "content": "hi"}]
    assert calls[2].messages[-1] == {"role": "user", "content": "end"}
    assert calls[2].messages[: len(calls[1].messages)] == calls[1].messages


async def test_plain_route_and_rollout_routes_do_not_see_each_other(
    tiny_model: art.TrainableModel,
) -> None:
    assert tiny_model.inference_base_url is not None
    plain = tiny_model.inference_base_url.removesuffix("/")
    name = tiny_model.get_inference_name(None)
    made_up = new_id("resp")
    async with httpx.AsyncClient() as http:
        on_plain = await _store(http, plain, name)
        async with art.capture(tiny_model) as run:
            in_rollout = await _store(http, run.base_url, run.model_name)
            # The plain route's response, from a rollout: as unknown, nothing recorded.
            from_rollout = await _continue(http, run.base_url, run.model_name, on_plain)
            unknown_in_rollout = await _continue(http, run.base_url, run.model_name, made_up)
        # A rollout's response, from the plain route: as unknown.
        from_plain = await _continue(http, plain, name, in_rollout)
        unknown_on_plain = await _continue(http, plain, name, made_up)
        # Each route still continues its own.
        own_plain = await _continue(http, plain, name, on_plain)
    _as_unknown(from_rollout, on_plain, unknown_in_rollout, made_up)
    _as_unknown(from_plain, in_rollout, unknown_on_plain, made_up)
    assert own_plain.status_code == 200, own_plain.text
    assert len(run.calls) == 1  # only the stored call; the refused one recorded nothing


async def test_a_token_does_not_see_another_tokens_responses(
    tiny_model: art.TrainableModel,
) -> None:
    """The caller's token (``Authorization: Bearer`` or ``x-api-key``) is part of the scope,
    on a rollout route and on the plain one."""
    assert tiny_model.inference_base_url is not None
    plain = tiny_model.inference_base_url.removesuffix("/")
    name = tiny_model.get_inference_name(None)
    made_up = new_id("resp")
    alice = {"authorization": "Bearer alice"}
    bob = {"authorization": "Bearer bob"}
    async with httpx.AsyncClient() as http:
        async with art.capture(tiny_model) as run:
            stored = await _store(http, run.base_url, run.model_name, **alice)
            foreign = await _continue(http, run.base_url, run.model_name, stored, **bob)
            unknown = await _continue(http, run.base_url, run.model_name, made_up, **bob)
            tokenless = await _continue(http, run.base_url, run.model_name, stored)
            # The same token as x-api-key (Anthropic's header) is the same caller.
            own = await _continue(
                http, run.base_url, run.model_name, stored, **{"x-api-key": "alice"}
            )
        on_plain = await _store(http, plain, name, **alice)
        foreign_plain = await _continue(http, plain, name, on_plain, **bob)
        unknown_plain = await _continue(http, plain, name, made_up, **bob)
        own_plain = await _continue(http, plain, name, on_plain, **alice)
    _as_unknown(foreign, stored, unknown, made_up)
    assert tokenless.status_code == 400
    assert own.status_code == 200, own.text
    _as_unknown(foreign_plain, on_plain, unknown_plain, made_up)
    assert own_plain.status_code == 200, own_plain.text
    assert len(run.calls) == 2  # the stored call and its continuation by the same token


async def test_openai_sdk_sees_another_rollouts_id_as_unknown(
    tiny_model: art.TrainableModel,
) -> None:
    """What an agent sees: the SDK's BadRequestError, as for an id no one kept."""
    async with art.capture(tiny_model) as a:
        first = await a.openai_client().responses.create(
            model=a.model_name, input="hi", max_output_tokens=1
        )
    async with art.capture(tiny_model) as b:
        client = b.openai_client()
        try:
            await client.responses.create(
                model=b.model_name, previous_response_id=first.id, input="more"
            )
        except openai.BadRequestError as exc:
            assert exc.status_code == 400 and "previous_response_id" in str(exc)
        else:
            raise AssertionError("another rollout's response was continued")
    assert b.calls == []


def test_store_scopes_share_the_bounds() -> None:
    """Scopes are part of the key, not separate stores: the count and byte bounds are the
    gateway's, the oldest forgotten first whatever its scope."""
    store = ResponseStore(max_responses=2)
    one = [{"role": "user", "content": "hi"}]
    store.put(("r1", None), "resp_1", one)
    store.put(("r2", "t"), "resp_2", one)
    assert store.get(("r2", None), "resp_2") is None
    assert store.get((None, "t"), "resp_2") is None
    assert store.get(("r1", None), "resp_1") == one  # touched: now the newest
    store.put((None, None), "resp_3", one)
    assert store.get(("r2", "t"), "resp_2") is None  # the oldest, forgotten
    assert store.get(("r1", None), "resp_1") == one
    assert store.get((None, None), "resp_3") == one
    assert store.get(("r1", None), "resp_3") is None
    size = len(b'[{"role":"user","content":"hi"}]')
    small = ResponseStore(max_bytes=2 * size)
    for i in range(3):
        small.put((f"r{i}", None), f"resp_{i}", one)
    assert small.get(("r0", None), "resp_0") is None
    assert small.get(("r2", None), "resp_2") == one
