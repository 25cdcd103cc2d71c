"""Error bodies of the service, in the gateway's OpenAI shape, and pydantic error naming."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError
from starlette.types import Send


def error_body(
    message: str, *, type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """``{"error": {...}}`` as the gateway (and OpenAI) answer errors.

    Example:
        >>> error_body("no", type="authentication_error")["error"]["message"]
        'no'
    """
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


async def send_json(
    send: Send, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
) -> None:
    """Answer from an ASGI middleware, before the app saw the request."""
    payload = json.dumps(body).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})


def field_path(loc: tuple[Any, ...] | list[Any], prefix: str = "") -> str:
    """``("groups", 0, "trajectories", 1, "reward")`` -> ``"groups.0.trajectories.1.reward"``.

    Example:
        >>> field_path(("groups", 0, "reward"))
        'groups.0.reward'
    """
    parts = [str(p) for p in loc if not str(p).startswith("function-")]
    return ".".join([prefix, *parts] if prefix else parts)


def validation_body(exc: ValidationError, prefix: str = "") -> dict[str, Any]:
    """A 422 body naming every invalid field (the first one as ``param``)."""
    details = [
        {
            "field": field_path(error["loc"], prefix),
            "message": str(error["msg"]).removeprefix("Value error, "),
            "type": error["type"],
        }
        for error in exc.errors(include_url=False, include_input=False)[:20]
    ]
    text = "; ".join(
        f"{d['field']}: {d['message']}" if d["field"] else d["message"] for d in details[:5]
    )
    body = error_body(
        f"invalid request: {text}",
        type="invalid_request_error",
        param=details[0]["field"] if details else None,
        code="validation_error",
    )
    body["detail"] = details
    return body
