"""The OpenAPI document drives a fuzz test of ``art-core serve`` (a real process).

schemathesis generates requests for every operation of ``/openapi.json``, both ones that
follow the schema and ones that break it (wrong types, missing fields, out-of-range values),
seeded and bounded in number. Whatever comes in: no 5xx (a 503 "busy / cannot load now" with
Retry-After is allowed), no hang (each request has a timeout), and the server's memory stays
bounded.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

os.environ.setdefault(
    "ART_CORE_MODELS_DIR", str(Path(tempfile.gettempdir()) / "art-core-test-models")
)

from remote_support import ServerProcess
from starlette.applications import Starlette
from starlette.routing import Route

from art_core.server.openapi import openapi_document
from art_core.ui import build_ui_app

pytestmark = pytest.mark.slow

EXAMPLES_PER_OPERATION = 30
DOCUMENT = openapi_document()
SCHEMA = schemathesis.openapi.from_dict(DOCUMENT)
OPERATIONS = [result.ok() for result in SCHEMA.get_all_operations()]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(
        tmp_path_factory.mktemp("fuzz") / "art", args=["--default-max-tokens", "4"]
    ).start()
    # A real model, so requests naming it get past "no such model" into validation.
    response = httpx.post(
        f"{server.url}/api/models/register",
        json={"name": "m", "project": "fuzz", "base_model": "tiny-random"},
        headers={"Authorization": f"Bearer {server.token}"},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    yield server
    assert server.stop() == 0, server.describe()


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def test_the_document_is_served_behind_auth(server: ServerProcess) -> None:
    assert httpx.get(f"{server.url}/openapi.json").status_code == 401
    served = httpx.get(
        f"{server.url}/openapi.json", headers={"Authorization": f"Bearer {server.token}"}
    )
    assert served.status_code == 200 and served.json() == DOCUMENT
    assert {op.path for op in OPERATIONS} == set(DOCUMENT["paths"])


def test_the_document_has_every_json_route_of_the_viewer_and_export(tmp_path: Path) -> None:
    """The viewer's data routes (under ``/ui`` of ``art-core serve``) and export are fuzzed
    too: each is in the document, with the methods it is routed for."""
    viewer = build_ui_app(tmp_path)
    assert isinstance(viewer, Starlette)
    routed = {
        ("/ui" + route.path, method.lower())
        for route in viewer.routes
        if isinstance(route, Route) and route.path.startswith("/api/")
        for method in route.methods or ()
        if method != "HEAD"
    }
    documented = {(path, method) for path, item in DOCUMENT["paths"].items() for method in item}
    assert routed and routed <= documented, routed - documented
    assert {p for p, _ in documented if p.startswith("/ui/")} == {p for p, _ in routed}
    assert ("/api/models/{project}/{name}/export", "post") in documented


def aimed(case: Any, model_first: bool) -> None:
    """Point part of the cases at the real model and keep generations short: the point is
    the server's handling of the input, not tiny-random writing 2,000 tokens."""
    body = case.body
    if isinstance(body, dict):
        if model_first and "model" in body:
            body["model"] = "m"
        for key in ("max_tokens", "max_completion_tokens"):
            if isinstance(body.get(key), int) and body[key] > 4:
                body[key] = 4
        if isinstance(body.get("n"), int) and body["n"] > 2:
            body["n"] = 2
    if model_first and case.path_parameters:
        for key, value in (("project", "fuzz"), ("name", "m")):
            if key in case.path_parameters:
                case.path_parameters[key] = value


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
@pytest.mark.parametrize("operation", OPERATIONS, ids=lambda op: f"{op.method.upper()} {op.path}")
def test_no_input_makes_the_server_fail(
    server: ServerProcess, operation: Any, mode: GenerationMode
) -> None:
    headers = {"Authorization": f"Bearer {server.token}"}
    before = rss_mb(server.pid)
    seen: dict[int, int] = {}

    @seed(0)
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode), model_first=st.booleans())
    def check(case: Any, model_first: bool) -> None:
        aimed(case, model_first)
        response = case.call(base_url=server.url, headers=headers, timeout=60)
        seen[response.status_code] = seen.get(response.status_code, 0) + 1
        server_error = response.status_code >= 500 and not (
            response.status_code == 503 and "retry-after" in response.headers
        )
        assert not server_error, (case.as_curl_command(), response.status_code, response.text)

    check()
    print(f"{operation.label} {mode.value}: statuses {sorted(seen.items())}")  # with -s
    assert server.process is not None and server.process.poll() is None, server.describe()
    assert rss_mb(server.pid) < before + 500, seen


API_OPERATIONS = [op for op in OPERATIONS if op.path.startswith("/api/")]
PATH_VALUES = {"project": "fuzz", "name": "m", "rollout_id": "r1", "job_id": "job-none"}
DEEP_BODY = b'{"a": ' * 3000 + b"1" + b"}" * 3000


@pytest.mark.parametrize(
    "operation", API_OPERATIONS, ids=lambda op: f"{op.method.upper()} {op.path}"
)
def test_api_routes_refuse_non_ascii_digits_and_deep_bodies(
    server: ServerProcess, operation: Any
) -> None:
    headers = {"Authorization": f"Bearer {server.token}", "content-type": "application/json"}
    path = operation.path.format(**PATH_VALUES)
    queries = [
        p["name"] for p in operation.definition.raw.get("parameters", []) if p["in"] == "query"
    ]
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as client:
        for name in queries:  # a digit that is not ASCII ('²', '٣') is not a number here
            for digits in ("²", "٣"):
                response = client.request(operation.method, path, params={name: digits})
                assert 400 <= response.status_code < 500, (name, response.text)
        if operation.method in ("post", "put"):
            response = client.request(operation.method, path, content=DEEP_BODY)
            assert response.status_code == 400, response.text
