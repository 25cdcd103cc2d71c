"""An engine reached over HTTP with the token-id completion protocol.

The protocol is the subset of vLLM's OpenAI server the gateway needs: ``POST
/v1/completions`` with a token-id prompt, ``return_token_ids`` and raw logprobs (SSE when
streaming), ``POST /v1/load_lora_adapter`` / ``/v1/unload_lora_adapter``, ``GET /health``.
A vLLM server speaks it (``VLLMEngine``) and so does an engine worker process
(``engines/worker.py``, ``WorkerEngine``): whichever engine runs behind the URL, the gateway
talks to it the same way and records the same ``LLMCall``.

Pause and drain happen on this side (new calls wait, in-flight ones finish), so they work
the same for any server. A server that dies or stops answering fails the calls it had with
``EngineUnavailable`` (503 at the gateway); nothing of them is recorded.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx

from art_core.engines.base import (
    AdapterInfo,
    AdapterRegistry,
    EngineError,
    EngineUnavailable,
    GenerationRequest,
    GenerationResult,
    PromptLogprob,
    SamplingParams,
    ServesAdapters,
    check_request,
)
from art_core.engines.prompt_logprobs import from_wire

BASE_NAME = "base"
# Answers larger than this are parsed on a worker thread, and prompt scores of more entries
# read there: either takes milliseconds the event loop's other calls should not wait for.
INLINE_JSON_BYTES = 1 << 20
INLINE_SCORED_ENTRIES = 20_000


class HTTPEngine(ServesAdapters):
    """The client side of an engine server at ``url`` (set by the subclass that starts it).

    Example:
        >>> engine = HTTPEngine(max_loras=4)
        >>> engine.url = "http://127.0.0.1:8000"  # a server already running  # needs a network service: an engine server there  # doctest: +SKIP
        >>> await engine.connect()  # needs a network service  # doctest: +SKIP
    """

    def __init__(self, *, max_loras: int = 4, name: str = "engine server") -> None:
        self.name = name
        self.url = ""
        self.tokenizer: Any = None
        self.context_length = 0
        self.vocab_size: int | None = None
        self._eos_ids: set[int] = set()
        self._adapters = AdapterRegistry(max_loras, base_name=BASE_NAME)
        self._client: httpx.AsyncClient | None = None
        self._running = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._inflight = 0

    # ----------------------------------------------------------------------------- lifecycle
    async def connect(self) -> None:
        """Open the HTTP client to ``url`` and start serving."""
        if self._client is None:
            # Each call may sample for minutes: no read timeout; connecting must be quick.
            self._client = httpx.AsyncClient(
                base_url=self.url,
                timeout=httpx.Timeout(None, connect=10),
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            )
        self._running.set()

    async def disconnect(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    @property
    def in_flight(self) -> int:
        """Calls sent to the server and not answered yet."""
        return self._inflight

    # ----------------------------------------------------------------------------- adapters
    @property
    def max_loras(self) -> int:
        """How many adapters stay loaded on the server (the oldest is unloaded beyond it)."""
        return self._adapters.capacity

    @max_loras.setter
    def max_loras(self, value: int) -> None:
        self._adapters.capacity = value

    @property
    def eos_token_ids(self) -> set[int]:
        return set(self._eos_ids)

    def _load_body(self, name: str, path: Path, step: int) -> dict[str, Any]:
        return {"lora_name": name, "lora_path": str(path)}

    async def load_adapter(self, path: Path, step: int, *, name: str | None = None) -> None:
        """Load an adapter folder on the server (each step has its own folder: vLLM reloading
        one folder in place would serve stale prefix-cache entries) and serve it by default."""
        if not (Path(path) / "adapter_config.json").is_file():
            raise EngineError(f"{path} is not a PEFT adapter folder (no adapter_config.json)")
        name = name or f"step-{step}"
        if name in self._adapters:
            await self._post("/v1/unload_lora_adapter", {"lora_name": name})
            self._adapters.remove(name)
        await self._post("/v1/load_lora_adapter", self._load_body(name, Path(path), step))
        for evicted in self._adapters.add(AdapterInfo(name=name, step=step, path=Path(path))):
            await self._post("/v1/unload_lora_adapter", {"lora_name": evicted.name})

    async def _post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        if self._client is None:
            raise EngineError(f"the {self.name} is not started")
        try:
            response = await self._client.post(path, json=body)
        except httpx.TransportError as exc:
            raise EngineUnavailable(f"the {self.name} did not answer {path}: {exc!r}") from exc
        if response.status_code >= 400:
            raise EngineError(
                f"the {self.name} answered {path} with {response.status_code}: "
                f"{response.text[:500]}"
            )
        return response

    # ----------------------------------------------------------------------------- pause
    async def pause(self) -> None:
        """Hold new requests and let the ones in flight finish."""
        self._running.clear()
        await self._idle.wait()

    async def resume(self) -> None:
        self._running.set()

    # ----------------------------------------------------------------------------- requests
    def _body(self, request: GenerationRequest, adapter: AdapterInfo | None) -> dict[str, Any]:
        params: SamplingParams = request.params
        body: dict[str, Any] = {
            "model": adapter.name if adapter and adapter.step else BASE_NAME,
            "prompt": request.prompt_token_ids,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k if params.top_k > 0 else -1,
            "n": params.n,
            "seed": params.seed,
            "stop": params.stop,
            "logprobs": max(1, params.top_logprobs),
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
            "add_special_tokens": False,
        }
        if params.grammar is not None:
            body["structured_outputs"] = {"grammar": params.grammar}
        if params.prompt_logprobs is not None:
            body["prompt_logprobs"] = params.prompt_logprobs
        return body

    def check(self, request: GenerationRequest) -> None:
        """``EngineError`` for a request this server would refuse, before a round trip."""
        check_request(request, self.vocab_size)
        prompt_len = len(request.prompt_token_ids)
        if prompt_len + request.params.max_tokens > self.context_length:
            raise EngineError(
                f"the prompt has {prompt_len} tokens and max_tokens is {request.params.max_tokens}, "
                f"more than the context length {self.context_length}"
            )
        if request.params.prompt_logprobs is not None and request.on_tokens is not None:
            # vLLM answers prompt logprobs in whole answers only.
            raise EngineError("prompt_logprobs cannot be streamed")

    async def generate(self, request: GenerationRequest) -> list[GenerationResult]:
        if self._client is None:
            raise EngineError(f"the {self.name} is not started")
        # The server refuses a bad value for that request alone; these are refused here too,
        # before a round trip (and whatever server version runs).
        self.check(request)
        await self._running.wait()
        adapter = (
            self._adapters.current
            if request.adapter is None
            else self._adapters.get(request.adapter)
        )
        self._inflight += 1
        self._idle.clear()
        try:
            body = self._body(request, adapter)
            try:
                if request.on_tokens is None:
                    response = await self._client.post("/v1/completions", json=body)
                    self._raise_for_status(response.status_code, response.text)
                    if len(response.content) > INLINE_JSON_BYTES:  # scored prompts: MBs
                        choices = (await asyncio.to_thread(response.json))["choices"]
                    else:
                        choices = response.json()["choices"]
                else:
                    choices = await self._stream(body, request)
            except httpx.TransportError as exc:
                raise EngineUnavailable(
                    f"the {self.name} stopped answering during the call ({type(exc).__name__})"
                ) from exc
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.set()
        step = adapter.step if adapter else 0
        ordered = sorted(choices, key=lambda c: c["index"])
        results = [self._result(choice, step) for choice in ordered]
        scoring = request.params.prompt_logprobs
        if scoring is not None:
            if len(request.prompt_token_ids) * (scoring + 1) > INLINE_SCORED_ENTRIES:
                scored = await asyncio.to_thread(self._prompt_logprobs, ordered, request)
            else:
                scored = self._prompt_logprobs(ordered, request)
            for result in results:
                result.prompt_logprobs = scored
        return results

    def _prompt_logprobs(
        self, choices: list[dict[str, Any]], request: GenerationRequest
    ) -> list[PromptLogprob | None]:
        """The prompt's scores in an answer (vLLM repeats them in every choice: the first
        is read); ``EngineError`` when the server sent none or sent them malformed."""
        value = choices[0].get("prompt_logprobs") if choices else None
        if value is None:
            raise EngineError(
                f"the {self.name} answered without prompt_logprobs: it does not score prompts"
            )
        k = request.params.prompt_logprobs or 0
        try:
            return from_wire(value, request.prompt_token_ids, k)
        except ValueError as exc:
            raise EngineError(f"the {self.name} sent malformed prompt_logprobs: {exc}") from None

    def _raise_for_status(self, status: int, text: str) -> None:
        if status == 503:
            raise EngineUnavailable(f"the {self.name} is unavailable: {text[:500]}")
        if status >= 500:  # the server failed (its engine core died, a model it cannot run)
            raise EngineUnavailable(
                f"the {self.name} failed while serving the call (HTTP {status}): {text[:500]}"
            )
        if status >= 400:
            raise EngineError(f"the {self.name} rejected the request: {text[:500]}")

    async def _stream(
        self, body: dict[str, Any], request: GenerationRequest
    ) -> list[dict[str, Any]]:
        """Stream, reporting ids as they come; reassemble choices like a non-stream reply."""
        assert self._client is not None and request.on_tokens is not None
        merged: dict[int, dict[str, Any]] = {}
        async with self._client.stream(
            "POST", "/v1/completions", json={**body, "stream": True}
        ) as response:
            if response.status_code >= 400:
                self._raise_for_status(
                    response.status_code, (await response.aread()).decode(errors="replace")
                )
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    error = chunk["error"]
                    self._raise_for_status(int(error.get("code") or 500), str(error.get("message")))
                for choice in chunk.get("choices", []):
                    into = merged.setdefault(
                        choice["index"],
                        {
                            "index": choice["index"],
                            "token_ids": [],
                            "finish_reason": None,
                            "stop_reason": None,
                            "logprobs": {"tokens": [], "token_logprobs": [], "top_logprobs": []},
                        },
                    )
                    ids = choice.get("token_ids") or []
                    into["token_ids"] += ids
                    logprobs = choice.get("logprobs") or {}
                    for key in ("tokens", "token_logprobs", "top_logprobs"):
                        into["logprobs"][key] += logprobs.get(key) or []
                    into["finish_reason"] = choice.get("finish_reason") or into["finish_reason"]
                    into["stop_reason"] = choice.get("stop_reason", into["stop_reason"])
                    if ids:
                        request.on_tokens(choice["index"], list(ids))
        unfinished = [i for i, choice in merged.items() if choice["finish_reason"] is None]
        if unfinished or not merged:
            # The stream ended without every choice's end: the server went away mid-answer.
            raise EngineUnavailable(f"the {self.name} ended the stream before the answer did")
        return list(merged.values())

    @staticmethod
    def _token_id(token: str) -> int:
        return int(token.removeprefix("token_id:"))

    def _result(self, choice: dict[str, Any], step: int) -> GenerationResult:
        logprobs = choice.get("logprobs") or {}
        top = [
            sorted(
                ((self._token_id(t), float(v)) for t, v in (alternatives or {}).items()),
                key=lambda p: -p[1],
            )
            for alternatives in logprobs.get("top_logprobs") or []
        ]
        stop_reason = choice.get("stop_reason")
        return GenerationResult(
            choice_index=int(choice["index"]),
            token_ids=[int(t) for t in choice.get("token_ids") or []],
            logprobs=[float(v) for v in logprobs.get("token_logprobs") or []],
            finish_reason="length" if choice.get("finish_reason") == "length" else "stop",
            adapter_step=step,
            top_logprobs=top,
            stop_string=stop_reason if isinstance(stop_reason, str) else None,
        )
