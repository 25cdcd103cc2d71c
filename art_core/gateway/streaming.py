"""Answering a chat completion as server-sent events (``stream: true``).

The call is sampled and recorded exactly as without streaming (the same ``LLMCall``s). Text
is sent as it is sampled, holding back only what could still turn into a stop string (which
is cut from the answer) or tool-call markup (which never reaches the content); the held-back
rest, the parsed tool calls, the finish reason, logprobs and the extension fields
(``token_ids``, ``call_id``) come in each choice's last chunk. The streamed deltas of a
choice always add up to the content of the non-streamed answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from art_core.engines.base import EngineError
from art_core.gateway.errors import engine_error, internal_error
from art_core.gateway.recording import sample_and_record
from art_core.gateway.requests import PreparedCall
from art_core.gateway.responses import SSE_DONE, ResponseShaper, sse, usage
from art_core.gateway.tool_calls import TOOL_CALL_OPEN

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
    holdback = Holdback(call.params.stop, tool_markup=call.parses_tools)
    sampled: dict[int, list[int]] = {i: [] for i in range(n)}
    sent: dict[int, str] = {i: "" for i in range(n)}
    tokenizer = call.served.tokenizer
    while not task.done() or not queue.empty():
        getter = asyncio.ensure_future(queue.get())
        done, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
        if getter not in done:
            getter.cancel()
            continue
        choice, ids = getter.result()
        sampled[choice].extend(ids)
        text = tokenizer.decode(sampled[choice], skip_special_tokens=True)
        if text.endswith("\ufffd"):
            continue  # an incomplete UTF-8 sequence: wait for the next token
        safe = holdback.safe_prefix(text)
        delta = safe[len(sent[choice]) :]
        if delta and safe.startswith(sent[choice]):
            sent[choice] = safe
            yield sse(
                shaper.chunk(
                    [
                        {
                            "index": choice,
                            "delta": {"content": delta},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ]
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
        content = message.get("content") or ""
        already = sent[recorded.choice_index]
        rest = content[len(already) :] if content.startswith(already) else ""
        if rest:
            final["content"] = rest
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


class Holdback:
    """How much of a choice's text so far is safe to stream.

    A stop string is cut from the answer, so text that could still grow into one (a suffix
    that is a prefix of a stop string) waits; so does everything from the first tool-call
    markup on (it becomes ``tool_calls``, not content), and the whitespace before it (the
    content drops trailing whitespace when tool calls follow).

    Example:
        >>> Holdback(["END"], tool_markup=False).safe_prefix("hello EN")
        'hello '
        >>> Holdback([], tool_markup=True).safe_prefix("Sure.\n<tool_ca")
        'Sure.'
    """

    def __init__(self, stops: list[str], *, tool_markup: bool) -> None:
        self.stops = [s for s in stops if s]
        self.tool_markup = tool_markup
        self.markers = self.stops + ([TOOL_CALL_OPEN] if tool_markup else [])

    def safe_prefix(self, text: str) -> str:
        end = len(text) - _partial_marker_suffix(text, self.markers)
        for marker in self.markers:
            found = text.find(marker)
            if found >= 0:
                end = min(end, found)
        safe = text[:end]
        return safe.rstrip() if self.tool_markup else safe


def _partial_marker_suffix(text: str, markers: list[str]) -> int:
    """The length of the longest end of ``text`` that starts one of ``markers``."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if marker.startswith(text[-size:]):
                longest = size
                break
    return longest
