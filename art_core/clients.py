"""OpenAI clients for our endpoints, cheap enough to make one per rollout.

A new ``openai.AsyncOpenAI`` builds a fresh httpx client, and with it a TLS context that loads
the CA bundle: ~20 ms each, which for a batch of rollouts that each open a client adds up to a
visible delay before the first request reaches the engine. The TLS context is immutable once
built, so every client made here shares one (built on first use); everything else (connection
pool, timeouts) stays per client.

``SharedOpenAIClient`` is what ``model.openai_client()`` hands out: one client for as long as
the endpoint and event loop stay the same, as OpenPipe ART's, so that code asking for it in
every rollout does not leave a connection pool open per call.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import threading
import weakref
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


class SharedOpenAIClient:
    """One ``openai.AsyncOpenAI`` handed out again for the same endpoint, key and event loop.

    OpenPipe ART's ``model.openai_client()`` returns the same client on every call, and ART
    code asks for it in every rollout: a new client per call would leave a connection pool
    (and its open keep-alive sockets) behind each one until garbage collection. A new client
    is made when the endpoint or key changed (the model registered elsewhere), when the last
    one was closed (``async with model.openai_client() as client``), and when it is asked for
    from another event loop than the one it was made on (an httpx pool's connections belong
    to the loop that opened them; a second ``asyncio.run`` must not reuse them). Copies and
    pickles start empty: a client's connections are not data.

    Example:
        >>> shared = SharedOpenAIClient()
        >>> first = shared.get("http://127.0.0.1:8000/v1", "art")
        >>> shared.get("http://127.0.0.1:8000/v1", "art") is first
        True
        >>> shared.get("http://127.0.0.1:9000/v1", "art") is first
        False
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # openai_client() is sync: threads may ask at once
        self._client: AsyncOpenAI | None = None
        self._endpoint: tuple[str, str] | None = None
        # The loop the client was made on (weakly: a closed loop may go), None: made outside one.
        self._loop: weakref.ref[asyncio.AbstractEventLoop] | None = None

    def get(self, base_url: str, api_key: str) -> AsyncOpenAI:
        """The shared client for ``base_url`` and ``api_key`` in the running event loop (or
        outside any), made on first use."""
        loop = _running_loop()
        with self._lock:
            client = self._client
            if (
                client is not None
                and not client.is_closed()
                and self._endpoint == (base_url, api_key)
                and self._made_on(loop)
            ):
                return client
            client = async_openai_client(base_url, api_key)
            self._client, self._endpoint = client, (base_url, api_key)
            self._loop = None if loop is None else weakref.ref(loop)
            return client

    async def aclose(self) -> None:
        """Close the client held (its connections), where it was made on this event loop or
        outside any; forget it either way (a loop that is gone took its connections along).
        The next ``get`` makes a new one."""
        with self._lock:
            client, made_here = self._client, self._loop is None or self._made_on(_running_loop())
            self._client = self._endpoint = self._loop = None
        if client is not None and made_here:
            try:
                await client.close()
            except RuntimeError:  # its connections were opened on a loop that is gone
                pass

    def _made_on(self, loop: asyncio.AbstractEventLoop | None) -> bool:
        if self._loop is None:
            return loop is None
        return loop is not None and self._loop() is loop

    # Not data: two models that differ only in the clients they made are equal (pydantic
    # compares private attributes too).
    def __eq__(self, other: object) -> bool:
        return isinstance(other, SharedOpenAIClient)

    def __hash__(self) -> int:
        return hash(SharedOpenAIClient)

    def __copy__(self) -> SharedOpenAIClient:
        return SharedOpenAIClient()

    def __deepcopy__(self, memo: dict[int, Any]) -> SharedOpenAIClient:
        return SharedOpenAIClient()

    def __reduce__(self) -> tuple[type[SharedOpenAIClient], tuple[()]]:
        return (SharedOpenAIClient, ())


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
