"""Acceptance: the server's security against a real ``art-core serve`` process: 401 for a
missing or wrong token (API and gateway routes), 413 for oversize bodies, 422 naming the
field of malformed trajectories, client paths never escaping the art folder, CORS off, a
generated token off loopback, and a property-based fuzz of the HTTP API that finds no 5xx."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

os.environ.setdefault(
    "ART_CORE_MODELS_DIR", str(Path(tempfile.gettempdir()) / "art-core-test-models")
)

from remote_support import ServerProcess

import art_core as art
from art_core.backends.local import LocalBackend
from art_core.backends.remote import RemoteAuthError
from art_core.server.app import build_app
from art_core.server.service import Service
from art_core.server.settings import ServeSettings, is_loopback

MODEL = "/api/models/sec/guarded"
LIMIT_BYTES = 1024 * 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(
        tmp_path_factory.mktemp("remote-security") / "art",
        args=["--max-body-mb", "1", "--default-max-tokens", "8"],
    ).start()
    yield server
    assert server.stop() == 0, server.describe()


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {server.token}"}, timeout=60
    ) as client:
        response = client.post(
            "/api/models/register",
            json={"name": "guarded", "project": "sec", "base_model": "tiny-random"},
        )
        assert response.status_code == 200, response.text
        yield client


def valid_call(**changes: Any) -> dict[str, Any]:
    call = {
        "model": "guarded",
        "messages": [{"role": "user", "content": "hi"}],
        "prompt_token_ids": [1, 2, 3],
        "completion_token_ids": [4, 5],
        "logprobs": [-0.5, -1.0],
    }
    return {**call, **changes}


def train_body(trajectory: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"groups": [{"trajectories": [trajectory, {"reward": 0.0}]}], **extra}


def assert_422(response: httpx.Response, field: str) -> None:
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == field, error
    assert field in error["message"]


# ---------------------------------------------------------------------------------- auth
def test_missing_or_wrong_token_is_401_on_api_and_gateway(
    server: ServerProcess, http: httpx.Client
) -> None:
    for path in ("/api/info", f"{MODEL}/step", "/v1/models", "/rollouts/r1/v1/models", "/health"):
        missing = httpx.get(server.url + path)
        wrong = httpx.get(server.url + path, headers={"Authorization": "Bearer not-the-token"})
        for response in (missing, wrong):
            assert response.status_code == 401, (path, response.text)
            assert response.headers["www-authenticate"].startswith("Bearer")
            assert response.json()["error"]["type"] == "authentication_error"
        assert http.get(path).status_code == 200, path
    # A training request without the token never reaches the trainer.
    response = httpx.post(server.url + f"{MODEL}/train", json=train_body({"reward": 1.0}))
    assert response.status_code == 401


async def test_the_openai_client_needs_the_token_for_rollouts(server: ServerProcess) -> None:
    model = art.TrainableModel(name="guarded", project="sec", base_model="tiny-random")
    backend = server.backend()
    await model.register(backend)
    async with openai.AsyncOpenAI(
        base_url=f"{server.url}/v1", api_key="wrong", max_retries=0
    ) as wrong:
        with pytest.raises(openai.AuthenticationError):
            await wrong.chat.completions.create(
                model="guarded", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
    async with art.capture(model) as run:  # the token is the rollout's API key
        await run.openai_client().chat.completions.create(
            model=run.model_name, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    assert len(run.trajectory().calls) == 1
    async with art.RemoteBackend(server.url, token="wrong") as wrong_backend:
        with pytest.raises(RemoteAuthError):
            await wrong_backend.register(model)
    await backend.close()


async def test_anthropic_clients_send_the_token_as_x_api_key(server: ServerProcess) -> None:
    """The anthropic SDK sends its key as ``x-api-key``: accepted as the token; a wrong one
    is a 401 in Anthropic's error shape (and a body over the limit a 413 in it too)."""
    import anthropic

    model = art.TrainableModel(name="guarded-anthropic", project="sec", base_model="tiny-random")
    backend = server.backend()
    await model.register(backend)
    message = {"role": "user", "content": "hi"}
    async with anthropic.AsyncAnthropic(
        base_url=server.url, api_key="wrong", max_retries=0
    ) as wrong:
        with pytest.raises(anthropic.AuthenticationError) as refused:
            await wrong.messages.create(model=model.name, messages=[message], max_tokens=2)
    assert refused.value.body["type"] == "error"
    assert refused.value.body["error"]["type"] == "authentication_error"
    async with art.capture(model) as run:  # the token is the rollout's API key
        await run.anthropic_client(max_retries=0).messages.create(
            model=run.model_name, messages=[message], max_tokens=2
        )
    assert [c.api for c in run.trajectory().calls] == ["messages"]
    big = json.dumps({"model": model.name, "x": "x" * (LIMIT_BYTES + 10)}).encode()
    async with httpx.AsyncClient() as http:
        response = await http.post(
            f"{server.url}/v1/messages",
            content=big,
            headers={"content-type": "application/json", "x-api-key": server.token},
        )
    assert response.status_code == 413
    assert response.json()["error"]["type"] == "request_too_large"
    await backend.close()


