"""``WorkerEngine``: an engine worker process (``engines/worker.py``), started, watched and
restarted from the gateway's side, reached over the token-id completion protocol.

While the worker runs, calls go to it over HTTP (``HTTPEngine``). When it dies (its process
exits, its port refuses connections, its health check answers from another process, or it
stops answering for ``unresponsive_after_s``), the calls it had fail with
``EngineUnavailable`` (503, nothing recorded), ``available`` turns false so a router sends
new calls elsewhere, and it is brought back with every adapter it served, in order; then it
is available again. Adapters loaded while it is down are loaded when it comes back. The
watch loop (``WorkerClient._watch``) is shared by every way of running a worker; how a
worker is found gone and brought back is each one's own (``_gone``, ``_recover``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from art_core.clients import shared_ssl_context
from art_core.engines.base import (
    AdapterInfo,
    EngineError,
    EngineUnavailable,
    GenerationRequest,
    GenerationResult,
)
from art_core.engines.http_engine import HTTPEngine
from art_core.engines.process import ServerProcess, free_port
from art_core.engines.tokenizer import ChatTokenizer, load_chat_tokenizer

logger = logging.getLogger(__name__)


def _figures(response: httpx.Response, most: int = 64) -> dict[str, float]:
    """The health answer's ``metrics``: names to finite numbers, at most ``most`` of them
    (a worker is ours, but what crosses a socket is checked before it is kept)."""
    try:
        raw = response.json().get("metrics")
    except (ValueError, AttributeError):
        return {}
    if not isinstance(raw, dict):
        return {}
    out: dict[str, float] = {}
    for name, value in list(raw.items())[:most]:
        if (
            isinstance(name, str)
            and len(name) <= 128
            and isinstance(value, int | float)
            and not isinstance(value, bool)
            and math.isfinite(value)
        ):
            out[name] = float(value)
    return out


# How long a worker that compiles its decode step at start (``compile_decode``) may take to
# answer its health check, at least: the compile and its check against the eager step take
# 80 s for a 135M model on 2 CPU cores with an empty compile cache, several times that for a
# larger model or a worker given one core.
COMPILING_STARTUP_TIMEOUT_S = 1200.0


def startup_timeout(given_s: float, compile_decode: bool) -> float:
    """How long a worker may take to answer its first health check: ``given_s``, at least
    ``COMPILING_STARTUP_TIMEOUT_S`` when it compiles its decode step at start.

    Example:
        >>> startup_timeout(300.0, False), startup_timeout(300.0, True)
        (300.0, 1200.0)
    """
    return max(given_s, COMPILING_STARTUP_TIMEOUT_S) if compile_decode else given_s


class WorkerClient(HTTPEngine):
    """What the gateway's side of any engine worker does, however the worker is run (a
    child process, a Ray actor): calls only while it is ready, adapters remembered while it
    is down and loaded again, in order, when it is back; the exact top-logprob count."""

    def __init__(
        self,
        *,
        max_loras: int,
        name: str,
        health_interval_s: float = 1.0,
        unresponsive_after_s: float = 60.0,
    ) -> None:
        super().__init__(max_loras=max_loras, name=name)
        self.health_interval_s = health_interval_s
        self.unresponsive_after_s = unresponsive_after_s
        self._ready = asyncio.Event()
        self._check_soon = asyncio.Event()  # a call could not connect: probe now
        self._watcher: asyncio.Task[None] | None = None
        self._closing = False
        self.restarts = 0
        # The worker engine's own figures (prefix cache, prefill), as its last health said.
        self.engine_metrics: dict[str, float] = {}

    # ----------------------------------------------------------------------------- watching
    def _gone(self) -> str | None:
        """Why the worker is known to be gone without asking it (None: ask its health)."""
        return None

    def _expected_pid(self) -> int | None:
        """The pid the worker's health check must report (None: any)."""
        return None

    async def _recover(self, hung: bool) -> None:
        """Bring the worker back with its adapters (``hung``: it still runs but does not
        answer, so it must be stopped first). Returns once it serves again, or on close."""
        raise NotImplementedError

    async def _probe(self, client: httpx.AsyncClient) -> tuple[bool, str | None]:
        """Ask the worker's health: (answered, why it is gone). A refused connection (nothing
        listens on its port) or an answer from another process means gone at once; a
        timeout or an error status only counts towards ``unresponsive_after_s``."""
        try:
            response = await client.get(
                f"{self.url}/health", timeout=max(1.0, self.health_interval_s * 5)
            )
        except httpx.ConnectError:
            return False, "refuses connections"
        except httpx.HTTPError:
            return False, None
        if response.status_code != 200:
            return False, None
        expected = self._expected_pid()
        try:
            pid = response.json().get("pid")
        except (ValueError, AttributeError):
            pid = None
        if expected is not None and isinstance(pid, int) and pid != expected:
            # e.g. restarted in place on the same port, without the adapters it served
            return False, f"answers from another process (pid {pid}, not {expected})"
        self.engine_metrics = _figures(response)
        return True, None

    async def refresh_metrics(self) -> None:
        """Ask the worker's health now for its figures (``engine_metrics``), rather than
        read them as of the last check (up to ``health_interval_s`` old). A worker that does
        not answer keeps its last figures; watching it is ``_watch``'s business."""
        if not self._ready.is_set():
            return
        async with httpx.AsyncClient(verify=shared_ssl_context()) as client:
            await self._probe(client)

    async def _watch(self) -> None:
        """Bring the worker back whenever it is gone or stops answering its health check."""
        last_answer = time.monotonic()
        async with httpx.AsyncClient(verify=shared_ssl_context()) as probe:
            while not self._closing:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._check_soon.wait(), self.health_interval_s)
                self._check_soon.clear()
                reason = self._gone()
                hung = False
                if reason is None:
                    answered, reason = await self._probe(probe)
                    if answered:
                        last_answer = time.monotonic()
                        continue
                    if reason is None:
                        silent = time.monotonic() - last_answer
                        if silent < self.unresponsive_after_s:
                            continue
                        reason, hung = f"did not answer its health check for {silent:.0f} s", True
                if self._closing:
                    return
                self._ready.clear()
                logger.warning("%s %s; bringing it back", self.name, reason)
                await self._recover(hung)
                last_answer = time.monotonic()

    async def _stop_watching(self) -> None:
        """Closing: no more calls, no more restarts, the HTTP client closed."""
        self._closing = True
        self._ready.clear()
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None
        await self.disconnect()

    @property
    def available(self) -> bool:
        """Whether calls may be sent here now."""
        return self._ready.is_set()

    def _load_body(self, name: str, path: Path, step: int) -> dict[str, Any]:
        return {"lora_name": name, "lora_path": str(path), "step": step}

    async def _reload_adapters(self) -> None:
        """Load every remembered adapter on a worker that came back, in order (the newest
        stays the default)."""
        for info in self._adapters.all():
            path = Path(str(info.path))
            await self._post("/v1/load_lora_adapter", self._load_body(info.name, path, info.step))

    async def load_adapter(self, path: Path, step: int, *, name: str | None = None) -> None:
        """Load the adapter on the worker and serve it by default; while the worker is down
        it is only remembered, and loaded when the worker is back (before any call)."""
        if not (Path(path) / "adapter_config.json").is_file():
            raise EngineError(f"{path} is not a PEFT adapter folder (no adapter_config.json)")
        if self.available:
            try:
                await super().load_adapter(path, step, name=name)
                return
            except EngineUnavailable:
                pass  # died meanwhile: remembered below, loaded by the restart
        info = AdapterInfo(name=name or f"step-{step}", step=step, path=Path(path))
        for evicted in self._adapters.add(info):
            logger.debug("%s forgets adapter %s", self.name, evicted.name)

    def _body(self, request: GenerationRequest, adapter: AdapterInfo | None) -> dict[str, Any]:
        return {**super()._body(request, adapter), "top_logprobs": request.params.top_logprobs}

    async def generate(self, request: GenerationRequest) -> list[GenerationResult]:
        if not self._ready.is_set():
            raise EngineUnavailable(f"the {self.name} is restarting")
        try:
            return await super().generate(request)
        except EngineUnavailable as exc:
            if isinstance(exc.__cause__, httpx.TransportError):
                self._check_soon.set()  # do not wait for the next health tick to find out
            raise


