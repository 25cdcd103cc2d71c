"""``model.openai_client()`` is one client per endpoint and event loop, as OpenPipe ART's.

ART code asks for the client in every rollout (``await model.openai_client().chat...``). A
new client per call left a connection pool behind each one, its keep-alive socket to the
gateway open until garbage collection (CI printed them as unclosed-socket warnings).
"""

from __future__ import annotations

import asyncio
import copy
import pickle
import threading
from pathlib import Path
from urllib.parse import urlsplit

import psutil

import art_core as art
from art_core.testing.pytest_plugin import register_tiny_model

MESSAGES = [{"role": "user", "content": "hi"}]


def sockets_to(port: int) -> int:
    """This process's open TCP connections whose far end is ``port`` (the gateway runs in
    this process too: its own ends have ``port`` as their local port, not counted)."""
    return sum(
        1
        for c in psutil.Process().net_connections(kind="tcp")
        if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
    )


async def test_art_style_rollouts_share_one_client_and_its_connection(
    tiny_model: art.TrainableModel,
) -> None:
    assert tiny_model.inference_base_url is not None
    port = urlsplit(tiny_model.inference_base_url).port
    assert port is not None
    before = sockets_to(port)
    for _ in range(8):  # ART's shape: the client asked for anew in each rollout
        completion = await tiny_model.openai_client().chat.completions.create(
            model=tiny_model.name,
            messages=MESSAGES,  # type: ignore[arg-type]
            max_completion_tokens=2,
        )
        assert completion.choices
    # One keep-alive connection for the eight calls (one per call before: eight).
    assert sockets_to(port) - before <= 1
    assert tiny_model.openai_client() is tiny_model.openai_client()


async def test_a_closed_client_is_replaced_and_arguments_make_a_client_of_the_callers(
    tiny_model: art.TrainableModel,
) -> None:
    async with tiny_model.openai_client() as client:  # closes it on exit
        await client.models.list()
    fresh = tiny_model.openai_client()
    assert fresh is not client and not fresh.is_closed()
    assert (await fresh.models.list()).data
    # Constructor arguments: a new client each time, never the shared one.
    own = tiny_model.openai_client(max_retries=0)
    assert own is not fresh and own is not tiny_model.openai_client(max_retries=0)
    assert own.max_retries == 0
    await own.close()
    assert not tiny_model.openai_client().is_closed()


async def test_another_event_loop_or_endpoint_gets_its_own_client() -> None:
    model = art.Model(name="judge", inference_base_url="http://127.0.0.1:9/v1")
    here = model.openai_client()
    assert model.openai_client() is here
    made_elsewhere: list[object] = []
    # A second asyncio.run (here in a thread): an httpx pool's connections belong to the
    # loop that opened them, so that loop gets a client of its own.

    async def ask() -> None:
        made_elsewhere.append(model.openai_client())

    thread = threading.Thread(target=asyncio.run, args=(ask(),))
    thread.start()
    thread.join()
    assert made_elsewhere and made_elsewhere[0] is not here
    assert model.openai_client() is not here  # the last one made is the one kept
    # Outside any loop: another client again.
    outside: list[object] = []
    thread = threading.Thread(target=lambda: outside.append(model.openai_client()))
    thread.start()
    thread.join()
    assert outside[0] is not model.openai_client()
    # Registered elsewhere (another endpoint or key): a client for it.
    kept = model.openai_client()
    model.inference_base_url = "http://127.0.0.1:10/v1"
    moved = model.openai_client()
    assert moved is not kept and str(moved.base_url) == "http://127.0.0.1:10/v1/"
    model.inference_api_key = "another"
    assert model.openai_client() is not moved and model.openai_client().api_key == "another"


def test_models_that_differ_only_in_their_clients_are_equal() -> None:
    first, second = (
        art.Model(name="judge", inference_base_url="http://127.0.0.1:9/v1") for _ in "ab"
    )
    first.openai_client()
    assert first == second and first.openai_client() is not second.openai_client()
    assert first != art.Model(name="judge", inference_base_url="http://127.0.0.1:10/v1")


async def test_copies_and_pickles_of_a_model_start_without_its_client() -> None:
    model = art.TrainableModel(
        name="copied",
        project="tests",
        base_model="tiny-random",
        inference_base_url="http://127.0.0.1:9/v1",
    )
    client = model.openai_client()
    for other in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert other == model
        theirs = other.openai_client()
        assert theirs is not client and other.openai_client() is theirs
    assert model.openai_client() is client


async def test_the_backend_closes_its_models_shared_clients(tmp_path: Path) -> None:
    async with art.LocalBackend(path=tmp_path) as local:
        model = await register_tiny_model(local, "closing")
        client = model.openai_client()
        assert (await client.models.list()).data  # a connection opened
    assert client.is_closed()
