"""OpenAI (legacy) Completions (``POST /v1/completions``) at the gateway's edge.

There is no chat template: the prompt is text, encoded as vLLM encodes it
(``tokenizer(text)``, the tokenizer's special tokens such as a BOS included unless
``add_special_tokens`` is false), or token ids, used as they are. The answer is the raw
sampled text (special tokens skipped unless ``skip_special_tokens`` is false, a stop string
cut): no reasoning split, no tool-call parsing. Each prompt is one recorded call
(``api == "completions"``, its own index in the rollout, one ``LLMCall`` per choice) with no
chat messages (``messages == []``); its prompt text, when at most
``MAX_RECORDED_PROMPT_CHARS``, is kept as ``request_params["prompt"]``. The trainer reads the
recorded ids only, so completions rollouts train like chat ones.

Supported: ``model``, ``prompt`` (a string, a list of strings, a list of token ids or a list
of lists of token ids; several prompts are a batch of up to ``MAX_PROMPTS``: prompt ``i``'s
choices are ``choices[i * n : (i + 1) * n]``), ``max_tokens`` (default 16, as OpenAI; null:
the served default; it must fit the context after the prompt, else 400), ``temperature``,
``top_p``, ``n``, ``stop`` (up to 4 strings), ``seed``, ``logprobs`` (0-5: the legacy
``{tokens, token_logprobs, top_logprobs, text_offset}`` of the sampled tokens), ``echo``,
``stream`` and ``stream_options.include_usage``, ``best_of`` (equal to ``n``), ``metadata``
(and the ``x-art-metadata`` header), and vLLM's ``top_k``, ``add_special_tokens``,
``skip_special_tokens`` and ``prompt_logprobs`` (0-20, not streamed: each choice's
``prompt_logprobs`` in vLLM's format, ``engines/prompt_logprobs.py``: per prompt token its
logprob and rank given the tokens before it and the k most likely tokens, the first
``null``; computed by the weights that serve the call, raw logits at temperature 1; not
recorded). A rollout's own sampling settings (``gateway.rollout_sampling``) apply to each
prompt's call as ``prepare_call`` applies them to a chat call.

Accepted and left out of sampling, named in each call's ``request_params.ignored_fields``
(and logged once): ``presence_penalty``, ``frequency_penalty``, ``logit_bias``, ``user`` and
any other field.

Refused (400): a non-empty ``suffix``; ``best_of`` other than ``n``; ``echo`` with
``logprobs`` (ask for ``prompt_logprobs`` instead); ``prompt_logprobs`` with ``stream``; an
empty prompt; token ids outside the vocabulary; a prompt (or prompt plus ``max_tokens``) over
the context.

Beyond OpenAI's fields, each choice carries ``token_ids``, ``call_id`` and ``adapter_step``
(as the chat route), and the body ``prompt_token_ids`` (one prompt) or each choice its own
(several prompts). Streamed, each choice's text comes as it is sampled (the echoed prompt
first), and its last chunk carries the finish reason, the logprobs and those fields.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.requests import Request
from starlette.responses import Response

from art_core.engines.base import MAX_PROMPT_LOGPROBS, PromptLogprob, SamplingParams
from art_core.engines.prompt_logprobs import to_wire
from art_core.gateway.answering import sample_shielded, stream_answer
from art_core.gateway.answers import RawTextReader
from art_core.gateway.body import parse_json_object
from art_core.gateway.deltas import StreamedText, TextDelta
from art_core.gateway.errors import APIError, validation_message
from art_core.gateway.reading import read_parsed, recorded_fields
from art_core.gateway.requests import INLINE_PROMPT_CHARS, PreparedCall, request_metadata
from art_core.gateway.rollout_sampling import apply_rollout_sampling
from art_core.gateway.routes import APIRoute
from art_core.gateway.schemas import (
    MAX_N,
    MAX_SEED,
    MIN_SEED,
    ChatCompletionRequest,
    StreamOptions,
    check_stop,
)
from art_core.gateway.served import ServedModel
from art_core.gateway.serving import Serving, rollout_id
from art_core.gateway.wire import SSE_DONE, completion_response, event_stream, sse
from art_core.trajectories import LLMCall, new_id

API = "completions"
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for this API
MAX_LOGPROBS = 5  # OpenAI's bound
MAX_PROMPTS = 16  # prompts in one request (each its own recorded call)
MAX_CHOICES = 64  # prompts x n
# A call's prompt text is recorded with it (request_params["prompt"]) up to this size; its
# ids are always recorded.
MAX_RECORDED_PROMPT_CHARS = 8192
# Prompt scores of more entries (tokens x (k + 1)) are written on a worker thread.
INLINE_SCORED_ENTRIES = 20_000
SERVED_FIELDS = frozenset(
    {
        "model",
        "prompt",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "n",
        "stop",
        "seed",
        "logprobs",
        "echo",
        "stream",
        "stream_options",
        "suffix",
        "best_of",
        "metadata",
        "add_special_tokens",
        "skip_special_tokens",
        "prompt_logprobs",
    }
)
# Recorded on their own (the prompt as ids, per call; metadata as the call's metadata) or not
# about what was sampled.
NOT_RECORDED = frozenset({"prompt", "stream", "stream_options", "metadata"})
PROMPT_SHAPES = "a string, a list of strings, a list of token ids or a list of lists of token ids"


class CompletionRequest(BaseModel):
    """The fields of a completions request this gateway reads, with their types (strict: a
    boolean is not a number, a string not a boolean). Other fields are accepted and named in
    the record; ``prompt``'s shapes are checked by ``prompts_of``."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str
    prompt: Any = Field(
        default=None,
        json_schema_extra={
            "anyOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "string"}},
                {"type": "array", "items": {"type": "integer"}},
                {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
            ]
        },
    )
    max_tokens: int | None = Field(default=DEFAULT_MAX_TOKENS, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)  # vLLM's; -1 (or 0): no top-k
    n: int | None = Field(default=None, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=MIN_SEED, le=MAX_SEED)
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: bool | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    suffix: str | None = None
    best_of: int | None = Field(default=None, ge=1)
    metadata: dict[str, Any] | None = None
    add_special_tokens: bool | None = None  # vLLM's; default true
    skip_special_tokens: bool | None = None  # vLLM's; default true
    # vLLM's: score the prompt, with this many alternatives per position (vLLM's -1, the
    # whole vocabulary per token, is refused: its answer would be unbounded).
    prompt_logprobs: int | None = Field(default=None, ge=0, le=MAX_PROMPT_LOGPROBS)

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        return check_stop(value)

    @property
    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


