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

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from art_core.chat_formats.format import safe_before
from art_core.engines.base import EngineError
from art_core.gateway.errors import engine_error, internal_error
from art_core.gateway.recording import sample_and_record
from art_core.gateway.requests import PreparedCall
from art_core.gateway.responses import SSE_DONE, ResponseShaper, sse, usage

logger = logging.getLogger(__name__)


async def stream_completion(call: PreparedCall) -> AsyncIterator[str]:
    """The SSE events of one streamed request.

    Example:
        >>> StreamingResponse(stream_completion(prepared), media_type="text/event-stream")  # doctest: +SKIP
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[int, list[int]]] = asyncio.Queue()

    def on_tokens(choice: int, ids: list[int]) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, (choice, ids))

    # Not cancelled by a client that hangs up: the sampling and the recording go on.
    task = asyncio.ensure_future(sample_and_record(call, on_tokens=on_tokens))
    shaper = ResponseShaper(call)
    n = call.params.n
    head = [
        {
            "index": i,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        for i in range(n)
    ]
    yield sse(shaper.chunk(head, prompt_token_ids=call.prompt_ids))
    chat_format = call.served.chat.format
    stops = [s for s in call.params.stop if s]
    sampled: dict[int, list[int]] = {i: [] for i in range(n)}
    sent: dict[int, dict[str, str]] = {
        i: {"reasoning_content": "", "content": ""} for i in range(n)
    }
    while not task.done() or not queue.empty():
        getter = asyncio.ensure_future(queue.get())
        done, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
        if getter not in done:
            getter.cancel()
            continue
        choice, ids = getter.result()
        sampled[choice].extend(ids)
        text = chat_format.decode(sampled[choice], parses_tools=call.parses_tools)
        if text.endswith("\ufffd"):
            continue  # an incomplete UTF-8 sequence: wait for the next token
        reasoning, content = chat_format.stream_split(
            safe_before(text, stops),
            parses_tools=call.parses_tools,
            opened_reasoning=call.opened_reasoning,
        )
        delta = _deltas(sent[choice], {"reasoning_content": reasoning, "content": content})
        if delta:
            yield sse(
                shaper.chunk(
                    [{"index": choice, "delta": delta, "logprobs": None, "finish_reason": None}]
                )
            )
    try:
        calls = task.result()
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
        final: dict[str, Any] = {}
        for key, already in sent[recorded.choice_index].items():
            whole = message.get(key) or ""
            rest = whole[len(already) :] if whole.startswith(already) else ""
            if rest:
                final[key] = rest
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


def _deltas(sent: dict[str, str], now: dict[str, str | None]) -> dict[str, str]:
    """The new text of each field since ``sent`` (which is updated); a field whose text
    no longer extends what was sent waits for the end (the last chunk settles it)."""
    delta = {}
    for key, text in now.items():
        if text and len(text) > len(sent[key]) and text.startswith(sent[key]):
            delta[key] = text[len(sent[key]) :]
            sent[key] = text
    return delta
