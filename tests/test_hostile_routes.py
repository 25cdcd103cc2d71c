"""Hostile requests against real processes on loopback (``art-core ui --token T`` and
``art-core serve --token T``, the viewer under ``/ui``): a login path with a control
character, a login path naming another host, and paths or methods no route takes. Each is
answered, in JSON, in the one error shape; none drops the connection or leaves this origin.

Requests go through ``http.client``, which sends the target exactly as written (``//host``,
``\\``, ``%2F``, ``%2e%2e`` untouched) and reports a connection closed without an answer.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest
from remote_support import ServerProcess
from ui_support import start_ui, stop_ui

TOKEN = "hostile-T"
BEARER = {"authorization": f"Bearer {TOKEN}"}


@dataclass
class Target:
    """A running viewer: where it listens and the root it is served under."""

    kind: str
    host: str
    port: int
    root: str  # "" for ``art-core ui``, "/ui" under ``art-core serve``

    def connection(self) -> closing[http.client.HTTPConnection]:
        return closing(http.client.HTTPConnection(self.host, self.port, timeout=30))


@dataclass
class Answer:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def json(self) -> Any:
        assert self.headers.get("content-type", "").startswith("application/json"), self.body
        return json.loads(self.body)


def ask(
    connection: http.client.HTTPConnection,
    method: str,
    target: str,
    headers: dict[str, str] | None = None,
) -> Answer:
    connection.request(method, target, headers=headers or {})
    response = connection.getresponse()  # RemoteDisconnected if the server dropped it
    return Answer(response.status, response.headers, response.read())


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    folder = tmp_path_factory.mktemp("hostile-ui")
    process, lines = start_ui([str(folder), "--token", TOKEN])
    try:
        url = urlsplit(lines[-1].removeprefix("art-core ui: open "))
        assert url.hostname is not None and url.port is not None
        yield Target("art-core ui", url.hostname, url.port, "")
    finally:
        log = stop_ui(process)
    assert "Invalid HTTP header" not in log  # its log, stderr included


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    server = ServerProcess(tmp_path_factory.mktemp("hostile-serve") / "art", token=TOKEN)
    server.start()
    try:
        url = urlsplit(server.url)
        assert url.hostname is not None and url.port is not None
        yield Target("art-core serve", url.hostname, url.port, "/ui")
    finally:
        server.stop()
    assert "Invalid HTTP header" not in server.log.read_text()


@pytest.fixture(params=["standalone", "serve"])
def viewer(request: pytest.FixtureRequest) -> Target:
    target: Target = request.getfixturevalue(request.param)
    return target


def assert_openai_error(answer: Answer, status: int) -> dict[str, Any]:
    assert answer.status == status, (answer.status, answer.body)
    body = answer.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, body
    assert isinstance(error["message"], str) and error["message"], body
    assert isinstance(error["type"], str) and error["param"] is None, body
    return dict(error)


def assert_anthropic_error(answer: Answer, status: int) -> dict[str, Any]:
    assert answer.status == status, (answer.status, answer.body)
    body = answer.json()
    assert body["type"] == "error" and set(body) == {"type", "error"}, body
    assert set(body["error"]) == {"type", "message"} and body["error"]["message"], body
    return dict(body["error"])


@pytest.mark.parametrize(
    ("encoded", "shown"),
    [
        ("%0d%0aSet-Cookie:%20evil=1", r"\r\nSet-Cookie: evil=1"),
        ("a%00b", r"\x00"),
        ("a%7Fb", r"\x7f"),
        ("a%09b", r"\t"),
    ],
)
def test_control_character_in_login_path_is_refused_in_json(
    viewer: Target, encoded: str, shown: str
) -> None:
    with viewer.connection() as connection:
        answer = ask(connection, "GET", f"{viewer.root}/{encoded}?token={TOKEN}")
        error = assert_openai_error(answer, 400)
        assert shown in error["message"] and viewer.root + "/" in error["message"], error
        assert answer.headers.get("set-cookie") is None
        assert answer.headers.get("location") is None
        # The connection is still open and answers the next request.
        again = ask(connection, "GET", f"{viewer.root}/api/runs", BEARER)
        assert again.status == 200, again.body


def test_long_control_character_path_is_named_bounded(viewer: Target) -> None:
    with viewer.connection() as connection:
        answer = ask(connection, "GET", f"{viewer.root}/%0a{'x' * 5000}?token={TOKEN}")
    error = assert_openai_error(answer, 400)
    assert r"\n" in error["message"] and len(error["message"]) < 600, error


@pytest.mark.parametrize("prefix", ["//", "/\\", "/\\/", "///\\\\"])
def test_login_redirect_stays_on_this_origin(viewer: Target, prefix: str) -> None:
    with viewer.connection() as connection:
        answer = ask(connection, "GET", f"{viewer.root}{prefix}evil.example/?x=1&token={TOKEN}")
    assert answer.status == 303, answer.body
    location = answer.headers["location"]
    assert location == f"{viewer.root}/evil.example/?x=1", location
    assert location.startswith("/") and not location.startswith("//") and "\\" not in location
    assert TOKEN in answer.headers["set-cookie"]


def test_login_redirect_keeps_the_path_as_received(viewer: Target) -> None:
    with viewer.connection() as connection:
        answer = ask(connection, "GET", f"{viewer.root}/run/a%2Fb/c%20d?token={TOKEN}&x=1")
        assert answer.status == 303, answer.body
        assert answer.headers["location"] == f"{viewer.root}/run/a%2Fb/c%20d?x=1"
        climbing = ask(connection, "GET", f"{viewer.root}/a/%2e%2e/%2E%2E/../b?token={TOKEN}")
        assert climbing.status == 303 and climbing.headers["location"] == f"{viewer.root}/b"


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/api/nothing-here", 404),
        ("GET", "/api/runs/a%2Fb/c", 404),
        ("GET", "/api/runs/x/y/steps/..%2F..%2Fx/0/rollouts/r/more", 404),
        ("GET", "/static/%2e%2e/%2e%2e/server/app.py", 404),
        ("GET", "/static/%2e%2e/app.py", 404),
        ("GET", "/static/missing.js", 404),
        ("POST", "/api/runs", 405),
        ("DELETE", "/", 405),
        ("PUT", "/static/app.js", 405),
    ],
)
def test_viewer_refusals_are_json(viewer: Target, method: str, path: str, status: int) -> None:
    with viewer.connection() as connection:
        answer = ask(connection, method, viewer.root + path, BEARER)
    error = assert_openai_error(answer, status)
    assert error["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    if status == 405:
        assert "GET" in answer.headers["allow"], answer.headers
        assert method in error["message"]


@pytest.mark.parametrize(
    ("method", "path", "status", "allow"),
    [
        ("GET", "/nothing-here", 404, None),
        ("GET", "/api/models/a%2Fb/m", 404, None),
        ("GET", "/api/nothing", 404, None),
        ("GET", "/rollouts/r1/v2/chat", 404, None),
        ("GET", "/v1/chat/completions", 405, "POST"),
        ("DELETE", "/api/info", 405, "GET"),
        ("PATCH", "/api/jobs/job-1", 405, "GET"),
        ("POST", "/health", 405, "GET"),
        ("PUT", "/rollouts/r1/v1/responses", 405, "POST"),
        ("POST", "/openapi.json", 405, "GET"),
    ],
)
def test_server_and_gateway_refusals_are_json(
    serve: Target, method: str, path: str, status: int, allow: str | None
) -> None:
    with serve.connection() as connection:
        answer = ask(connection, method, path, BEARER)
        error = assert_openai_error(answer, status)
        assert error["code"] == ("route_not_found" if status == 404 else "method_not_allowed")
        if allow is not None:
            assert allow in answer.headers["allow"], answer.headers
        # Answered, not dropped: the connection serves the next request.
        assert ask(connection, "GET", "/health", BEARER).status == 200


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/v1/messages", 405),
        ("GET", "/v1/messages/count_tokens", 405),
        ("POST", "/v1/messages/nothing", 404),
        ("GET", "/rollouts/r1/v1/messages", 405),
        ("POST", "/rollouts/r1/v1/messages/a%2Fb", 404),
    ],
)
def test_messages_routes_refuse_in_anthropic_shape(
    serve: Target, method: str, path: str, status: int
) -> None:
    with serve.connection() as connection:
        answer = ask(connection, method, path, BEARER)
    error = assert_anthropic_error(answer, status)
    assert error["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    if status == 405:
        assert answer.headers["allow"] == "POST"


def test_refusals_name_the_path_escaped(serve: Target) -> None:
    with serve.connection() as connection:
        answer = ask(connection, "GET", "/nothing%0d%0aX-Evil:%201", BEARER)
    error = assert_openai_error(answer, 404)
    assert r"'/nothing\r\nX-Evil: 1'" in error["message"], error
    assert answer.headers.get("x-evil") is None
