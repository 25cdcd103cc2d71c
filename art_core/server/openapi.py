"""The OpenAPI 3.1 document of ``art-core serve``: every route of the gateway, of ``/api``
and the viewer's JSON routes under ``/ui/api``.

Request bodies are the pydantic models that already validate them (``ChatCompletionRequest``,
``RegisterRequest``, ``TrainRequest``, ...), turned into JSON Schema by pydantic, so the
document cannot drift from what the server accepts. Served at ``GET /openapi.json`` behind the
same bearer auth as every other route; any client generator or API fuzzer can use it (the
test suite runs schemathesis on it).

Example:
    >>> doc = openapi_document()
    >>> doc["openapi"], "/v1/chat/completions" in doc["paths"]
    ('3.1.0', True)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from art_core.gateway.apis.completions import CompletionRequest
from art_core.gateway.apis.messages import CountTokensRequest, MessagesRequest
from art_core.gateway.apis.responses import ResponsesRequest
from art_core.gateway.rollout_limits import RolloutLimits
from art_core.gateway.rollout_sampling import RolloutSampling
from art_core.gateway.schemas import ChatCompletionRequest
from art_core.server.api import MODEL, NDJSON
from art_core.server.schemas import (
    DeleteCheckpointsRequest,
    ExportRequest,
    LogRequest,
    RegisterRequest,
    TrainRequest,
    TrainSFTRequest,
)
from art_core.ui.table import MAX_LIMIT, MAX_QUERY_CHARS, SORTABLE

# Path parameters, as the routes check them.
NAME = {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"}
ROLLOUT_ID = {"type": "string", "pattern": "^[A-Za-z0-9_.:-]{1,128}$"}
JOB_ID = {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,80}$"}
# The viewer's (``art_core.ui``): a folder's names, splits, steps and rollout ids.
UI_NAME = {"type": "string", "pattern": "^[A-Za-z0-9_@+=-][A-Za-z0-9._@+=-]{0,199}$"}
UI_PATH = {
    "project": UI_NAME,
    "name": UI_NAME,
    "split": {"type": "string", "pattern": "^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$"},
    "step": {"type": "string", "pattern": "^[0-9]{1,9}$"},
    "rollout": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,200}$"},
}


@dataclass(frozen=True)
class Operation:
    """One route: method, path (OpenAPI template), what it does, its body model."""

    method: str
    path: str
    summary: str
    body: type[BaseModel] | None = None
    query: tuple[tuple[str, dict[str, Any]], ...] = ()
    streams: bool = False
    # The media type of a success (None: NDJSON when it streams, else JSON).
    media_type: str | None = None
    # The shape of its error bodies: OpenAI's, or Anthropic's (the Messages routes).
    errors: str = "openai"
    # Path parameters' schemas where they differ from the service's (the viewer's routes).
    path_schemas: tuple[tuple[str, dict[str, Any]], ...] = ()
    # The description of a 204 it may answer (None: it never does).
    no_content: str | None = None
    # Whether it may answer 503 (busy, a model that cannot load): the viewer never does.
    busy: bool = True


def _operations() -> list[Operation]:
    return [*_inference_operations(), *_training_operations(), *_viewer_operations()]


def _inference_operations() -> list[Operation]:
    """The gateway's routes: health, rollout sampling and limits, and the wire APIs (also per
    rollout)."""
    chat = "Chat completion (OpenAI's protocol), recorded token-exactly"
    operations = [
        Operation("get", "/health", "Liveness and the models served"),
        Operation(
            "put",
            "/rollouts/{rollout_id}/sampling",
            "Set the sampling settings (seed, temperature, top_p) of every call of a rollout, "
            "in every wire API; all null removes them",
            RolloutSampling,
            busy=False,
        ),
        Operation(
            "put",
            "/rollouts/{rollout_id}/limits",
            "Bound the calls of a rollout (max_calls): past it a call is refused with a 403, "
            "unsampled and unrecorded; null removes the bound",
            RolloutLimits,
            busy=False,
        ),
        Operation(
            "get",
            "/rollouts/{rollout_id}/limits",
            "A rollout's bound on its calls, and how many it admitted and refused",
            busy=False,
        ),
    ]
    for prefix, where in (("", ""), ("/rollouts/{rollout_id}", " within a rollout")):
        operations += [
            Operation("get", f"{prefix}/v1/models", f"The models served{where}"),
            Operation("get", f"{prefix}/v1/models/{{model_id}}", f"One model{where}"),
            Operation("post", f"{prefix}/v1/chat/completions", chat + where, ChatCompletionRequest),
            Operation(
                "post",
                f"{prefix}/v1/responses",
                f"OpenAI Responses, recorded token-exactly{where}",
                ResponsesRequest,
            ),
            Operation(
                "post",
                f"{prefix}/v1/completions",
                f"Completions of a raw prompt (text or token ids), recorded{where}",
                CompletionRequest,
            ),
            Operation(
                "post",
                f"{prefix}/v1/messages",
                f"Anthropic Messages, recorded token-exactly{where}",
                MessagesRequest,
                errors="anthropic",
            ),
            Operation(
                "post",
                f"{prefix}/v1/messages/count_tokens",
                f"The prompt tokens of an Anthropic Messages request{where}",
                CountTokensRequest,
                errors="anthropic",
            ),
        ]
    return operations


def _training_operations() -> list[Operation]:
    """The training API under ``/api``: models, steps, logs, exports and jobs."""
    after = (("after", {"type": "integer", "minimum": 0, "maximum": 999_999_999}),)
    return [
        Operation("get", "/api/info", "The service, its models, whether auth is on"),
        Operation("post", "/api/models/register", "Load (or re-bind) a model", RegisterRequest),
        Operation("get", MODEL, "A registered model"),
        Operation("get", f"{MODEL}/step", "The model's latest step"),
        Operation(
            "post", f"{MODEL}/train", "One GRPO step, as a job (NDJSON progress)", TrainRequest,
            query=after, streams=True,
        ),
        Operation(
            "post", f"{MODEL}/train_sft", "Supervised epochs, as a job (NDJSON progress)",
            TrainSFTRequest, query=after, streams=True,
        ),
        Operation("post", f"{MODEL}/log", "Log trajectories and metrics", LogRequest),
        Operation(
            "post", f"{MODEL}/delete_checkpoints", "Delete all but the latest and best",
            DeleteCheckpointsRequest,
        ),
        Operation(
            "post", f"{MODEL}/export", "A checkpoint exported (peft, merged or gguf), as a tar",
            ExportRequest, media_type="application/x-tar",
        ),
        Operation("get", f"{MODEL}/rollouts/{{rollout_id}}/calls", "A rollout's recorded calls"),
        Operation(
            "post", f"{MODEL}/rollouts/{{rollout_id}}/release", "Release a rollout's calls"
        ),
        Operation("get", "/api/jobs/{job_id}", "A training job's status and outcome"),
        Operation(
            "delete", "/api/jobs/{job_id}", "Cancel a training job",
            query=(("wait", {"type": "number", "minimum": 0, "maximum": 600}),),
        ),
        Operation(
            "get", "/api/jobs/{job_id}/events", "A job's progress events (NDJSON)",
            query=after, streams=True,
        ),
    ]  # fmt: skip


def _viewer_operations() -> list[Operation]:
    """The viewer's JSON (and CSV) routes under ``/ui/api`` (read-only, GET; HEAD too)."""
    model, paths = "/ui/api/runs/{project}/{name}", tuple(UI_PATH.items())
    step = model + "/steps/{split}/{step}"
    text = {"type": "string"}
    curve = (("id", text), ("metric", text))
    table = (
        ("q", {"type": "string", "maxLength": MAX_QUERY_CHARS}),
        ("group", {"type": "integer", "minimum": 0, "maximum": 10**9}),
        ("sort", {"type": "string", "enum": sorted(SORTABLE)}),
        ("desc", {"type": "string", "enum": ["0", "1", "false", "true"]}),
        ("offset", {"type": "integer", "minimum": 0, "maximum": 10**9}),
        ("limit", {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}),
    )
    side = {"type": "string", "description": "project/model/split/step"}
    return [
        Operation("get", "/ui/api/runs", "Viewer: the runs of the art folder", busy=False),
        Operation(
            "get", model, "Viewer: a run (curves, steps, diagnoses, evaluations)",
            query=(("known", {"type": "string", "description": "204 if the history is this size"}),),
            path_schemas=paths, no_content="The history has not grown", busy=False,
        ),
        Operation(
            "get", model + "/curve.csv", "Viewer: one curve as CSV", query=curve,
            path_schemas=paths, media_type="text/csv", busy=False,
        ),
        Operation(
            "get", model + "/curve.json", "Viewer: one curve", query=curve,
            path_schemas=paths, busy=False,
        ),
        Operation(
            "get", step, "Viewer: a step's rollouts, filtered, sorted and paged", query=table,
            path_schemas=paths, busy=False,
        ),
        Operation(
            "get", step + "/rollouts/{rollout}", "Viewer: one rollout and its training signal",
            path_schemas=paths, busy=False,
        ),
        Operation(
            "get", "/ui/api/compare", "Viewer: two steps' groups compared by scenario",
            query=(("a", side), ("b", side)), busy=False,
        ),
    ]  # fmt: skip


