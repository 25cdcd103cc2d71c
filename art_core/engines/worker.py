"""An engine worker: the transformers engine in a process of its own, served over HTTP with
the token-id completion protocol the gateway already speaks to vLLM (``http_engine.py``).

    python -m art_core.engines.worker --model DIR --port 8100 --cpus 0 --max-loras 4

So a replica is "an engine server", whichever engine runs it: the gateway reaches a worker
exactly as it reaches a vLLM server. ``WorkerEngine`` starts and restarts these processes
for ``LocalBackend(replicas=N)``; a Ray actor runs the same app (``ray_replicas.py``).

Routes: ``POST /v1/completions`` (token-id prompt; token ids, raw logprobs and finish
reason back, and vLLM's ``prompt_logprobs`` when asked; SSE when ``stream``), ``POST
/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` (adapters by path), ``GET /health``.
Bodies are validated before anything runs; an engine refusal is a 400 for that request alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from art_core.engines.base import (
    MAX_PROMPT_LOGPROBS,
    Engine,
    EngineError,
    EngineUnavailable,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
)
from art_core.engines.http_engine import BASE_NAME, INLINE_SCORED_ENTRIES
from art_core.engines.prompt_logprobs import to_wire

logger = logging.getLogger(__name__)
MAX_BODY_BYTES = 64 * 1024 * 1024


class Grammar(BaseModel):
    grammar: str = Field(max_length=4 * 1024 * 1024)


class CompletionBody(BaseModel):
    """The fields of vLLM's ``/v1/completions`` the gateway sends (others are ignored)."""

    model_config = ConfigDict(extra="ignore")

    model: str = BASE_NAME
    prompt: list[int] = Field(min_length=1, max_length=1_000_000)
    max_tokens: int = Field(16, ge=1, le=1_000_000)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1)
    n: int = Field(1, ge=1, le=1024)
    seed: int | None = None
    stop: list[str] = Field(default_factory=list, max_length=64)
    logprobs: int = Field(1, ge=0, le=1024)
    # How many alternatives per token to return (vLLM's ``logprobs`` also sets it; the
    # gateway's own client sends this so a worker returns exactly what was asked).
    top_logprobs: int | None = Field(None, ge=0, le=1024)
    structured_outputs: Grammar | None = None
    # vLLM's: score the prompt too, with this many alternatives per position.
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_PROMPT_LOGPROBS)
    stream: bool = False

    def request(self) -> GenerationRequest:
        params = SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=max(0, self.top_k),
            max_tokens=self.max_tokens,
            n=self.n,
            stop=self.stop,
            seed=self.seed,
            top_logprobs=self.logprobs if self.top_logprobs is None else self.top_logprobs,
            grammar=self.structured_outputs.grammar if self.structured_outputs else None,
            prompt_logprobs=self.prompt_logprobs,
        )
        return GenerationRequest(self.prompt, params, adapter=self.model)


class LoadAdapterBody(BaseModel):
    lora_name: str = Field(min_length=1, max_length=256)
    lora_path: str = Field(min_length=1, max_length=4096)
    step: int | None = Field(None, ge=0)


class UnloadAdapterBody(BaseModel):
    lora_name: str = Field(min_length=1, max_length=256)


def _error(status: int, message: str) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse(
        {"error": {"message": message, "type": kind, "code": status}}, status_code=status
    )


def _status(exc: EngineError) -> int:
    return 503 if isinstance(exc, EngineUnavailable) else 400


def _choice(result: GenerationResult, *, ids: list[int] | None = None) -> dict[str, Any]:
    return {
        "index": result.choice_index,
        "token_ids": result.token_ids if ids is None else ids,
        "logprobs": {
            "token_logprobs": result.logprobs,
            "top_logprobs": [
                {f"token_id:{token}": value for token, value in alternatives}
                for alternatives in result.top_logprobs
            ],
        },
        "finish_reason": result.finish_reason,
        "stop_reason": result.stop_string,
    }