def _bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def prompts_of(value: Any) -> list[str | list[int]]:
    """The request's prompts: texts or token-id lists (``APIError`` 400 for anything else,
    an empty prompt, or more than ``MAX_PROMPTS``).

    Example:
        >>> prompts_of("Once upon"), prompts_of([1, 2]), prompts_of([[1], [2, 3]])
        (['Once upon'], [[1, 2]], [[1], [2, 3]])
    """
    if isinstance(value, str):
        prompts: list[Any] = [value]
    elif isinstance(value, list) and value and all(_is_id(v) for v in value):
        prompts = [value]
    elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        prompts = value
    elif isinstance(value, list) and value and all(isinstance(v, list) for v in value):
        for i, ids in enumerate(value):
            bad = next((j for j, v in enumerate(ids) if not _is_id(v)), None)
            if bad is not None:
                raise _bad(
                    f"prompt[{i}][{bad}] is not a token id (an integer): prompt is {PROMPT_SHAPES}",
                    "prompt",
                )
        prompts = value
    elif value is None:
        raise _bad("prompt is required", "prompt")
    elif isinstance(value, list) and not value:
        raise _bad("prompt is an empty list", "prompt")
    else:
        raise _bad(f"prompt must be {PROMPT_SHAPES}", "prompt")
    if len(prompts) > MAX_PROMPTS:
        raise _bad(
            f"prompt holds {len(prompts)} prompts; at most {MAX_PROMPTS} are served per request",
            "prompt",
        )
    for i, prompt in enumerate(prompts):
        if not prompt:
            where = "prompt" if len(prompts) == 1 else f"prompt[{i}]"
            raise _bad(f"{where} is empty", "prompt")
    return prompts


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class Parsed:
    """A parsed, validated request: the body as sent, its fields, and its prompts."""

    payload: dict[str, Any]
    request: CompletionRequest
    prompts: list[str | list[int]]

    @property
    def n(self) -> int:
        return self.request.n or 1