def test_a_token_is_generated_off_loopback_and_enforced(tmp_path: Path) -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.5") and not is_loopback("gpu-box")
    assert ServeSettings(host="127.0.0.1").resolved_token() is None
    settings = ServeSettings(host="0.0.0.0", path=tmp_path)
    # The app built for a public interface requires the generated token (served in-process).
    app = build_app(Service(LocalBackend(path=tmp_path, host="0.0.0.0"), settings))
    assert settings.token_generated and settings.token and len(settings.token) >= 40

    async def probe() -> tuple[int, int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            without = await client.get("/api/info")
            with_token = await client.get(
                "/api/info", headers={"Authorization": f"Bearer {settings.token}"}
            )
        return without.status_code, with_token.status_code

    import asyncio

    assert asyncio.run(probe()) == (401, 200)
    with pytest.raises(ValueError):
        ServeSettings(host="0.0.0.0", token="  ").resolved_token()


def test_cors_is_off_by_default(http: httpx.Client) -> None:
    preflight = http.options(
        "/api/info",
        headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "GET"},
    )
    assert "access-control-allow-origin" not in preflight.headers
    response = http.get("/api/info", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in response.headers


# ---------------------------------------------------------------------------------- sizes
def test_oversize_bodies_are_413_declared_or_chunked(http: httpx.Client) -> None:
    big = json.dumps({"name": "x" * (LIMIT_BYTES + 10)}).encode()
    for path in ("/api/models/register", f"{MODEL}/train", "/v1/chat/completions"):
        response = http.post(path, content=big, headers={"content-type": "application/json"})
        assert response.status_code == 413, (path, response.text)
        assert response.json()["error"]["code"] == "request_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it streams
        for _ in range(20):
            yield b" " * (LIMIT_BYTES // 10)

    response = http.post(f"{MODEL}/log", content=chunks())
    assert response.status_code == 413
    assert http.get("/api/info").status_code == 200  # and the server is fine


# ---------------------------------------------------------------------------------- 422
def test_malformed_trajectories_are_422_naming_the_field(http: httpx.Client) -> None:
    train = f"{MODEL}/train"
    assert_422(
        http.post(train, json=train_body({"reward": "high"})), "groups.0.trajectories.0.reward"
    )
    assert_422(
        http.post(train, json=train_body({"calls": [valid_call(model=None)]})),
        "groups.0.trajectories.0.calls.0.model",
    )
    assert_422(
        http.post(train, json=train_body({"calls": [valid_call(completion_token_ids=[4, 10**9])]})),
        "groups.0.trajectories.0.calls.0.completion_token_ids.1",
    )
    assert_422(
        http.post(train, json=train_body({"calls": [valid_call(prompt_token_ids=[-1])]})),
        "groups.0.trajectories.0.calls.0.prompt_token_ids.0",
    )
    assert_422(
        http.post(train, json=train_body({"calls": [valid_call(logprobs=[-0.5])]})),
        "groups.0.trajectories.0.calls.0.logprobs",
    )
    assert_422(
        http.post(train, json=train_body({"reward": 1.0, "pickle": "gASV"})),
        "groups.0.trajectories.0.pickle",
    )
    assert_422(
        http.post(train, json=train_body({"reward": 1.0}, config={"lora_rank": 0})),
        "config.lora_rank",
    )
    assert_422(http.post(train, json={"groups": []}), "groups")
    assert_422(
        http.post(f"{MODEL}/log", json={"groups": [{"trajectories": 3}]}), "groups.0.trajectories"
    )
    assert_422(http.post(f"{MODEL}/log", json={"groups": [], "split": "../x"}), "split")
    bad_json = http.post(train, content=b"{not json", headers={"content-type": "application/json"})
    assert bad_json.status_code == 400
    # Nothing was trained by any of these.
    assert http.get(f"{MODEL}/step").json() == {"step": 0}


# ---------------------------------------------------------------------------------- paths
def test_paths_from_clients_never_escape_the_art_folder(
    server: ServerProcess, http: httpx.Client
) -> None:
    outside_before = sorted(p.name for p in server.path.parent.iterdir())
    for name in ("../escape", "..", "a/../../b", ".hidden", "x" * 200, "a\\b", "/abs"):
        response = http.post(
            "/api/models/register",
            json={"name": name, "project": "sec", "base_model": "tiny-random"},
        )
        assert_422(response, "name")
        response = http.post(
            "/api/models/register",
            json={"name": "ok", "project": name, "base_model": "tiny-random"},
        )
        assert_422(response, "project")
    for base_model in ("/etc", "../../..", str(server.path.parent), "~"):
        response = http.post(
            "/api/models/register",
            json={"name": "pathy", "project": "sec", "base_model": base_model},
        )
        assert_422(response, "base_model")
    for path in (
        "/api/models/sec/..%2F..%2Fescape/step",
        "/api/models/..%2F..%2F/guarded/step",
        "/api/models/sec/%2e%2e/step",
        "/api/models/sec/guarded/rollouts/..%2F..%2Fx/calls",
    ):
        response = http.get(path)
        assert response.status_code in (404, 422), (path, response.status_code, response.text)
    # A rollout id is a key in the call record, never a path: ".." is just a name there.
    assert http.post("/api/models/sec/guarded/rollouts/%2e%2e/release").json() == {"calls": []}
    assert http.get("/api/models/sec/%2e%2e/step").json()["error"]["param"] == "path.model"
    assert sorted(p.name for p in server.path.parent.iterdir()) == outside_before
    assert not (server.path / "sec" / "models" / "escape").exists()


# ---------------------------------------------------------------------------------- fuzz
SEGMENTS = st.one_of(
    st.sampled_from(
        ["sec", "guarded", "..", "%2e%2e", "..%2F..%2Fetc", "rollout_1", "job_x", "", "%00"]
    ),
    st.text(
        alphabet=st.characters(codec="utf-8", exclude_characters="/?#"), min_size=1, max_size=12
    ),
)
TEMPLATES = [
    "/api/info",
    "/api/models/register",
    "/api/models/{0}/{1}",
    "/api/models/{0}/{1}/step",
    "/api/models/{0}/{1}/train",
    "/api/models/{0}/{1}/log",
    "/api/models/{0}/{1}/delete_checkpoints",
    "/api/models/{0}/{1}/rollouts/{2}/calls",
    "/api/models/{0}/{1}/rollouts/{2}/release",
    "/api/jobs/{2}",
    "/api/jobs/{2}/events?after={0}",
    "/v1/chat/completions",
    "/rollouts/{2}/v1/chat/completions",
    "/v1/models",
    "/api/{0}",
]
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = {
    "name": st.sampled_from(["guarded", "../x", "", "fz"]) | st.text(max_size=8),
    "project": st.sampled_from(["sec", "..", "p"]),
    "base_model": st.sampled_from(
        ["tiny-random", "/etc", "tiny-random-99999999999", "smollm2-135m!"]
    ),
    "groups": JSON_VALUES | st.just([{"trajectories": [{"reward": 1.0}, {"reward": 0.0}]}]),
    "config": JSON_VALUES | st.just({"learning_rate": -1}),
    "job_id": JSON_VALUES,
    "split": st.sampled_from(["val", "..", "a/b"]),
    "best_checkpoint_metric": JSON_VALUES,
    "model": st.sampled_from(["guarded", "guarded@999", "guarded@x", "nope"]) | JSON_VALUES,
    "messages": JSON_VALUES | st.just([{"role": "user", "content": "hi"}]),
    "max_tokens": st.integers(-5, 6) | JSON_VALUES,
    "tools": JSON_VALUES,
    "stream": st.booleans(),
}
BODIES = st.one_of(
    st.fixed_dictionaries({}, optional=FIELDS),
    JSON_VALUES,
    st.binary(max_size=64),
)


@settings(
    # Bounded for CI (a few seconds); ART_FUZZ_EXAMPLES=5000 for a deeper local run.
    max_examples=int(os.environ.get("ART_FUZZ_EXAMPLES", "200")),
    deadline=None,
    derandomize="ART_FUZZ_EXAMPLES" not in os.environ,
    database=None,  # no .hypothesis folder in the checkout
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE"]),
    template=st.sampled_from(TEMPLATES),
    segments=st.lists(SEGMENTS, min_size=3, max_size=3),
    body=BODIES,
)
def test_fuzzed_requests_never_get_a_5xx(
    http: httpx.Client, method: str, template: str, segments: list[str], body: object
) -> None:
    # Pre-encoded segments ("%2e%2e") stay as they are; anything else is percent-encoded.
    path = template.format(*(quote(segment, safe="%:@") for segment in segments))
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = http.request(
        method, path, content=content, headers={"content-type": "application/json"}
    )
    assert response.status_code < 500, (method, path, content[:300], response.text[:500])