class WorkerApp:
    """The worker's HTTP app over one started engine.

    Example:
        >>> app = WorkerApp(engine).app  # serve with uvicorn  # fragment: a started `engine`  # doctest: +SKIP
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.app = Starlette(
            routes=[
                Route("/health", self.health, methods=["GET"]),
                Route("/v1/completions", self.completions, methods=["POST"]),
                Route("/v1/load_lora_adapter", self.load_adapter, methods=["POST"]),
                Route("/v1/unload_lora_adapter", self.unload_adapter, methods=["POST"]),
            ]
        )

    async def health(self, request: Request) -> Response:
        return JSONResponse(
            {
                "status": "ok",
                "pid": os.getpid(),
                "context_length": self.engine.context_length,
                "adapters": [{"name": a.name, "step": a.step} for a in self.engine.adapters()],
                "metrics": engine_metrics(self.engine),
            }
        )

    @staticmethod
    async def _body(request: Request, model: type[BaseModel]) -> Any:
        raw = await request.body()
        if len(raw) > MAX_BODY_BYTES:
            raise ValueError(f"the body is over {MAX_BODY_BYTES} bytes")
        return model.model_validate_json(raw)

    async def completions(self, request: Request) -> Response:
        try:
            body: CompletionBody = await self._body(request, CompletionBody)
        except (ValidationError, ValueError) as exc:
            return _error(400, str(exc)[:2000])
        names = {a.name for a in self.engine.adapters()}
        if body.model != BASE_NAME and body.model not in names:
            return _error(404, f"the model {body.model!r} is not loaded here")
        generation = body.request()
        if body.stream:
            if body.prompt_logprobs is not None:  # as vLLM: scores come in whole answers
                return _error(400, "prompt_logprobs are not available when streaming")
            return StreamingResponse(self._stream(generation), media_type="text/event-stream")
        try:
            results = await self.engine.generate(generation)
        except EngineError as exc:
            return _error(_status(exc), str(exc))
        choices = [_choice(r) for r in results]
        scored = results[0].prompt_logprobs if results else None
        if scored is not None:
            if len(body.prompt) * ((body.prompt_logprobs or 0) + 1) > INLINE_SCORED_ENTRIES:
                wire = await asyncio.to_thread(to_wire, scored, body.prompt)
            else:
                wire = to_wire(scored, body.prompt)
            for choice in choices:
                choice["prompt_logprobs"] = wire
        return JSONResponse(
            {
                "id": f"cmpl-{uuid.uuid4().hex}",
                "object": "text_completion",
                "model": body.model,
                "choices": choices,
            }
        )

    async def _stream(self, generation: GenerationRequest) -> AsyncIterator[str]:
        """Ids as they are sampled; then per choice the ids not sent yet, the logprobs and
        the finish (the client joins the chunks into the same choice as a plain answer)."""
        loop = asyncio.get_running_loop()
        arrived: asyncio.Queue[tuple[int, list[int]]] = asyncio.Queue()

        def on_tokens(choice: int, ids: list[int]) -> None:  # on the engine's torch thread
            loop.call_soon_threadsafe(arrived.put_nowait, (choice, list(ids)))

        generation.on_tokens = on_tokens
        task = asyncio.ensure_future(self.engine.generate(generation))
        sent: dict[int, list[int]] = {}

        def chunk(choices: list[dict[str, Any]]) -> str:
            return f"data: {json.dumps({'object': 'text_completion', 'choices': choices})}\n\n"

        try:
            while not task.done() or not arrived.empty():
                getter = asyncio.ensure_future(arrived.get())
                done, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    getter.cancel()
                    continue
                choice, ids = getter.result()
                sent.setdefault(choice, []).extend(ids)
                yield chunk([{"index": choice, "token_ids": ids, "finish_reason": None}])
            try:
                results = task.result()
            except EngineError as exc:
                yield chunk_error(_status(exc), str(exc))
                return
            for result in results:
                already = sent.get(result.choice_index, [])
                if result.token_ids[: len(already)] != already:
                    yield chunk_error(500, "the streamed ids are not a prefix of the answer")
                    return
                yield chunk([_choice(result, ids=result.token_ids[len(already) :])])
            yield "data: [DONE]\n\n"
        finally:
            if not task.done():
                task.cancel()

    async def load_adapter(self, request: Request) -> Response:
        try:
            body: LoadAdapterBody = await self._body(request, LoadAdapterBody)
        except (ValidationError, ValueError) as exc:
            return _error(400, str(exc)[:2000])
        step = body.step
        if step is None:  # vLLM's protocol has no step: read it from a "step-N" name
            tail = body.lora_name.rpartition("-")[2]
            step = int(tail) if tail.isascii() and tail.isdigit() else 1
        try:
            await self.engine.load_adapter(Path(body.lora_path), step, name=body.lora_name)
        except EngineError as exc:
            return _error(_status(exc), str(exc))
        return JSONResponse({"status": "ok"})

    async def unload_adapter(self, request: Request) -> Response:
        try:
            body: UnloadAdapterBody = await self._body(request, UnloadAdapterBody)
        except (ValidationError, ValueError) as exc:
            return _error(400, str(exc)[:2000])
        unload = getattr(self.engine, "unload_adapter", None)
        if unload is None:
            return _error(400, "this engine cannot unload adapters")
        await unload(body.lora_name)
        return JSONResponse({"status": "ok"})


def chunk_error(status: int, message: str) -> str:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return f"data: {json.dumps({'error': {'message': message, 'type': kind, 'code': status}})}\n\n"


def pin_cpus(cpus: list[int] | None, threads: int | None) -> None:
    """Before torch loads: this process runs on ``cpus`` only (its thread budget follows the
    affinity mask, ``art_core.cpu``), and uses ``threads`` torch threads."""
    if cpus:
        os.sched_setaffinity(0, set(cpus))
    if threads:
        os.environ["OMP_NUM_THREADS"] = str(threads)


def engine_metrics(engine: Any) -> dict[str, float]:
    """The engine's own figures (prefill, prefix cache), where it keeps any."""
    metrics = getattr(engine, "metrics", None)
    return metrics() if callable(metrics) else {}