def parse_request(payload: dict[str, Any]) -> Parsed:
    """The validated request; ``APIError`` 400 naming what was wrong (and what is refused)."""
    try:
        request = CompletionRequest.model_validate(payload)
    except ValidationError as exc:
        message, param = validation_message(exc)
        raise _bad(message, param) from None
    prompts = prompts_of(request.prompt)
    n = request.n or 1
    if request.suffix:
        raise _bad("suffix (insertion) is not supported; send the prompt only", "suffix")
    if request.best_of is not None and request.best_of != n:
        raise _bad(
            f"best_of={request.best_of} is not supported: every sampled choice is returned "
            f"(and recorded); leave best_of out or equal to n ({n})",
            "best_of",
        )
    if request.echo and request.logprobs is not None:
        raise _bad(
            "echo with logprobs is not supported: ask for prompt_logprobs (the prompt's "
            "scores, vLLM's format) and logprobs without echo",
            "echo",
        )
    if request.prompt_logprobs is not None and request.stream:
        raise _bad(
            "prompt_logprobs are not available when streaming (as vLLM); send stream: false",
            "prompt_logprobs",
        )
    if len(prompts) * n > MAX_CHOICES:
        raise _bad(
            f"{len(prompts)} prompts x n={n} is {len(prompts) * n} choices; at most "
            f"{MAX_CHOICES} are served per request",
            "n",
        )
    return Parsed(payload, request, prompts)


def _read(raw: bytes) -> Parsed:
    return parse_request(parse_json_object(raw))


def encode_text(served: ServedModel, text: str, add_special_tokens: bool = True) -> list[int]:
    """``text``'s ids as vLLM's completions encode it: ``tokenizer(text)``, with the
    tokenizer's own special tokens (a BOS) unless ``add_special_tokens`` is false."""
    if not add_special_tokens:
        return served.prompts.encode(text)
    return list(served.tokenizer(text, add_special_tokens=True)["input_ids"])


def _check_chars(served: ServedModel, prompts: list[str | list[int]]) -> int:
    """The prompts' characters; 400 for a text that cannot fit the context whatever its
    tokens (refused before it is tokenized: a token covers at most ``max_token_chars``)."""
    context = served.engine.context_length
    most = context * served.prompts.max_token_chars
    chars = 0
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            if len(prompt) > most:
                raise _bad(
                    f"{_where(i, len(prompts))} has {len(prompt)} characters, more than the "
                    f"{most} that the model's context of {context} tokens can hold",
                    "prompt",
                    "context_length_exceeded",
                )
            chars += len(prompt)
    return chars


def _where(i: int, count: int) -> str:
    return "the prompt" if count == 1 else f"prompt[{i}]"


def _encode_all(
    served: ServedModel, prompts: list[str | list[int]], add_special_tokens: bool
) -> list[list[int]]:
    return [
        encode_text(served, p, add_special_tokens) if isinstance(p, str) else list(p)
        for p in prompts
    ]


def _check_ids(served: ServedModel, ids: list[int], i: int, count: int) -> None:
    vocab = served.chat.vocab_size or len(served.tokenizer)
    if not ids or (min(ids) >= 0 and max(ids) < vocab):
        return
    bad = next((j for j, t in enumerate(ids) if not 0 <= t < vocab), None)
    if bad is not None:
        where = "prompt" if count == 1 else f"prompt[{i}]"
        raise _bad(
            f"{where}[{bad}] = {ids[bad]} is not a token id of this model (0..{vocab - 1})",
            "prompt",
        )


def _token_limit(
    request: CompletionRequest, served: ServedModel, prompt_len: int, where: str
) -> int:
    """The most tokens to sample; 400 when the prompt, or the prompt plus ``max_tokens``,
    does not fit the context (as OpenAI answers: nothing is lowered)."""
    context = served.engine.context_length
    if prompt_len >= context:
        raise _bad(
            f"{where} has {prompt_len} tokens; the model's context is {context}",
            "prompt",
            "context_length_exceeded",
        )
    limit = request.max_tokens
    if limit is None:  # explicit null: the served default, as far as the context allows
        return min(served.default_max_tokens, context - prompt_len)
    if prompt_len + limit > context:
        default = "" if "max_tokens" in request.model_fields_set else " (the default)"
        raise _bad(
            f"max_tokens={limit}{default} plus {where}'s {prompt_len} tokens exceeds the "
            f"model's context of {context}",
            "max_tokens",
            "context_length_exceeded",
        )
    return limit


