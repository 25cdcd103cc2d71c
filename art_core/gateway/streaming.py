"""Answering a chat completion as server-sent events (``stream: true``).

The call is sampled and recorded exactly as without streaming (the same ``LLMCall``s); text
is sent as it is sampled. Answers that are parsed from the whole output (tool calls, stop
strings) are sent when complete. The last chunk of each choice carries its finish reason,
logprobs and the extension fields (``token_ids``, ``call_id``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from art_core.engines.base import EngineError
from art_core.gateway.recording import sample_and_record
from art_core.gateway.requests import PreparedCall
from art_core.gateway.responses import SSE_DONE, ResponseShaper, sse, usage


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
    # Plain text streams token by token; tool calls, stop strings and grammars are parsed
    # from the whole output, so those answers are sent when complete.
    incremental = not (call.parses_tools or call.params.stop)
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
        if not incremental:
            continue
        text = tokenizer.decode(sampled[choice], skip_special_tokens=True)
        if text.endswith("\ufffd"):
            continue  # an incomplete UTF-8 sequence: wait for the next token
        delta = text[len(sent[choice]) :]
        if delta and text.startswith(sent[choice]):
            sent[choice] = text
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
        status = 400 if isinstance(exc, EngineError) else 500
        kind = "invalid_request_error" if status == 400 else "server_error"
        yield sse({"error": {"message": str(exc), "type": kind, "code": status}})
        yield SSE_DONE
        return
    for recorded in calls:
        message = recorded.response_message
        final: dict[str, Any] = {}
        content = message.get("content") or ""
        rest = content[len(sent[recorded.choice_index]) :] if incremental else content
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
