"""The one error body of every HTTP answer (gateway and service): OpenAI's shape, and
Anthropic's on the Anthropic Messages routes.

``{"error": {"message", "type", "param", "code"}}``, or ``{"type": "error", "error": {"type",
"message"}}``; ``APIError`` carries it with its status. Messages name what was wrong and never
include server paths or tracebacks.
"""

from __future__ import annotations

import json
import re
from http import HTTPStatus
from typing import Any

from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Scope, Send

from art_core.engines.base import EngineError, EngineUnavailable


def error_body(
    message: str, *, type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """``{"error": {...}}`` as OpenAI answers errors.

    Example:
        >>> error_body("no", type="authentication_error")["error"]["message"]
        'no'
    """
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


# Anthropic's error types by HTTP status (its other 4xx are invalid requests, 5xx API errors).
ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}
# The routes that answer errors in Anthropic's shape (each also within a rollout).
ANTHROPIC_ROUTES = ("/v1/messages", "/v1/messages/count_tokens")
# Any path under them (``/v1/messages...``, ``/rollouts/{id}/v1/messages...``): its errors,
# a 404 or 405 of route matching included, are in Anthropic's shape.
_ANTHROPIC_PREFIX = re.compile(r"^(?:/rollouts/[^/]+)?/v1/messages(?:/|$)")


def is_anthropic_path(path: str) -> bool:
    """Whether errors on ``path`` are answered in Anthropic's shape (a Messages route or a
    path under one).

    Example:
        >>> is_anthropic_path("/rollouts/r1/v1/messages/nope"), is_anthropic_path("/v1/models")
        (True, False)
        >>> is_anthropic_path("/ui/v1/messages")  # the viewer's, not a Messages route
        False
    """
    return _ANTHROPIC_PREFIX.match(path) is not None


def error_type(status: int) -> str:
    """The OpenAI-shape ``type`` of an error answered with ``status``.

    Example:
        >>> error_type(404), error_type(405)
        ('not_found_error', 'invalid_request_error')
    """
    if status >= 500:
        return "server_error"
    return {
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        429: "rate_limit_error",
    }.get(status, "invalid_request_error")


def shown_path(path: str, limit: int = 200) -> str:
    r"""``path`` as an error message names it: repr-escaped (a control character shows as
    ``\r``, never raw), at most ``limit`` characters of it.

    Example:
        >>> print(shown_path("/a\r\nb"))
        '/a\r\nb'
    """
    return repr(path[:limit]) + ("..." if len(path) > limit else "")


def anthropic_error_body(status: int, message: str) -> dict[str, Any]:
    """``{"type": "error", "error": {...}}`` as Anthropic answers errors.

    Example:
        >>> anthropic_error_body(404, "no such model")
        {'type': 'error', 'error': {'type': 'not_found_error', 'message': 'no such model'}}
    """
    kind = ANTHROPIC_ERROR_TYPES.get(status)
    if kind is None:
        kind = "api_error" if status >= 500 else "invalid_request_error"
    return {"type": "error", "error": {"type": kind, "message": message}}


# An absolute filesystem path (two or more segments), as exceptions of file and import
# machinery write them; URL paths are not matched (they follow a host or a space-less word).
_SERVER_PATH = re.compile(r"(?<![\w.:/])(?:/[\w.@+-]+){2,}/?")


def scrub_paths(message: str) -> str:
    """``message`` with absolute server paths replaced by ``<path>``: an error body tells
    what was wrong, never where the server keeps its files.

    Example:
        >>> scrub_paths("No such file: '/srv/art/models/m/calls.sqlite'")
        "No such file: '<path>'"
    """
    return _SERVER_PATH.sub("<path>", message)


def internal_error(exc: BaseException) -> APIError:
    """The 500 answered for an unexpected exception: its kind, no traceback, no paths.

    Example:
        >>> internal_error(KeyError("x")).message
        "internal error (KeyError: 'x'); the server's log has the details"
    """
    detail = scrub_paths(str(exc))[:200]
    kind = type(exc).__name__
    return APIError(
        500,
        f"internal error ({kind}: {detail}); the server's log has the details"
        if detail
        else f"internal error ({kind}); the server's log has the details",
        type="server_error",
    )