def _chat_view(parsed: Parsed, limit: int) -> ChatCompletionRequest:
    """The chat request the rest of the gateway reads of a call (``model``, ``logprobs``,
    ``stream_options``, the sampling fields); validated already, so built without checks
    (it has no messages)."""
    request = parsed.request
    return ChatCompletionRequest.model_construct(
        model=request.model,
        messages=[],
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p,
        top_k=max(request.top_k or 0, 0),
        max_tokens=limit,
        n=parsed.n,
        stop=request.stop,
        seed=request.seed,
        logprobs=request.logprobs is not None,
        top_logprobs=request.logprobs,
        stream=bool(request.stream),
        stream_options=request.stream_options,
        metadata=request.metadata,
    )


async def prepare(
    serving: Serving, parsed: Parsed, header: str | None, rollout: str | None
) -> list[PreparedCall]:
    """One prepared call per prompt: the model resolved (404 when not served), the prompt
    encoded (on a worker thread when long) and checked against the vocabulary and context."""
    request = parsed.request
    served, adapter = await serving.resolve(request.model)
    # The metadata's own checks (its size) read the chat view's metadata only.
    metadata = request_metadata(
        _chat_view(parsed, DEFAULT_MAX_TOKENS), header, serving.max_metadata_bytes
    )
    prompts = parsed.prompts
    add_special = request.add_special_tokens is not False
    chars = _check_chars(served, prompts)
    tokens = sum(len(p) for p in prompts if not isinstance(p, str))
    try:
        if chars + tokens <= INLINE_PROMPT_CHARS:
            encoded = _encode_all(served, prompts, add_special)
        else:
            encoded = await asyncio.to_thread(_encode_all, served, prompts, add_special)
    except Exception as exc:  # a tokenizer that cannot encode this text
        raise _bad(f"cannot tokenize the prompt: {exc}", "prompt") from None
    recorded = recorded_fields(parsed.payload, SERVED_FIELDS, NOT_RECORDED)
    serving.log_ignored(API, recorded)
    # This API builds its calls without ``prepare_call`` (no chat template): the rollout's
    # own sampling settings are applied here, the same way.
    sampling = serving.rollout_sampling.get(rollout)
    reader = RawTextReader(skip_special=request.skip_special_tokens is not False)
    calls = []
    limits = []
    for i, ids in enumerate(encoded):
        # The length first: the ids checked one by one are at most a context's worth.
        limits.append(_token_limit(request, served, len(ids), _where(i, len(prompts))))
        _check_ids(served, ids, i, len(prompts))
    # Every prompt is a call of the rollout: all of them admitted against its bound, or the
    # request refused (403) before anything is sampled.
    serving.rollout_limits.admit(rollout, len(prompts))
    for i, (prompt, ids, limit) in enumerate(zip(prompts, encoded, limits, strict=True)):
        params_recorded = dict(recorded)
        if len(prompts) > 1:
            params_recorded["prompt_index"] = i
        if isinstance(prompt, str) and len(prompt) <= MAX_RECORDED_PROMPT_CHARS:
            params_recorded["prompt"] = prompt
        if request.max_tokens is None or "max_tokens" not in request.model_fields_set:
            params_recorded["max_tokens"] = limit  # the limit sampled with
        params = SamplingParams(
            temperature=1.0 if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            top_k=max(request.top_k or 0, 0),
            max_tokens=limit,
            n=parsed.n,
            stop=request.stop_list,
            seed=request.seed,
            top_logprobs=request.logprobs or 0,
            prompt_logprobs=request.prompt_logprobs,
        )
        index = served.store.next_index(rollout)
        apply_rollout_sampling(sampling, params, params_recorded, index)
        calls.append(
            PreparedCall(
                served=served,
                chat=_chat_view(parsed, limit),
                messages=[],
                tools=None,
                rollout_id=rollout,
                metadata=metadata,
                request_params=params_recorded,
                prompt_ids=ids,
                params=params,
                adapter=adapter,
                index=index,
                api=API,
                reader=reader,
            )
        )
    return calls