def _path_parameters(
    path: str, overrides: tuple[tuple[str, dict[str, Any]], ...] = ()
) -> list[dict[str, Any]]:
    schemas = {
        "project": NAME,
        "name": NAME,
        "rollout_id": ROLLOUT_ID,
        "job_id": JOB_ID,
        "model_id": {"type": "string", "minLength": 1, "maxLength": 256},
        **dict(overrides),
    }
    return [
        {"name": name, "in": "path", "required": True, "schema": schema}
        for name, schema in schemas.items()
        if f"{{{name}}}" in path
    ]


ERROR = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
            "required": ["message", "type"],
        }
    },
    "required": ["error"],
}
ANTHROPIC_ERROR = {
    "type": "object",
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
            "required": ["type", "message"],
        },
    },
    "required": ["type", "error"],
}


@functools.cache
def openapi_document() -> dict[str, Any]:
    """The whole document (built once per process; it depends on no request)."""
    operations = _operations()
    models = sorted({op.body for op in operations if op.body is not None}, key=lambda m: m.__name__)
    refs, definitions = models_json_schema(
        [(model, "validation") for model in models], ref_template="#/components/schemas/{model}"
    )
    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        error = ANTHROPIC_ERROR if op.errors == "anthropic" else ERROR
        entry: dict[str, Any] = {
            "summary": op.summary,
            "operationId": f"{op.method}_{op.path.strip('/').replace('/', '_')}".replace(
                "{", ""
            ).replace("}", ""),
            "parameters": _path_parameters(op.path, op.path_schemas)
            + [
                {"name": name, "in": "query", "required": False, "schema": schema}
                for name, schema in op.query
            ],
            "responses": {
                "200": {
                    "description": "OK",
                    "content": {
                        op.media_type or (NDJSON if op.streams else "application/json"): {
                            "schema": {}
                        }
                    },
                },
                "4XX": {
                    "description": "The request's own error, named",
                    "content": {"application/json": {"schema": error}},
                },
            },
        }
        if op.busy:
            entry["responses"]["503"] = {
                "description": "Busy or a model that cannot load now (see Retry-After)",
                "content": {"application/json": {"schema": error}},
            }
        if op.no_content is not None:
            entry["responses"]["204"] = {"description": op.no_content}
        if op.body is not None:
            entry["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": refs[(op.body, "validation")]}},
            }
        paths.setdefault(op.path, {})[op.method] = entry
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "art-core serve",
            "version": _version(),
            "description": "OpenAI-compatible gateway (token-exact capture) and training API.",
        },
        "paths": paths,
        "components": {
            "schemas": definitions.get("$defs", {}),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("art-core")
    except PackageNotFoundError:
        return "0"
