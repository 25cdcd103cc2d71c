"""Loopback stand-ins for tracing backends, so tests run the real SDKs offline.

- ``WeaveStandIn``: the W&B GraphQL endpoint and the Weave trace server, as far as
  ``weave.init`` and the Weave client use them (project lookup, ops, calls, feedback).
- ``LangfuseStandIn``: the Langfuse public API's score ingestion (spans are read from an
  in-memory exporter instead).
- ``OtlpCollector``: an OTLP/HTTP traces receiver that decodes the protobuf it gets.

Each is a ``LoopbackServer`` (a real HTTP server on ``127.0.0.1``, a free port, in a daemon
thread) that records what it receives.

Example:
    >>> with WeaveStandIn() as server:  # changes process-wide state: `weave.init` and the environment  # doctest: +SKIP
    ...     os.environ.update(server.env())
    ...     client = weave.init("team/project")
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from art_core.testing.loopback import LoopbackServer

Handler = Callable[[Request, Any], Awaitable[Any]]


@dataclass(frozen=True)
class Received:
    """One request a stand-in received."""

    method: str
    path: str
    body: Any
    headers: dict[str, str]


class RecordingServer(LoopbackServer):
    """A loopback server that keeps every request it received in ``requests``."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[Received] = []
        self._lock = threading.Lock()

    def record(self, request: Request, body: Any) -> None:
        with self._lock:
            self.requests.append(
                Received(request.method, request.url.path, body, dict(request.headers))
            )


async def _json_body(request: Request) -> Any:
    raw = await request.body()
    if not raw:
        return None
    if request.headers.get("content-type", "").startswith("application/json"):
        return json.loads(raw)
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _digest(value: Any) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()[:32]


class WeaveStandIn(RecordingServer):
    """What ``weave.init`` and the Weave client need from W&B and the Weave trace server.

    ``calls`` maps call ids to the call as the client sent it (start and end merged);
    ``feedback`` lists feedback items; ``objects`` the objects (ops) published.
    """

    def __init__(self, username: str = "tester") -> None:
        super().__init__()
        self.username = username
        self.calls: dict[str, dict[str, Any]] = {}
        self.feedback: list[dict[str, Any]] = []
        self.objects: list[dict[str, Any]] = []

    def env(self) -> dict[str, str]:
        """Environment variables pointing ``weave`` at this server (no real key needed)."""
        return {
            "WANDB_BASE_URL": self.url,
            "WF_TRACE_SERVER_URL": f"{self.url}/traces",
            "WANDB_API_KEY": "standin" * 5 + "00000",
            "WEAVE_PRINT_CALL_LINK": "false",
            "WEAVE_IMPLICITLY_PATCH_INTEGRATIONS": "false",
            "WEAVE_USE_SERVER_CACHE": "false",
        }

    def _merge_call(self, item: dict[str, Any]) -> None:
        with self._lock:
            call = self.calls.setdefault(str(item["id"]), {})
            call.update({k: v for k, v in item.items() if v is not None or k not in call})

    def calls_named(self, op: str) -> list[dict[str, Any]]:
        """The calls whose op name (``weave:///e/p/op/NAME:digest``) is ``op``."""
        return [
            c
            for c in self.calls.values()
            if str(c.get("op_name", "")).split("/op/")[-1].split(":")[0] == op
        ]

    def routes(self) -> list[Route]:
        async def graphql(request: Request) -> Response:
            body = await _json_body(request)
            self.record(request, body)
            query = body.get("query", "")
            variables = body.get("variables") or {}
            if "viewer" in query:
                entity = {"name": self.username}
                return JSONResponse(
                    {"data": {"viewer": {"username": self.username, "defaultEntity": entity}}}
                )
            if "upsertModel" in query:
                model = {"name": variables.get("name"), "description": ""}
                return JSONResponse({"data": {"upsertModel": {"model": model}}})
            if "project(" in query:
                return JSONResponse({"data": {"project": {"name": variables.get("name")}}})
            if "serverInfo" in query:
                return JSONResponse({"data": {"serverInfo": {"frontendHost": self.url}}})
            return JSONResponse({"data": {}})

        async def trace_server(request: Request) -> Response:
            path = "/" + request.path_params["path"]
            body = await _json_body(request)
            self.record(request, body)
            if path == "/server_info":
                return JSONResponse(
                    {
                        "min_required_weave_python_version": "0.0.1",
                        "trace_server_version": "999.0.0",
                    }
                )
            if path == "/obj/create":
                with self._lock:
                    self.objects.append(body["obj"])
                return JSONResponse(
                    {"digest": _digest(body), "object_id": body["obj"].get("object_id")}
                )
            if path == "/file/create":
                return JSONResponse({"digest": _digest(body)})
            if path == "/table/create":
                rows = body.get("table", {}).get("rows", [])
                return JSONResponse(
                    {"digest": _digest(body), "row_digests": [_digest(r) for r in rows]}
                )
            if path.endswith("/calls/complete"):
                for item in body.get("batch", []):
                    self._merge_call(item)
                return JSONResponse({})
            if path == "/call/upsert_batch":
                for item in body.get("batch", []):
                    req = item.get("req", {})
                    self._merge_call(req.get("start") or req.get("end") or {})
                return JSONResponse({"res": []})
            if path.endswith("/call/start") or path.endswith("/call/end"):
                part = body.get("start") or body.get("end")
                self._merge_call(part)
                return JSONResponse({"id": part.get("id"), "trace_id": part.get("trace_id")})
            if path.startswith("/feedback/"):
                items = body.get("batch") if path == "/feedback/batch/create" else [body]
                results = []
                for item in items:
                    with self._lock:
                        self.feedback.append(item)
                    results.append(
                        {
                            "id": item.get("id") or _digest(item),
                            "created_at": "2024-01-01T00:00:00Z",
                            "wb_user_id": self.username,
                            "payload": item.get("payload", {}),
                        }
                    )
                return JSONResponse(
                    {"res": results} if path == "/feedback/batch/create" else results[0]
                )
            return JSONResponse({})

        return [
            Route("/graphql", graphql, methods=["POST"]),
            Route("/traces/{path:path}", trace_server, methods=["GET", "POST"]),
        ]


