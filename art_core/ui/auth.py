"""Token authentication a browser can use: the viewer off loopback, and under ``/ui`` of
``art-core serve``.

A browser cannot add an ``Authorization`` header to a link, so besides the header (and
``x-api-key``) the token is taken once from the address (``/?token=...``), which sets an
``HttpOnly``, ``SameSite=Strict`` cookie and redirects to the same address without it: the
token does not stay in the address bar or the history.
"""

from __future__ import annotations

from http.cookies import SimpleCookie
from urllib.parse import parse_qsl, urlencode

from starlette.types import ASGIApp, Receive, Scope, Send

from art_core.server.auth import bearer_token, token_matches

COOKIE = "art_core_ui_token"
_LOGIN_PAGE = (
    "<!doctype html><meta charset=utf-8><title>art-core ui</title>"
    "<p>This viewer needs its token. Open this address with <code>?token=TOKEN</code> "
    "appended (the token <code>art-core ui</code> or <code>art-core serve</code> printed, or "
    "the one given with <code>--token</code> / <code>$ART_CORE_TOKEN</code>).</p>"
)


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
        >>> app = BrowserTokenAuth(build_ui_app(".art"), token="s3cret")  # doctest: +SKIP
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
            root, path = scope.get("root_path", ""), scope.get("path", "/")
            # ASGI servers put the mount prefix in both root_path and path; some only in one.
            path = path if path.startswith(root) else root + path
            location = path + (f"?{rest}" if rest else "")
            cookie_path = scope.get("root_path", "") or "/"
            await send(
                {
                    "type": "http.response.start",
                    "status": 303,
                    "headers": [
                        (b"location", location.encode("latin-1", "replace")),
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
