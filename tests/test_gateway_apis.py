"""A wire API is one module and one route entry: a toy fifth API, added the way the four
are (``ROUTES`` of ``APIRoute``s on the shared core), serves, records, streams and refuses
like them, on a real gateway over loopback.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import Response

import art_core as art
from art_core.gateway.answering import sample_shielded, stream_answer
from art_core.gateway.app import WIRE_APIS, Gateway
from art_core.gateway.deltas import StreamedText, TextDelta
from art_core.gateway.errors import APIError
from art_core.gateway.reading import Translated, prepare_translated, read_translated
from art_core.gateway.routes import APIRoute
from art_core.gateway.server import GatewayServer
from art_core.gateway.serving import Serving, rollout_id
from art_core.gateway.wire import completion_response, event_stream, sse
from art_core.trajectories import LLMCall

API = "toy.shout"


def translate(payload: dict[str, Any]) -> Translated:
    """``{"model", "text", "stream"}``: one user message, a few tokens."""
    if not isinstance(payload.get("text"), str):
        raise APIError(400, "text must be a string", param="text")
    chat = {
        "model": payload.get("model"),
        "messages": [{"role": "user", "content": payload["text"]}],
        "max_tokens": 6,
        "temperature": 0.0,
    }
    return Translated(chat, {"shouted": True}, {"stream": bool(payload.get("stream"))})


class ShoutEncoder:
    """The toy's events: each delta upper-cased, then the recorded call's id."""

    def opening(self) -> Iterable[str]:
        return [sse({"event": "start"})]

    def delta(self, delta: TextDelta) -> Iterable[str]:
        return [sse({"delta": delta.text.upper()})] if delta.field == "content" else []

    def finished(self, recorded: list[list[LLMCall]], texts: list[StreamedText]) -> Iterable[str]:
        (choices,), (text,) = recorded, texts
        rest = text.rest(choices[0]).get("content", "")
        return [sse({"delta": rest.upper(), "call_id": choices[0].id})]

    def failed(
        self, error: APIError, recorded: list[list[LLMCall]], texts: list[StreamedText]
    ) -> Iterable[str]:
        return [sse({"error": error.message})]


async def shout(serving: Serving, request: Request) -> Response:
    chat, translated = await read_translated(serving, request, translate)
    call = await prepare_translated(
        serving, chat, translated, api=API, rollout_id=rollout_id(request)
    )
    if translated.context["stream"]:
        return event_stream(stream_answer([call], ShoutEncoder()))
    (sampled,) = await sample_shielded([call])
    recorded = sampled.calls[0]
    content = recorded.response_message.get("content") or ""
    return completion_response({"shout": content.upper(), "call_id": recorded.id})


TOY = SimpleNamespace(ROUTES=(APIRoute("/v1/shout", shout),))


@pytest.fixture(scope="module")
async def toy_gateway(backend: art.LocalBackend, tiny_model: art.TrainableModel) -> Any:
    gateway = Gateway(apis=(*WIRE_APIS, TOY))
    gateway.add(backend.gateway.models[tiny_model.name])
    server = GatewayServer(gateway)
    server.start()
    yield gateway, server.base_url
    server.stop()


async def test_a_fifth_api_is_one_module_and_one_route_entry(toy_gateway: Any) -> None:
    gateway, root = toy_gateway
    paths = {getattr(route, "path", "") for route in gateway.routes}
    assert {"/v1/shout", "/rollouts/{rollout_id}/v1/shout", "/v1/chat/completions"} <= paths
    store = gateway.models["tiny"].store
    async with httpx.AsyncClient(base_url=root, timeout=60) as client:
        answer = await client.post(
            "/rollouts/toy-1/v1/shout", json={"model": "tiny", "text": "hello there"}
        )
        assert answer.status_code == 200, answer.text
        body = answer.json()
        (recorded,) = store.calls_for("toy-1")
        assert recorded.id == body["call_id"]
        assert recorded.api == API and recorded.request_params == {"shouted": True}
        assert body["shout"] == (recorded.response_message.get("content") or "").upper()
        assert recorded.messages == [{"role": "user", "content": "hello there"}]

        # Streamed through the shared loop: the deltas add up to the recorded answer.
        async with client.stream(
            "POST",
            "/rollouts/toy-2/v1/shout",
            json={"model": "tiny", "text": "hello there", "stream": True},
        ) as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            events = [
                json.loads(line.removeprefix("data: "))
                async for line in stream.aiter_lines()
                if line.startswith("data: ")
            ]
        assert events[0] == {"event": "start"}
        (streamed,) = store.calls_for("toy-2")
        assert events[-1]["call_id"] == streamed.id
        shouted = "".join(event.get("delta", "") for event in events)
        assert shouted == (streamed.response_message.get("content") or "").upper()

        # Refused like the others: the API's own 400, the core's 404, nothing recorded.
        bad = await client.post("/rollouts/toy-3/v1/shout", json={"model": "tiny", "text": 7})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "text"
        unknown = await client.post("/rollouts/toy-3/v1/shout", json={"model": "nope", "text": "a"})
        assert unknown.status_code == 404
        assert unknown.json()["error"]["code"] == "model_not_found"
        assert store.calls_for("toy-3") == []
        # The four APIs are still served by the same gateway.
        chat = await client.post(
            "/v1/chat/completions",
            json={
                "model": "tiny",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 2,
            },
        )
        assert chat.status_code == 200, chat.text