def build_engine(
    model: Path,
    *,
    device: str | None,
    dtype: str | None,
    max_batch_size: int,
    max_loras: int,
    threads: int | None,
    prefix_cache_bytes: int | None = None,
    compile_decode: bool = False,
) -> Engine:
    """The transformers engine a worker serves (torch imported here, after ``pin_cpus``)."""
    from art_core.engines.transformers_engine import TransformersEngine

    if threads:
        import torch

        torch.set_num_threads(threads)
    return TransformersEngine(
        model,
        device=device,
        dtype=dtype,
        max_batch_size=max_batch_size,
        max_loaded_adapters=max_loras,
        prefix_cache_bytes=prefix_cache_bytes,
        compile_decode=compile_decode,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m art_core.engines.worker",
        description="Serve a model folder with the transformers engine over the token-id "
        "completion protocol (an engine replica behind the gateway).",
    )
    parser.add_argument("--model", type=Path, required=True, help="a Hugging Face model folder")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: auto)")
    parser.add_argument("--dtype", default=None, help="bfloat16, float32 (default: auto)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument(
        "--cpus", default=None, help="comma-separated CPU ids this worker runs on (affinity)"
    )
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--max-loras", type=int, default=4)
    parser.add_argument(
        "--prefix-cache-bytes",
        type=int,
        default=None,
        help="the prefix cache's bound (default: from free memory; 0: none)",
    )
    parser.add_argument(
        "--compile-decode",
        action="store_true",
        help="decode steps compiled (torch.compile), compiled and checked at start",
    )
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    import uvicorn

    engine = build_engine(
        args.model,
        device=args.device,
        dtype=args.dtype,
        max_batch_size=args.max_batch_size,
        max_loras=args.max_loras,
        threads=args.threads,
        prefix_cache_bytes=args.prefix_cache_bytes,
        compile_decode=args.compile_decode,
    )
    await engine.start()
    config = uvicorn.Config(
        WorkerApp(engine).app,
        host=args.host,
        port=args.port,
        log_level="warning",
        lifespan="off",
        timeout_keep_alive=60,
        backlog=2048,
    )
    try:
        await uvicorn.Server(config).serve()
    finally:
        await engine.close()


class ThreadedWorker:
    """A worker app and its engine on an event loop in a background thread of this process
    (a Ray actor serves this way: its own methods stay free for Ray's calls).

    Example:
        >>> worker = ThreadedWorker(engine, host="0.0.0.0")  # starts a server: on every interface  # doctest: +SKIP
        >>> worker.port  # starts a server  # doctest: +SKIP
        41235
    """

    def __init__(self, engine: Engine, *, host: str = "127.0.0.1", port: int = 0) -> None:
        import threading

        import uvicorn

        self.engine = engine
        self.loop = asyncio.new_event_loop()
        config = uvicorn.Config(
            WorkerApp(engine).app, host=host, port=port, log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        started = threading.Event()
        failure: list[BaseException] = []

        async def run() -> None:
            try:
                await engine.start()
                serving = asyncio.ensure_future(self._server.serve())
                while not self._server.started and not serving.done():  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
                if serving.done() and serving.exception() is not None:
                    raise serving.exception()  # type: ignore[misc]
            except BaseException as exc:
                failure.append(exc)
                started.set()
                return
            started.set()
            await serving

        self._thread = threading.Thread(
            target=lambda: self.loop.run_until_complete(run()), name="art-worker", daemon=True
        )
        self._thread.start()
        started.wait()
        if failure:
            raise RuntimeError(f"the engine worker failed to start: {failure[0]!r}")
        self.port = int(self._server.servers[0].sockets[0].getsockname()[1])

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    cpus = [int(c) for c in args.cpus.split(",")] if args.cpus else None
    pin_cpus(cpus, args.threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