class WorkerEngine(WorkerClient):
    """The transformers engine in its own process, pinned to ``cpus`` / ``threads`` or to a
    ``device``.

    Example:
        >>> engine = WorkerEngine(Path(".art/base_models/tiny-random"), log_dir=Path("logs"),
        ...                       cpus=[0], threads=1)
        >>> await engine.start()  # starts a server: a worker process serving the model  # doctest: +SKIP
    """

    def __init__(
        self,
        model_path: Path,
        *,
        log_dir: Path,
        index: int = 0,
        device: str | None = None,
        dtype: str | None = None,
        threads: int | None = None,
        cpus: list[int] | None = None,
        max_batch_size: int = 32,
        max_loras: int = 4,
        chat: ChatTokenizer | None = None,
        prefix_cache_bytes: int | None = None,
        compile_decode: bool = False,
        startup_timeout_s: float = 300.0,
        unresponsive_after_s: float = 60.0,
        health_interval_s: float = 1.0,
    ) -> None:
        super().__init__(
            max_loras=max_loras,
            name=f"engine worker {index}",
            health_interval_s=health_interval_s,
            unresponsive_after_s=unresponsive_after_s,
        )
        self.model_path = Path(model_path)
        self.log_dir = Path(log_dir)
        self.index = index
        self.device = device
        self.dtype = dtype
        self.threads = threads
        self.cpus = list(cpus) if cpus else None
        self.max_batch_size = max_batch_size
        self.prefix_cache_bytes = prefix_cache_bytes
        self.compile_decode = compile_decode
        self.startup_timeout_s = startup_timeout(startup_timeout_s, compile_decode)
        self._chat = chat
        self._server: ServerProcess | None = None
        self.started_at = 0.0

    # ----------------------------------------------------------------------------- lifecycle
    @property
    def available(self) -> bool:
        """Whether calls may be sent here now (the process runs and answered its health)."""
        return self._ready.is_set() and self._server is not None and self._server.alive()

    @property
    def pid(self) -> int | None:
        return self._server.pid if self._server is not None else None

    def _command(self, port: int) -> list[str]:
        command = [
            sys.executable,
            "-m",
            "art_core.engines.worker",
            "--model",
            str(self.model_path),
            "--port",
            str(port),
            "--max-batch-size",
            str(self.max_batch_size),
            # Never evicts on its own: this side decides what stays loaded (and unloads).
            "--max-loras",
            str(self.max_loras + 1),
        ]
        for flag, value in (("--device", self.device), ("--dtype", self.dtype)):
            if value:
                command += [flag, value]
        if self.threads:
            command += ["--threads", str(self.threads)]
        if self.prefix_cache_bytes is not None:
            command += ["--prefix-cache-bytes", str(self.prefix_cache_bytes)]
        if self.compile_decode:
            command += ["--compile-decode"]
        if self.cpus:
            command += ["--cpus", ",".join(str(c) for c in self.cpus)]
        return command

    async def start(self) -> None:
        chat = self._chat
        if chat is None:
            chat = await asyncio.to_thread(load_chat_tokenizer, self.model_path)
        self.tokenizer = chat.tokenizer
        self._eos_ids = chat.eos_token_ids
        self.context_length = chat.context_length
        self.vocab_size = None  # the worker checks ids against its model's vocabulary
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self._server = ServerProcess(
            self._command(port),
            self.log_dir / f"engine-worker-{self.index}.log",
            url=self.url,
            label=self.name,
        )
        await self._launch()
        await self.connect()
        self._watcher = asyncio.create_task(self._watch(), name=f"art-{self.name}-watch")

    async def _launch(self) -> None:
        assert self._server is not None
        await self._server.start()
        await self._server.wait_ready("/health", within_s=self.startup_timeout_s)
        self.started_at = time.monotonic()
        self._ready.set()
        logger.info("%s serving at %s (pid %s)", self.name, self.url, self._server.pid)

    async def close(self) -> None:
        await self._stop_watching()
        if self._server is not None:
            await self._server.stop()

    def kill(self) -> None:
        """SIGKILL the worker now (a crash; it is restarted like one)."""
        if self._server is not None:
            self._server.kill()

    # ----------------------------------------------------------------------------- watching
    def _gone(self) -> str | None:
        if self._server is not None and not self._server.alive():
            return f"exited (code {self._exit_code()})"
        return None

    def _expected_pid(self) -> int | None:
        return self.pid

    async def _recover(self, hung: bool) -> None:
        if self._server is not None and self._server.alive():
            self._server.kill()  # hung, or its server is gone while the process lingers
        await self._restart()

    def _exit_code(self) -> Any:
        process = self._server.process if self._server is not None else None
        return process.returncode if process is not None else None

    async def _restart(self) -> None:
        self._ready.clear()
        assert self._server is not None
        await self._server.stop(grace_s=5)
        self.restarts += 1
        while not self._closing:
            try:
                await self._server.start()
                await self._server.wait_ready("/health", within_s=self.startup_timeout_s)
                await self._reload_adapters()
            except EngineError as exc:
                logger.warning("%s could not restart: %s; trying again", self.name, exc)
                await self._server.stop(grace_s=5)
                await asyncio.sleep(1.0)
                continue
            self.started_at = time.monotonic()
            self._ready.set()
            logger.info("%s restarted (pid %s)", self.name, self._server.pid)
            return