Scored = list[PromptLogprob | None]


class Answer:
    """The answers to one request (one id and creation time for every chunk)."""

    def __init__(self, parsed: Parsed, calls: list[PreparedCall]) -> None:
        self.parsed = parsed
        self.calls = calls
        self.id = new_id("cmpl")
        self.created = int(time.time())
        self.skip_special = parsed.request.skip_special_tokens is not False
        self._tokens: dict[int, str] = {}  # token id -> its text, for logprobs

    @property
    def model(self) -> str:
        return self.parsed.request.model

    def echo(self, i: int) -> str:
        """The echoed text of prompt ``i`` (empty unless ``echo``)."""
        if not self.parsed.request.echo:
            return ""
        prompt = self.parsed.prompts[i]
        if isinstance(prompt, str):
            return prompt
        tokenizer = self.calls[i].served.tokenizer
        return str(tokenizer.decode(prompt, skip_special_tokens=self.skip_special))

    def token(self, token_id: int) -> str:
        text = self._tokens.get(token_id)
        if text is None:
            tokenizer = self.calls[0].served.tokenizer
            text = self._tokens[token_id] = tokenizer.decode([token_id], skip_special_tokens=False)
        return text

    def logprobs(self, recorded: LLMCall, offset: int) -> dict[str, Any] | None:
        """The legacy ``logprobs`` of a choice's sampled tokens: their texts, logprobs, top
        alternatives (the sampled token among them, as vLLM gives them; keyed by text, so
        alternatives of the same text collapse into one) and offsets in the
        choice's text (after the echoed prompt, ``offset`` characters)."""
        top_n = self.parsed.request.logprobs
        if top_n is None:
            return None
        ids = recorded.completion_token_ids
        alternatives = recorded.metadata.get("top_logprobs") or [[] for _ in ids]
        tokens, token_logprobs, top, text_offset = [], [], [], []
        for token_id, logprob, alts in zip(ids, recorded.logprobs, alternatives, strict=False):
            text = self.token(token_id)
            tokens.append(text)
            token_logprobs.append(logprob)
            text_offset.append(offset)
            offset += len(text)
            best = {self.token(i): v for i, v in list(alts)[:top_n]}
            # The sampled token's own entry wins over an alternative of the same text (two
            # partial UTF-8 byte tokens both read "\ufffd").
            best[text] = logprob
            top.append(best)
        return {
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": top,
            "text_offset": text_offset,
        }

    def choice_index(self, prompt: int, choice: int) -> int:
        return prompt * self.parsed.n + choice

    def extension(self, recorded: LLMCall, prompt: int) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "token_ids": recorded.completion_token_ids,
            "call_id": recorded.id,
            "adapter_step": recorded.adapter_step,
        }
        if len(self.calls) > 1:
            fields["prompt_token_ids"] = recorded.prompt_token_ids
        return fields

    def usage(self, recorded: list[list[LLMCall]]) -> dict[str, int]:
        prompt = sum(len(call.prompt_ids) for call in self.calls)
        completion = sum(c.num_completion_tokens for calls in recorded for c in calls)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def chunk(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }

    def body(self, recorded: list[list[LLMCall]]) -> dict[str, Any]:
        """The non-streamed ``text_completion``."""
        choices = []
        for i, calls in enumerate(recorded):
            echo = self.echo(i)
            for c in calls:
                choices.append(
                    {
                        "index": self.choice_index(i, c.choice_index),
                        "text": echo + (c.response_message.get("content") or ""),
                        "logprobs": self.logprobs(c, len(echo)),
                        "finish_reason": c.finish_reason,
                        **self.extension(c, i),
                    }
                )
        first = next((calls[0] for calls in recorded if calls), None)
        body = self.chunk(
            choices,
            system_fingerprint=f"art-step-{first.adapter_step}" if first else None,
            usage=self.usage(recorded),
        )
        if len(self.calls) == 1:
            body["prompt_token_ids"] = self.calls[0].prompt_ids
        return body

    def prompt_logprobs(self, scored: list[Scored | None]) -> list[list[Any] | None]:
        """Each prompt's scores in vLLM's wire format (``decoded_token`` included)."""
        tokenizer = self.calls[0].served.tokenizer

        def decode(ids: list[int]) -> list[str]:
            texts = tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False)
            return [str(text) for text in texts]

        return [
            None if s is None else to_wire(s, call.prompt_ids, decode)
            for s, call in zip(scored, self.calls, strict=True)
        ]

    async def add_prompt_logprobs(self, body: dict[str, Any], scored: list[Scored | None]) -> None:
        """Put each prompt's scores into its choices (as vLLM: every choice of a prompt
        carries them); written on a worker thread when large."""
        k = self.parsed.request.prompt_logprobs or 0
        entries = sum(len(call.prompt_ids) for call in self.calls) * (k + 1)
        if entries > INLINE_SCORED_ENTRIES:
            wires = await asyncio.to_thread(self.prompt_logprobs, scored)
        else:
            wires = self.prompt_logprobs(scored)
        for choice in body["choices"]:
            choice["prompt_logprobs"] = wires[choice["index"] // self.parsed.n]


async def create(serving: Serving, request: Request) -> Response:
    """``POST /v1/completions``: answer one request as a ``text_completion`` or its chunks.

    Example:
        >>> APIRoute("/v1/completions", create) in ROUTES
        True
    """
    rollout = rollout_id(request)
    parsed = await read_parsed(serving, request, _read)
    calls = await prepare(serving, parsed, request.headers.get("x-art-metadata"), rollout)
    answer = Answer(parsed, calls)
    if parsed.request.stream:
        return event_stream(stream_answer(calls, CompletionsEncoder(answer), serving.stream_pacing))
    sampled = await sample_shielded(calls)
    body = answer.body([each.calls for each in sampled])
    if parsed.request.prompt_logprobs is not None:
        await answer.add_prompt_logprobs(body, [each.prompt_logprobs for each in sampled])
    return completion_response(body)


class CompletionsEncoder:
    """The SSE chunks of a streamed request (``answering.StreamEncoder``): each choice's
    echoed prompt, then its text as it is sampled (holding back what may still turn into a
    stop string, which is cut), then its last chunk (the rest of the text, the finish
    reason, logprobs, ``token_ids``, ``call_id``); with ``stream_options.include_usage`` a
    chunk of usage; ``[DONE]``. When a prompt's call fails, the others' last chunks come
    first, then the error."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer

    def text_chunk(self, prompt: int, choice: int, text: str, **fields: Any) -> str:
        entry = {
            "index": self.answer.choice_index(prompt, choice),
            "text": text,
            "logprobs": None,
            "finish_reason": None,
        }
        return sse(self.answer.chunk([{**entry, **fields}]))

    def opening(self) -> Iterable[str]:
        for i in range(len(self.answer.calls)):
            echo = self.answer.echo(i)
            if echo:
                for choice in range(self.answer.parsed.n):
                    yield self.text_chunk(i, choice, echo)

    def delta(self, delta: TextDelta) -> Iterable[str]:
        return [self.text_chunk(delta.call, delta.choice, delta.text)]

    def last_chunks(
        self, recorded: list[list[LLMCall]], texts: list[StreamedText]
    ) -> Iterable[str]:
        """Each recorded choice's last chunk."""
        for i, choices in enumerate(recorded):
            echo_len = len(self.answer.echo(i))
            for c in choices:
                yield self.text_chunk(
                    i,
                    c.choice_index,
                    texts[i].rest(c).get("content", ""),
                    logprobs=self.answer.logprobs(c, echo_len),
                    finish_reason=c.finish_reason,
                    **self.answer.extension(c, i),
                )

    def finished(self, recorded: list[list[LLMCall]], texts: list[StreamedText]) -> Iterable[str]:
        yield from self.last_chunks(recorded, texts)
        options = self.answer.parsed.request.stream_options
        if options is not None and options.include_usage:
            yield sse(self.answer.chunk([], usage=self.answer.usage(recorded)))
        yield SSE_DONE

    def failed(
        self, error: APIError, recorded: list[list[LLMCall]], texts: list[StreamedText]
    ) -> Iterable[str]:
        yield from self.last_chunks(recorded, texts)
        yield sse({"error": {"message": error.message, "type": error.type, "code": error.status}})
        yield SSE_DONE


ROUTES = (APIRoute("/v1/completions", create),)