def engine_error(exc: EngineError) -> APIError:
    """The answer to a call the engine refused (400) or could not finish because the engine,
    or the replica serving it, died or stopped answering (503: nothing was recorded, a retry
    is safe).

    Example:
        >>> engine_error(EngineUnavailable("replica 1 stopped answering")).status
        503
    """
    if isinstance(exc, EngineUnavailable):
        return APIError(503, scrub_paths(str(exc)), type="server_error", code="engine_unavailable")
    return APIError(400, scrub_paths(str(exc)))


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """A JSON response; non-finite floats (a recorded logprob of -inf) are written as
    JSON's ``-Infinity`` rather than failing the response."""
    return Response(
        json.dumps(data, ensure_ascii=False),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


async def send_error(
    send: Send,
    scope: Scope,
    status: int,
    message: str,
    *,
    type: str,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> None:
    """Answer an error from an ASGI middleware in the shape of the route's API (Anthropic's on
    its Messages routes, else OpenAI's).

    Example:
        >>> await send_error(send, scope, 429, "busy", type="rate_limit_error")  # fragment: an ASGI middleware's `send` and `scope`  # doctest: +SKIP
    """
    if is_anthropic_path(str(scope.get("path", ""))):
        body = anthropic_error_body(status, message)
    else:
        body = error_body(message, type=type, code=code)
    await send_json(send, status, body, headers)


async def send_json(
    send: Send, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
) -> None:
    """Answer from an ASGI middleware, before the app saw the request."""
    payload = json.dumps(body).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


async def http_exception_response(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (``HTTPException``: no route for the path is a 404, a route
    without the method a 405, which keeps its ``Allow`` header) in the one error shape:
    OpenAI's, Anthropic's under a Messages route. Register it for ``HTTPException`` in each
    Starlette app.

    Example:
        >>> from starlette.applications import Starlette
        >>> from starlette.exceptions import HTTPException
        >>> app = Starlette(routes=[], exception_handlers={HTTPException: http_exception_response})
    """
    if not isinstance(exc, HTTPException):  # registered for HTTPException only
        raise exc
    status = exc.status_code
    path = str(request.scope.get("path", ""))
    method = str(request.scope.get("method", ""))
    headers = dict(exc.headers or {})
    code: str | None = None
    if exc.detail != _phrase(status):  # raised with a message of its own: that message
        message = scrub_paths(str(exc.detail))[:500]
    elif status == 404:
        message, code = f"no such route: {method} {shown_path(path)}", "route_not_found"
    elif status == 405:
        allowed = headers.get("Allow") or headers.get("allow")
        message = f"method {method} is not allowed on {shown_path(path)}"
        message += f"; allowed: {allowed}" if allowed else ""
        code = "method_not_allowed"
    else:
        message = str(exc.detail)
    if is_anthropic_path(path):
        body = anthropic_error_body(status, message)
    else:
        body = error_body(message, type=error_type(status), code=code)
    if status in (204, 304):  # a body is not allowed: as Starlette answers them
        return Response(status_code=status, headers=headers)
    return json_response(body, status, headers=headers)


class APIError(Exception):
    """An error answer: its HTTP status and the body's fields.

    Example:
        >>> APIError(404, "no such model", type="not_found_error").status
        404
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)

    def response(self) -> Response:
        return json_response(self.body(), self.status)


def validation_message(exc: ValidationError, prefix: str = "") -> tuple[str, str | None]:
    """A pydantic error as one message naming up to five fields, and the first field."""
    parts = []
    first_param = None
    for error in exc.errors(include_url=False, include_input=False)[:5]:
        loc = field_path(error["loc"], prefix)
        first_param = first_param or loc or None
        message = str(error["msg"]).removeprefix("Value error, ")
        parts.append(f"{loc}: {message}" if loc else message)
    return "invalid request: " + "; ".join(parts), first_param


def field_path(loc: tuple[Any, ...] | list[Any], prefix: str = "") -> str:
    """``("groups", 0, "reward")`` -> ``"groups.0.reward"`` (pydantic's validator names dropped).

    Example:
        >>> field_path(("groups", 0, "reward"))
        'groups.0.reward'
    """
    parts = [str(p) for p in loc if not str(p).startswith("function-")]
    return ".".join([prefix, *parts] if prefix else parts)
