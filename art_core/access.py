"""Who may reach a local HTTP service: bearer tokens and loopback hosts.

Shared by ``art-core serve`` (``server/``) and the viewer (``ui/``), which sit one above the
other; it lives below both so that neither imports the other for it.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets


def bearer_token(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or else of an ``x-api-key``
    header (what Anthropic's clients send), if any.

    Example:
        >>> bearer_token([(b"authorization", b"Bearer abc")])
        'abc'
        >>> bearer_token([(b"x-api-key", b"abc")])
        'abc'
    """
    api_key = None
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
        elif name == b"x-api-key" and value.strip():
            api_key = value.decode("latin-1").strip()
    return api_key


def token_matches(given: str | None, expected: str) -> bool:
    """Constant-time comparison, so response timing does not leak the token's prefix."""
    if given is None:
        return False
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost", "ip6-loopback"})


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine.

    Example:
        >>> is_loopback("127.0.0.1"), is_loopback("::1"), is_loopback("0.0.0.0")
        (True, True, False)
    """
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a hostname resolving to who knows what: treat as public


def new_token() -> str:
    """A fresh bearer token (256 bits, URL-safe).

    Example:
        >>> len(new_token()) >= 43
        True
    """
    return secrets.token_urlsafe(32)
