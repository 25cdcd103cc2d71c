"""Request bodies: read once, bounded, parsed once, and only into plain, storable JSON.

``BodyLimit`` (ASGI middleware) answers 413 for a body over the limit, declared or streamed,
before anything else reads it, and leaves the bytes in ``scope["art.body"]``; ``read_body``
returns them (or reads the body itself when no middleware did, with the same bound).
uvicorn keeps reading (and discarding) a body the app did not consume, so answering early is
safe for the client.

``parse_json`` is the one JSON parser for what callers send (bodies of every route, JSON in
headers): it refuses, as ``InvalidJSON`` (a 400), what would only fail later, after work was
done for it: nesting deeper than ``MAX_JSON_DEPTH`` (a ``RecursionError`` in whatever walks it
next) and lone UTF-16 surrogates (text that cannot be encoded to UTF-8, so cannot be recorded
or answered). orjson parses (several times faster than ``json`` on large bodies, and strict:
it refuses both by itself); JSON's ``NaN`` / ``Infinity``, which clients such as Python's
``json.dumps`` write for a logprob of -inf, fall back to the standard parser and are then
checked the same way.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from art_core.gateway.errors import APIError, send_error

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
# Deeper JSON is refused: far beyond any request's real shape (a tool schema nested ten
# levels is ~25 deep), far below where recursive code (pydantic, serializers) gives up.
MAX_JSON_DEPTH = 64

BODY_SCOPE_KEY = "art.body"
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def too_large_message(limit: int) -> str:
    return (
        f"the request body is larger than this server's limit of {limit} bytes "
        "(art-core serve --max-body-mb)"
    )


async def _too_large(send: Send, scope: Scope, limit: int) -> None:
    await send_error(
        send,
        scope,
        413,
        too_large_message(limit),
        type="invalid_request_error",
        code="request_too_large",
    )


class BodyLimit:
    """ASGI middleware: 413 for bodies over ``max_bytes``, declared or streamed (chunked).

    Bodies of POST/PUT/PATCH are read here (bounded by the limit) and replayed to the app;
    the bytes are also left in ``scope["art.body"]`` for later middleware.

    Example:
        >>> from starlette.applications import Starlette
        >>> app = BodyLimit(Starlette(), max_bytes=1 << 20)
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = next((v for k, v in scope.get("headers", []) if k == b"content-length"), None)
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                await send_error(
                    send, scope, 400, "invalid Content-Length", type="invalid_request_error"
                )
                return
            if size > self.max_bytes:
                await _too_large(send, scope, self.max_bytes)
                return
        if scope["method"] not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before sending its body: nobody to answer
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_bytes:
                await _too_large(send, scope, self.max_bytes)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        scope[BODY_SCOPE_KEY] = body
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # later calls wait for the disconnect, as usual

        await self.app(scope, replay, send)


class InvalidJSON(ValueError):
    """Text a caller sent that is not JSON we accept; its message names what was wrong."""


def parse_json(raw: bytes | str, *, what: str = "the body", max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse JSON a caller sent; ``InvalidJSON`` for bad syntax, deep nesting or bad text.

    Example:
        >>> parse_json(b'{"a": [1, -Infinity]}')
        {'a': [1, -inf]}
        >>> parse_json('{"a": "\\ud800"}')
        Traceback (most recent call last):
        ...
        art_core.gateway.body.InvalidJSON: the body is not valid JSON: ...
    """
    try:
        value = orjson.loads(raw)
        strict = True
    except orjson.JSONDecodeError as exc:
        if "depth" in str(exc) or "surrogate" in str(exc):
            raise InvalidJSON(_problem(what, exc, max_depth)) from None
        try:  # NaN / Infinity, which orjson refuses
            value = json.loads(raw)
        except (ValueError, RecursionError) as fallback:
            raise InvalidJSON(f"{what} is not valid JSON: {_short(exc, fallback)}") from None
        strict = False
    check_json_value(value, what=what, max_depth=max_depth, check_text=not strict)
    return value


def check_json_value(
    value: Any, *, what: str = "the body", max_depth: int = MAX_JSON_DEPTH, check_text: bool = True
) -> None:
    """``InvalidJSON`` when ``value`` nests deeper than ``max_depth`` or (``check_text``)
    holds a string that is not valid Unicode (a lone surrogate). Iterative: any depth is safe.

    Example:
        >>> check_json_value({"a": [[1]]}, max_depth=2)
        Traceback (most recent call last):
        ...
        art_core.gateway.body.InvalidJSON: the body nests deeper than 2 levels
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.items()
        elif isinstance(item, list):
            children = ((None, child) for child in item)
        else:
            if check_text and isinstance(item, str):
                _check_text(item, what)
            continue
        if depth >= max_depth:
            raise InvalidJSON(f"{what} nests deeper than {max_depth} levels")
        for key, child in children:
            if check_text and key is not None:
                _check_text(key, what)
            if isinstance(child, dict | list) or (check_text and isinstance(child, str)):
                stack.append((child, depth + 1))


def _check_text(text: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidJSON(
            f"{what} holds a lone UTF-16 surrogate (an escape such as \\ud800 without its "
            "pair): not valid Unicode text"
        ) from None


def _problem(what: str, exc: Exception, max_depth: int) -> str:
    if "depth" in str(exc):
        return f"{what} nests deeper than {max_depth} levels"
    return (
        f"{what} is not valid JSON: it holds a lone UTF-16 surrogate (an escape such as "
        "\\ud800 without its pair)"
    )


def _short(exc: Exception, fallback: Exception) -> str:
    if isinstance(fallback, RecursionError):
        return "nested too deeply"
    return str(exc)


async def read_body(request: Request, max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> bytes:
    """The request's body bytes, read once (``BodyLimit``'s copy when it ran); 413 over the
    limit.

    Example:
        >>> raw = await read_body(request)  # fragment: a Starlette `request`  # doctest: +SKIP
    """
    body = request.scope.get(BODY_SCOPE_KEY)
    if body is None:
        body = await request.body()
        if len(body) > max_bytes:
            raise APIError(413, too_large_message(max_bytes), code="request_too_large")
    return bytes(body)


def parse_json_object(raw: bytes | str, *, what: str = "the body") -> dict[str, Any]:
    """``raw`` as a JSON object (see ``parse_json``); ``APIError`` 400 otherwise.

    Example:
        >>> parse_json_object(b'{"model": "m"}')
        {'model': 'm'}
    """
    try:
        payload = parse_json(raw, what=what)
    except InvalidJSON as exc:
        raise APIError(400, str(exc)) from None
    if not isinstance(payload, dict):
        raise APIError(400, f"{what} must be a JSON object")
    return payload


async def read_json_object(
    request: Request, max_bytes: int = DEFAULT_MAX_BODY_BYTES
) -> dict[str, Any]:
    """The request's body as a JSON object; ``APIError`` 400/413 otherwise.

    Example:
        >>> payload = await read_json_object(request)  # fragment: a Starlette `request`  # doctest: +SKIP
    """
    return parse_json_object(await read_body(request, max_bytes))
