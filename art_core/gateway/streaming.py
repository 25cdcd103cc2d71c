"""Answering a chat completion as server-sent events (``stream: true``).

The call is sampled and recorded exactly as without streaming (the same ``LLMCall``s). Text
is sent as it is sampled (reasoning as ``reasoning_content`` deltas, as vLLM sends it),
holding back only what could still turn into a stop string (which is cut from the answer),
a reasoning tag, or tool-call markup of the model's format (which never reaches the
content); the held-back rest, the parsed tool calls, the finish reason, logprobs and the
extension fields (``token_ids``, ``call_id``) come in each choice's last chunk. The streamed
deltas of a choice always add up to the content (and reasoning) of the non-streamed answer.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from art_core.engines.base import EngineError
from art_core.gateway.deltas import Recorded, StreamedText, sampled_deltas
from art_core.gateway.errors import engine_error, internal_error
from art_core.gateway.requests import PreparedCall
from art_core.gateway.responses import SSE_DONE, ResponseShaper, sse, usage
from art_core.trajectories import LLMCall

logger = logging.getLogger(__name__)


async def stream_completion(call: PreparedCall) -> AsyncIterator[str]:
    """The SSE events of one streamed request.

    Example:
        >>> StreamingResponse(stream_completion(prepared), media_type="text/event-stream")  # doctest: +SKIP
    """
    shaper = ResponseShaper(call)
    head = [
        {
            "index": i,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        for i in range(call.params.n)
    ]
    yield sse(shaper.chunk(head, prompt_token_ids=call.prompt_ids))
    text = StreamedText(call.params.n)
    calls: list[LLMCall] = []
    try:
        async for item in sampled_deltas(call, text):
            if isinstance(item, Recorded):
                calls = item.calls
                continue
            delta = {item.field: item.text}
            yield sse(
                shaper.chunk(
                    [
                        {
                            "index": item.choice,
                            "delta": delta,
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ]
                )
            )
    except Exception as exc:
        if isinstance(exc, EngineError):
            refused = engine_error(exc)
            status, kind, reason = refused.status, refused.type, refused.message
        else:
            logger.error("a streamed call failed", exc_info=exc)
            status, kind, reason = 500, "server_error", internal_error(exc).message
        yield sse({"error": {"message": reason, "type": kind, "code": status}})
        yield SSE_DONE
        return
    for recorded in calls:
        message = recorded.response_message
        final: dict[str, Any] = text.rest(recorded)
        if message.get("tool_calls"):
            final["tool_calls"] = [{"index": i, **tc} for i, tc in enumerate(message["tool_calls"])]
        yield sse(
            shaper.chunk(
                [
                    {
                        "index": recorded.choice_index,
                        "delta": final,
                        "logprobs": shaper.logprobs(recorded),
                        "finish_reason": recorded.finish_reason,
                        "token_ids": recorded.completion_token_ids,
                        "call_id": recorded.id,
                    }
                ]
            )
        )
    if call.chat.stream_options and call.chat.stream_options.include_usage:
        yield sse(shaper.chunk([], usage=usage(calls)))
    yield SSE_DONE
