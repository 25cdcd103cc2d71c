"""The JSON the gateway answers: chat completions, stream chunks, logprobs, usage.

Beyond OpenAI's fields, every choice carries the recorded call's id (``call_id``), its
sampled ids (``token_ids``) and the adapter step that served it (``adapter_step``), and the
completion carries ``prompt_token_ids``: the extension fields vLLM's ``return_token_ids``
uses, which let hand-built (ART-style) trajectories be matched to the record.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from starlette.responses import Response

from art_core.gateway.requests import PreparedCall
from art_core.trajectories import LLMCall, new_id


class ResponseShaper:
    """Builds the answers to one request (one id and creation time for all its chunks).

    Example:
        >>> shaper = ResponseShaper(prepared)  # doctest: +SKIP
        >>> shaper.completion(calls)["object"]  # doctest: +SKIP
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


def completion_response(body: dict[str, Any]) -> Response:
    """The JSON answer (orjson: ~10x faster than ``json`` on long token-id lists; a
    non-finite logprob is written as ``null``).

    Example:
        >>> completion_response({"object": "chat.completion"}).body
        b'{"object":"chat.completion"}'
    """
    return Response(orjson.dumps(body), media_type="application/json")


def sse(payload: dict[str, Any]) -> str:
    """One server-sent event.

    Example:
        >>> sse({"a": "é"}) == 'data: {"a":"é"}\\n\\n'
        True
    """
    return f"data: {orjson.dumps(payload).decode()}\n\n"


SSE_DONE = "data: [DONE]\n\n"