class LangfuseStandIn(RecordingServer):
    """The Langfuse API's score ingestion (``POST /api/public/scores``); ``scores`` lists them."""

    def __init__(self) -> None:
        super().__init__()
        self.scores: list[dict[str, Any]] = []

    def routes(self) -> list[Route]:
        async def scores(request: Request) -> Response:
            body = await _json_body(request)
            self.record(request, body)
            items = body if isinstance(body, list) else [body]
            with self._lock:
                self.scores.extend(items)
            return JSONResponse([{"id": item.get("id")} for item in items])

        async def other(request: Request) -> Response:
            self.record(request, await request.body())
            return JSONResponse({})

        return [
            Route("/api/public/scores", scores, methods=["POST"]),
            Route("/{path:path}", other, methods=["GET", "POST"]),
        ]


class OtlpCollector(RecordingServer):
    """An OTLP/HTTP receiver: ``spans`` holds every span received, decoded to dicts with
    ``name``, ``trace_id``, ``span_id``, ``parent_span_id`` (hex), ``attributes``, ``events``."""

    def __init__(self) -> None:
        super().__init__()
        self.spans: list[dict[str, Any]] = []

    @property
    def endpoint(self) -> str:
        return f"{self.url}/v1/traces"

    def routes(self) -> list[Route]:
        from google.protobuf.json_format import MessageToDict
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        def value(any_value: dict[str, Any]) -> Any:
            ((kind, inner),) = any_value.items()
            if kind == "arrayValue":
                return [value(v) for v in inner.get("values", [])]
            if kind == "intValue":
                return int(inner)
            return inner

        async def traces(request: Request) -> Response:
            raw = await request.body()
            message = ExportTraceServiceRequest()
            message.ParseFromString(raw)
            self.record(request, len(raw))
            for resource_spans in message.resource_spans:
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        as_dict = MessageToDict(span)
                        decoded = {
                            "name": span.name,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_span_id": span.parent_span_id.hex() or None,
                            "start_time": span.start_time_unix_nano / 1e9,
                            "end_time": span.end_time_unix_nano / 1e9,
                            "attributes": {
                                a["key"]: value(a["value"]) for a in as_dict.get("attributes", [])
                            },
                            "events": [e.name for e in span.events],
                        }
                        with self._lock:
                            self.spans.append(decoded)
            return Response(
                ExportTraceServiceResponse().SerializeToString(),
                media_type="application/x-protobuf",
            )

        return [Route("/v1/traces", traces, methods=["POST"])]
