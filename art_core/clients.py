"""OpenAI clients for our endpoints, cheap enough to make one per rollout.

A new ``openai.AsyncOpenAI`` builds a fresh httpx client, and with it a TLS context that loads
the CA bundle: ~20 ms each, which for a batch of rollouts that each open a client adds up to a
visible delay before the first request reaches the engine. The TLS context is immutable once
built, so every client made here shares one (built on first use); everything else (connection
pool, timeouts) stays per client.
"""

from __future__ import annotations

import functools
import ssl
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from openai import AsyncOpenAI, OpenAI


@functools.cache
def shared_ssl_context() -> ssl.SSLContext:
    """The TLS context (httpx's defaults: certifi CA bundle) shared by our clients."""
    import httpx

    return httpx.create_ssl_context()


def async_openai_client(base_url: str, api_key: str, **kwargs: Any) -> AsyncOpenAI:
    """An ``openai.AsyncOpenAI`` for ``base_url``; ``kwargs`` go to its constructor.

    Example:
        >>> client = async_openai_client("http://127.0.0.1:8000/v1", "art")
        >>> str(client.base_url)
        'http://127.0.0.1:8000/v1/'
    """
    from openai import AsyncOpenAI, DefaultAsyncHttpxClient

    if "http_client" not in kwargs:
        kwargs["http_client"] = DefaultAsyncHttpxClient(verify=shared_ssl_context())
    return AsyncOpenAI(base_url=base_url, api_key=api_key, **kwargs)


def sync_openai_client(base_url: str, api_key: str, **kwargs: Any) -> OpenAI:
    """The synchronous ``openai.OpenAI`` equivalent of ``async_openai_client``.

    Example:
        >>> str(sync_openai_client("http://127.0.0.1:8000/v1", "art").base_url)
        'http://127.0.0.1:8000/v1/'
    """
    from openai import DefaultHttpxClient, OpenAI

    if "http_client" not in kwargs:
        kwargs["http_client"] = DefaultHttpxClient(verify=shared_ssl_context())
    return OpenAI(base_url=base_url, api_key=api_key, **kwargs)
