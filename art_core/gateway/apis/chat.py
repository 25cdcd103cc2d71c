"""OpenAI Chat Completions (``POST /v1/chat/completions``): the gateway's own request shape.

The body is the internal chat request as it is (``translate``: only its recorded
parameters are picked); the recorded calls become a ``chat.completion`` (``ResponseShaper``)
or its ``chat.completion.chunk`` events (``ChatEncoder``, ``stream: true``).

Beyond OpenAI's fields, every choice carries the recorded call's id (``call_id``), its
sampled ids (``token_ids``) and the adapter step that served it (``adapter_step``), and the
completion carries ``prompt_token_ids``: the extension fields vLLM's ``return_token_ids``
uses, which let hand-built (ART-style) trajectories be matched to the record.

Streamed, the call is sampled and recorded exactly as without streaming (the same
``LLMCall``s). Text is sent as it is sampled (reasoning as ``reasoning_content`` deltas, as
vLLM sends it), holding back only what could still turn into a stop string (which is cut
from the answer), a reasoning tag, or tool-call markup of the model's format (which never
reaches the content); the held-back rest, the parsed tool calls, the finish reason,
logprobs and the extension fields come in each choice's last chunk. The streamed deltas of
a choice always add up to the content (and reasoning) of the non-streamed answer.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from art_core.gateway.answering import sample_shielded, stream_answer
from art_core.gateway.deltas import StreamedText, TextDelta
from art_core.gateway.errors import APIError
from art_core.gateway.reading import Translated, prepare_translated, read_translated
from art_core.gateway.requests import PreparedCall, recorded_params
from art_core.gateway.routes import APIRoute
from art_core.gateway.serving import Serving, rollout_id
from art_core.gateway.timing import StageClock
from art_core.gateway.wire import SSE_DONE, completion_response, event_stream, sse
from art_core.trajectories import LLMCall, new_id

API = "chat.completions"


def translate(payload: dict[str, Any]) -> Translated:
    """A chat request is its own translation; what is recorded with each call is picked.

    Example:
        >>> translate({"model": "m", "messages": [], "junk": 1}).recorded
        {'model': 'm', 'ignored_fields': ['junk']}
    """
    return Translated(payload, recorded_params(payload))


async def create(serving: Serving, request: Request) -> Response:
    """``POST /v1/chat/completions``: a ``chat.completion`` or its chunks (``stream``).

    Example:
        >>> APIRoute("/v1/chat/completions", create) in ROUTES
        True
    """
    clock = StageClock() if serving.stage_log is not None else None
    rollout = rollout_id(request)
    chat, translated = await read_translated(serving, request, translate)
    if clock:
        clock.mark("parse")
    call = await prepare_translated(serving, chat, translated, api=API, rollout_id=rollout)
    if chat.chat.stream:
        return event_stream(stream_answer([call], ChatEncoder(call), serving.stream_pacing))
    if clock:
        clock.mark("prepare")
        call.clock = clock
    shaper = ResponseShaper(call)
    (sampled,) = await sample_shielded([call])
    response = completion_response(shaper.completion(sampled.calls))
    if clock and serving.stage_log is not None:
        clock.mark("respond")
        serving.stage_log.add(clock)
    return response


class ResponseShaper:
    """Builds the answers to one request (one id and creation time for all its chunks).

    Example:
        >>> shaper = ResponseShaper(prepared)  # fragment: a `prepared` call inside the gateway  # doctest: +SKIP
        >>> shaper.completion(calls)["object"]  # fragment  # doctest: +SKIP
        'chat.completion'
    """

    def __init__(self, call: PreparedCall) -> None:
        self.call = call
        self.id = new_id("chatcmpl")
        self.created = int(time.time())
        self._tokens: dict[int, str] = {}  # token id -> its text, for logprobs

    def chunk(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        """A ``chat.completion.chunk`` with these choices."""
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.call.chat.model,
            "choices": choices,
            **extra,
        }

    def logprobs(self, call: LLMCall) -> dict[str, Any] | None:
        """OpenAI's ``logprobs.content`` for a recorded call, when the request asked."""
        if not self.call.chat.logprobs:
            return None
        tokenizer = self.call.served.tokenizer
        top = call.metadata.get("top_logprobs") or [[] for _ in call.completion_token_ids]
        # Each distinct id decoded once per answer (20 alternatives a token repeat a lot).
        tokens = self._tokens

        def entry(token_id: int, logprob: float) -> dict[str, Any]:
            token = tokens.get(token_id)
            if token is None:
                token = tokens[token_id] = tokenizer.decode([token_id], skip_special_tokens=False)
            return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}

        return {
            "content": [
                {**entry(t, lp), "top_logprobs": [entry(i, v) for i, v in alts]}
                for t, lp, alts in zip(call.completion_token_ids, call.logprobs, top, strict=False)
            ]
        }

    def completion(self, calls: list[LLMCall]) -> dict[str, Any]:
        """The non-streamed ``chat.completion``."""
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.call.chat.model,
            "system_fingerprint": f"art-step-{calls[0].adapter_step}" if calls else None,
            "choices": [
                {
                    "index": c.choice_index,
                    "message": c.response_message,
                    "logprobs": self.logprobs(c),
                    "finish_reason": c.finish_reason,
                    "token_ids": c.completion_token_ids,
                    "call_id": c.id,
                    "adapter_step": c.adapter_step,
                }
                for c in calls
            ],
            "usage": usage(calls),
            "prompt_token_ids": self.call.prompt_ids,
        }


def usage(calls: list[LLMCall]) -> dict[str, int]:
    """Token counts of a request's choices (the prompt counted once)."""
    prompt = calls[0].num_prompt_tokens if calls else 0
    completion = sum(c.num_completion_tokens for c in calls)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


class ChatEncoder:
    """The ``chat.completion.chunk`` events of one streamed call (``answering.StreamEncoder``)."""

    def __init__(self, call: PreparedCall) -> None:
        self.call = call
        self.shaper = ResponseShaper(call)

    def _choice(self, index: int, delta: dict[str, Any], **fields: Any) -> str:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
        return sse(self.shaper.chunk([{**choice, **fields}]))

    def opening(self) -> Iterable[str]:
        head = [
            {
                "index": i,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
            for i in range(self.call.params.n)
        ]
        return [sse(self.shaper.chunk(head, prompt_token_ids=self.call.prompt_ids))]

    def delta(self, delta: TextDelta) -> Iterable[str]:
        return [self._choice(delta.choice, {delta.field: delta.text})]

    def finished(self, recorded: list[list[LLMCall]], texts: list[StreamedText]) -> Iterable[str]:
        (calls,), (text,) = recorded, texts
        for call in calls:
            message = call.response_message
            final: dict[str, Any] = text.rest(call)
            if message.get("tool_calls"):
                final["tool_calls"] = [
                    {"index": i, **tc} for i, tc in enumerate(message["tool_calls"])
                ]
            yield self._choice(
                call.choice_index,
                final,
                logprobs=self.shaper.logprobs(call),
                finish_reason=call.finish_reason,
                token_ids=call.completion_token_ids,
                call_id=call.id,
            )
        options = self.call.chat.stream_options
        if options and options.include_usage:
            yield sse(self.shaper.chunk([], usage=usage(calls)))
        yield SSE_DONE

    def failed(
        self, error: APIError, recorded: list[list[LLMCall]], texts: list[StreamedText]
    ) -> Iterable[str]:
        body = {"message": error.message, "type": error.type, "code": error.status}
        return [sse({"error": body}), SSE_DONE]


ROUTES = (APIRoute("/v1/chat/completions", create),)
