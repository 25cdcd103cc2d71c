"""Token authentication a browser can use: the viewer off loopback, and under ``/ui`` of
``art-core serve``.

A browser cannot add an ``Authorization`` header to a link, so besides the header (and
``x-api-key``) the token is taken once from the address (``/?token=...``), which sets an
``HttpOnly``, ``SameSite=Strict`` cookie and redirects to the same address without it: the
token does not stay in the address bar or the history. That redirect goes to the path as
received, kept under the viewer's root (never another host: ``//evil.example/`` becomes
``/evil.example/``); a path holding a control character is refused (400) rather than echoed
into a header.
"""

from __future__ import annotations

import re
from http.cookies import SimpleCookie
from urllib.parse import parse_qsl, quote, unquote, urlencode

from starlette.types import ASGIApp, Receive, Scope, Send

from art_core.access import bearer_token, token_matches
from art_core.gateway.errors import error_body, send_json, shown_path

COOKIE = "art_core_ui_token"
_LOGIN_PAGE = (
    "<!doctype html><meta charset=utf-8><title>art-core ui</title>"
    "<p>This viewer needs its token. Open this address with <code>?token=TOKEN</code> "
    "appended (the token <code>art-core ui</code> or <code>art-core serve</code> printed, or "
    "the one given with <code>--token</code> / <code>$ART_CORE_TOKEN</code>).</p>"
)


# What a path may hold besides letters and digits (RFC 3986's pchar, and '/'); the rest
# (a backslash, a space, a quote, a byte past ASCII) is percent-encoded in the redirect.
_PATH_SAFE = "/-._~!$&'()*+,;=:@%"
# C0 controls and DEL: never in a header, never in a path we send back.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class UnsafePath(ValueError):
    """A login path that cannot be sent back in ``Location`` (it holds a control character)."""


def login_location(scope: Scope, query: str) -> str:
    """Where a login redirects: the path as received (percent-encoding kept), a same-origin
    path under the viewer's root, plus ``query``.

    Leading ``/`` and ``\\`` after the root collapse to one ``/`` (``//host/`` and
    ``/\\host/`` would name another host), dot segments never climb above the root, and a
    path holding a control character (raw or percent-encoded) raises ``UnsafePath``.

    Example:
        >>> login_location({"raw_path": b"//evil.example/a", "root_path": ""}, "")
        '/evil.example/a'
        >>> login_location({"raw_path": b"/ui/run/x", "root_path": "/ui"}, "x=1")
        '/ui/run/x?x=1'
    """
    root = str(scope.get("root_path", "")).rstrip("/")
    raw = scope.get("raw_path")
    if isinstance(raw, bytes | bytearray):
        received = bytes(raw).decode("latin-1")
    else:
        path = str(scope.get("path", "/"))
        # ASGI servers put the mount prefix in both root_path and path; some only in one.
        received = quote(path if path.startswith(root) else root + path, safe=_PATH_SAFE)
    if _CONTROL.search(received) or _CONTROL.search(unquote(received, errors="replace")):
        raise UnsafePath(unquote(received, errors="replace"))
    encoded_root = quote(root, safe=_PATH_SAFE)
    rest = received[len(encoded_root) :] if received.startswith(encoded_root) else received
    segments: list[str] = []
    for segment in re.split(r"[/\\]+", rest.lstrip("/\\")):
        name = unquote(segment)
        if not segment:
            continue
        if name == "..":
            if segments:
                segments.pop()
        elif name != ".":
            # latin-1: a byte past ASCII is sent back as the same byte, percent-encoded.
            segments.append(quote(segment, safe=_PATH_SAFE.replace("/", ""), encoding="latin-1"))
    location = encoded_root + "/" + "/".join(segments)
    if rest.endswith(("/", "\\")) and segments:
        location += "/"
    return location + (f"?{query}" if query else "")


def _cookie_token(scope: Scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"cookie":
            cookie: SimpleCookie = SimpleCookie()
            try:
                cookie.load(value.decode("latin-1"))
            except Exception:  # a malformed Cookie header: as if there were none
                return None
            if COOKIE in cookie:
                return cookie[COOKIE].value
    return None


class BrowserTokenAuth:
    """ASGI middleware: 401 unless the request carries the token (header, cookie, or once in
    the query string, which is turned into the cookie).

    Example:
        >>> from art_core.ui.app import build_ui_app
        >>> app = BrowserTokenAuth(build_ui_app(".art"), token="s3cret")
    """

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = scope.get("headers", [])
        if token_matches(bearer_token(headers), self.token) or token_matches(
            _cookie_token(scope), self.token
        ):
            await self.app(scope, receive, send)
            return
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        given = next((value for name, value in query if name == "token"), None)
        if token_matches(given, self.token):
            rest = urlencode([(name, value) for name, value in query if name != "token"])
            try:
                location = login_location(scope, rest)
            except UnsafePath as exc:
                refusal = error_body(
                    f"the address's path {shown_path(str(exc))} holds a control character: "
                    "it cannot be redirected to (open the viewer's address without it)",
                    type="invalid_request_error",
                    code="invalid_path",
                )
                await send_json(send, 400, refusal, {"cache-control": "no-store"})
                return
            cookie_path = scope.get("root_path", "") or "/"
            await send(
                {
                    "type": "http.response.start",
                    "status": 303,
                    "headers": [
                        (b"location", location.encode("ascii")),
                        (
                            b"set-cookie",
                            f"{COOKIE}={self.token}; HttpOnly; SameSite=Strict; "
                            f"Path={cookie_path}".encode("latin-1"),
                        ),
                        (b"cache-control", b"no-store"),
                        (b"referrer-policy", b"no-referrer"),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": b""})
            return
        body = _LOGIN_PAGE.encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"text/html; charset=utf-8"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b'Bearer realm="art-core ui"'),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
