"""The OpenAI-compatible HTTP front: serves chat completions and records every call.

Routes (each also under ``/rollouts/{rollout_id}``, which scopes the calls to one rollout):
``GET /v1/models``, ``POST /v1/chat/completions`` (``stream: true`` answers as SSE), plus
``GET /health``. Responses carry the exact token ids as extension fields, like vLLM's
``return_token_ids``: top-level ``prompt_token_ids`` and ``choices[i].token_ids``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from art_core.engines.base import (
    Engine,
    EngineError,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
)
from art_core.engines.grammar import json_grammar, tool_call_grammar
from art_core.engines.prompts import PromptBuilder, normalize_message
from art_core.engines.tool_calls import parse_tool_calls
from art_core.gateway.schemas import ChatCompletionRequest, NamedToolChoice
from art_core.gateway.store import CallStore
from art_core.trajectories import LLMCall, new_id

logger = logging.getLogger(__name__)
ROLLOUT_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
MAX_BODY_BYTES = 32 * 1024 * 1024


@dataclass
class ServedModel:
    """A model the gateway serves: its engine, prompt builder and call record."""

    name: str
    engine: Engine
    store: CallStore
    prompts: PromptBuilder
    default_max_tokens: int = 1024


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = (
            status,
            message,
            type,
            param,
            code,
        )

    def response(self) -> JSONResponse:
        return JSONResponse(
            {
                "error": {
                    "message": self.message,
                    "type": self.type,
                    "param": self.param,
                    "code": self.code,
                }
            },
            status_code=self.status,
        )


def _validation_message(exc: ValidationError) -> tuple[str, str | None]:
    parts = []
    first_param = None
    for error in exc.errors()[:5]:
        loc = ".".join(str(p) for p in error["loc"] if not str(p).startswith("function-after"))
        first_param = first_param or loc or None
        message = str(error["msg"]).removeprefix("Value error, ")
        parts.append(f"{loc}: {message}" if loc else message)
    return "invalid request: " + "; ".join(parts), first_param


class Gateway:
    """Holds the served models and builds the Starlette app.

    Example:
        >>> gateway = Gateway()
        >>> gateway.add(served_model)  # doctest: +SKIP
        >>> app = gateway.app  # run with uvicorn
    """

    def __init__(self) -> None:
        self.models: dict[str, ServedModel] = {}
        routes = []
        for prefix in ("", "/rollouts/{rollout_id}"):
            routes += [
                Route(f"{prefix}/v1/models", self.list_models, methods=["GET"]),
                Route(f"{prefix}/v1/chat/completions", self.chat_completions, methods=["POST"]),
            ]
        routes.append(Route("/health", self.health, methods=["GET"]))
        self.app = Starlette(
            routes=routes, exception_handlers={APIError: self._on_error, Exception: self._on_error}
        )

    def add(self, served: ServedModel) -> None:
        self.models[served.name] = served

    async def _on_error(self, request: Request, exc: Exception) -> Response:
        if isinstance(exc, APIError):
            return exc.response()
        logger.exception("internal error on %s", request.url.path)
        return APIError(
            500, f"internal error: {type(exc).__name__}: {exc}", type="server_error"
        ).response()

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "models": sorted(self.models)})

    async def list_models(self, request: Request) -> Response:
        self._rollout_id(request)
        data = []
        for served in self.models.values():
            names = [served.name] + [f"{served.name}@{a.step}" for a in served.engine.adapters()]
            data += [{"id": n, "object": "model", "created": 0, "owned_by": "art"} for n in names]
        return JSONResponse({"object": "list", "data": data})

    # ------------------------------------------------------------------------------ requests
    def _rollout_id(self, request: Request) -> str | None:
        rollout_id = request.path_params.get("rollout_id")
        if rollout_id is not None and not ROLLOUT_ID.match(rollout_id):
            raise APIError(
                400,
                "rollout ids are 1-128 letters, digits, '_', '-', '.' or ':'",
                param="rollout_id",
            )
        return rollout_id

    def _resolve(self, name: str) -> tuple[ServedModel, str | None]:
        base, _, step = name.partition("@")
        served = self.models.get(base)
        if served is None:
            raise APIError(
                404,
                f"model {name!r} does not exist; served: {sorted(self.models)}",
                type="not_found_error",
                param="model",
                code="model_not_found",
            )
        if not step:
            return served, None
        if not step.isdigit() or served.engine.adapter(int(step)) is None:
            raise APIError(
                404,
                f"no adapter of step {step!r} is loaded for {base!r}",
                type="not_found_error",
                param="model",
                code="model_not_found",
            )
        adapter = served.engine.adapter(int(step))
        return served, adapter.name if adapter else None

    async def _parse(self, request: Request) -> tuple[ChatCompletionRequest, dict[str, Any]]:
        body = await request.body()
        if len(body) > MAX_BODY_BYTES:
            raise APIError(413, f"request body over {MAX_BODY_BYTES} bytes")
        try:
            payload = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise APIError(400, f"the body is not valid JSON: {exc}") from None
        if not isinstance(payload, dict):
            raise APIError(400, "the body must be a JSON object")
        try:
            return ChatCompletionRequest.model_validate(payload), payload
        except ValidationError as exc:
            message, param = _validation_message(exc)
            raise APIError(400, message, param=param) from None

    async def chat_completions(self, request: Request) -> Response:
        rollout_id = self._rollout_id(request)
        chat, payload = await self._parse(request)
        served, adapter = self._resolve(chat.model)
        metadata = dict(chat.metadata or {})
        header = request.headers.get("x-art-metadata")
        if header:
            try:
                extra = json.loads(header)
                assert isinstance(extra, dict)
            except (json.JSONDecodeError, AssertionError):
                raise APIError(400, "the x-art-metadata header must be a JSON object") from None
            metadata.update(extra)

        messages = [normalize_message(m.model_dump(exclude_none=True)) for m in chat.messages]
        tools = [t.model_dump(exclude_none=True) for t in chat.tools] if chat.tools else None
        history = served.store.calls_for(rollout_id) if rollout_id else []
        try:
            prompt_ids = await asyncio.to_thread(served.prompts.build, messages, tools, history)
        except Exception as exc:  # a template that cannot render these messages
            raise APIError(
                400, f"cannot render the messages with the chat template: {exc}"
            ) from None
        context = served.engine.context_length
        if len(prompt_ids) >= context:
            raise APIError(
                400,
                f"the prompt has {len(prompt_ids)} tokens; the model's context is {context}",
                param="messages",
                code="context_length_exceeded",
            )
        limit = chat.token_limit
        if limit is None:
            limit = min(served.default_max_tokens, context - len(prompt_ids))
        elif len(prompt_ids) + limit > context:
            raise APIError(
                400,
                f"max_tokens={limit} plus the prompt's {len(prompt_ids)} tokens exceeds the "
                f"model's context of {context}",
                param="max_tokens",
                code="context_length_exceeded",
            )
        params = SamplingParams(
            temperature=chat.temperature,
            top_p=chat.top_p,
            top_k=chat.top_k,
            max_tokens=limit,
            n=chat.n,
            stop=chat.stop_list,
            seed=chat.seed,
            top_logprobs=chat.top_logprobs or 0,
            grammar=self._grammar(chat, tools),
        )
        call = _CallContext(
            served=served,
            chat=chat,
            messages=messages,
            tools=tools,
            rollout_id=rollout_id,
            index=served.store.next_index(rollout_id),
            metadata=metadata,
            request_params={
                k: v
                for k, v in payload.items()
                if k not in ("messages", "tools", "stream", "stream_options")
            },
            prompt_ids=prompt_ids,
        )
        if chat.stream:
            return StreamingResponse(
                self._stream(call, params, adapter),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        # Shielded: a client that hangs up does not cancel the sampling or the recording.
        task = asyncio.ensure_future(call.run(params, adapter))
        try:
            calls = await asyncio.shield(task)
        except EngineError as exc:
            raise APIError(400, str(exc)) from None
        return JSONResponse(call.response(calls))

    @staticmethod
    def _grammar(chat: ChatCompletionRequest, tools: list[dict[str, Any]] | None) -> str | None:
        try:
            if tools and isinstance(chat.tool_choice, NamedToolChoice):
                name = chat.tool_choice.function["name"]
                chosen = [t for t in tools if t["function"]["name"] == name]
                return tool_call_grammar(chosen, parallel=False)
            if tools and chat.tool_choice == "required":
                return tool_call_grammar(tools, parallel=chat.parallel_tool_calls)
            fmt = chat.response_format
            if fmt is not None and fmt.type == "json_object":
                return json_grammar(None)
            if fmt is not None and fmt.type == "json_schema" and fmt.json_schema is not None:
                return json_grammar(fmt.json_schema.json_schema)
        except (ValueError, TypeError) as exc:
            raise APIError(400, f"cannot build a grammar: {exc}") from None
        return None

    async def _stream(
        self, call: _CallContext, params: SamplingParams, adapter: str | None
    ) -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[int, list[int]]] = asyncio.Queue()

        def on_tokens(choice: int, ids: list[int]) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, (choice, ids))

        task = asyncio.ensure_future(call.run(params, adapter, on_tokens=on_tokens))
        head = call.chunk_base()
        head["prompt_token_ids"] = call.prompt_ids
        head["choices"] = [
            {
                "index": i,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
            for i in range(params.n)
        ]
        yield _sse(head)
        # Plain text streams token by token; tool calls, stop strings and grammars are parsed
        # from the whole output, so those answers are sent when complete.
        incremental = not (call.parses_tools or params.stop)
        sampled: dict[int, list[int]] = {i: [] for i in range(params.n)}
        sent: dict[int, str] = {i: "" for i in range(params.n)}
        tokenizer = call.served.engine.tokenizer
        while not task.done() or not queue.empty():
            getter = asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:
                getter.cancel()
                continue
            choice, ids = getter.result()
            sampled[choice].extend(ids)
            if incremental:
                text = tokenizer.decode(sampled[choice], skip_special_tokens=True)
                if text.endswith("\ufffd"):
                    continue  # an incomplete UTF-8 sequence: wait for the next token
                delta = text[len(sent[choice]) :]
                if delta and text.startswith(sent[choice]):
                    sent[choice] = text
                    chunk = call.chunk_base()
                    chunk["choices"] = [
                        {
                            "index": choice,
                            "delta": {"content": delta},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ]
                    yield _sse(chunk)
        try:
            calls = task.result()
        except Exception as exc:
            status = 400 if isinstance(exc, EngineError) else 500
            yield _sse(
                {
                    "error": {
                        "message": str(exc),
                        "type": "invalid_request_error" if status == 400 else "server_error",
                        "code": status,
                    }
                }
            )
            yield "data: [DONE]\n\n"
            return
        for recorded in calls:
            message = recorded.response_message
            final: dict[str, Any] = {}
            content = message.get("content") or ""
            rest = content[len(sent[recorded.choice_index]) :] if incremental else content
            if rest:
                final["content"] = rest
            if message.get("tool_calls"):
                final["tool_calls"] = [
                    {"index": i, **tc} for i, tc in enumerate(message["tool_calls"])
                ]
            chunk = call.chunk_base()
            chunk["choices"] = [
                {
                    "index": recorded.choice_index,
                    "delta": final,
                    "logprobs": call.logprobs_json(recorded),
                    "finish_reason": recorded.finish_reason,
                    "token_ids": recorded.completion_token_ids,
                    "call_id": recorded.id,
                }
            ]
            yield _sse(chunk)
        if call.chat.stream_options and call.chat.stream_options.include_usage:
            usage = call.chunk_base()
            usage["choices"] = []
            usage["usage"] = _usage(calls)
            yield _sse(usage)
        yield "data: [DONE]\n\n"


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def _usage(calls: list[LLMCall]) -> dict[str, int]:
    prompt = calls[0].num_prompt_tokens if calls else 0
    completion = sum(c.num_completion_tokens for c in calls)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


@dataclass
class _CallContext:
    """One chat-completion request between validation and response."""

    served: ServedModel
    chat: ChatCompletionRequest
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    rollout_id: str | None
    index: int
    metadata: dict[str, Any]
    request_params: dict[str, Any]
    prompt_ids: list[int]

    def __post_init__(self) -> None:
        self.id = new_id("chatcmpl")
        self.created = int(time.time())

    @property
    def parses_tools(self) -> bool:
        return bool(self.tools) and self.chat.tool_choice != "none"

    async def run(
        self, params: SamplingParams, adapter: str | None, on_tokens: Any = None
    ) -> list[LLMCall]:
        """Sample, then record every choice before anything is returned."""
        started = time.time()
        results = await self.served.engine.generate(
            GenerationRequest(self.prompt_ids, params, adapter=adapter, on_tokens=on_tokens)
        )
        latency = time.time() - started
        calls = [self._call(result, started, latency) for result in results]
        for call in calls:
            await self.served.store.record(call)
        return calls

    def _call(self, result: GenerationResult, started: float, latency: float) -> LLMCall:
        tokenizer = self.served.engine.tokenizer
        text = tokenizer.decode(result.token_ids, skip_special_tokens=True)
        if result.stop_string and result.stop_string in text:
            text = text[: text.index(result.stop_string)]
        finish = result.finish_reason
        if self.parses_tools:
            names = {t["function"]["name"] for t in self.tools or []}
            message = parse_tool_calls(text, names).message()
            if message.get("tool_calls") and finish == "stop":
                finish = "tool_calls"
        else:
            message = {"role": "assistant", "content": text}
        return LLMCall(
            rollout_id=self.rollout_id,
            index=self.index,
            choice_index=result.choice_index,
            model=self.chat.model,
            adapter_step=result.adapter_step,
            messages=self.messages,
            tools=self.tools,
            request_params=self.request_params,
            prompt_token_ids=self.prompt_ids,
            completion_token_ids=result.token_ids,
            logprobs=result.logprobs,
            completion_text=tokenizer.decode(result.token_ids, skip_special_tokens=False),
            response_message=message,
            finish_reason=finish,
            created_at=started,
            latency_s=latency,
            metadata={
                **self.metadata,
                **({"top_logprobs": result.top_logprobs} if result.top_logprobs else {}),
            },
        )

    def chunk_base(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.chat.model,
        }

    def logprobs_json(self, call: LLMCall) -> dict[str, Any] | None:
        if not self.chat.logprobs:
            return None
        tokenizer = self.served.engine.tokenizer
        top = call.metadata.get("top_logprobs") or [[] for _ in call.completion_token_ids]

        def entry(token_id: int, logprob: float) -> dict[str, Any]:
            token = tokenizer.decode([token_id], skip_special_tokens=False)
            return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}

        return {
            "content": [
                {**entry(t, lp), "top_logprobs": [entry(i, v) for i, v in alts]}
                for t, lp, alts in zip(call.completion_token_ids, call.logprobs, top, strict=False)
            ]
        }

    def response(self, calls: list[LLMCall]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.chat.model,
            "system_fingerprint": f"art-step-{calls[0].adapter_step}" if calls else None,
            "choices": [
                {
                    "index": c.choice_index,
                    "message": c.response_message,
                    "logprobs": self.logprobs_json(c),
                    "finish_reason": c.finish_reason,
                    "token_ids": c.completion_token_ids,
                    "call_id": c.id,
                    "adapter_step": c.adapter_step,
                }
                for c in calls
            ],
            "usage": _usage(calls),
            "prompt_token_ids": self.prompt_ids,
        }
