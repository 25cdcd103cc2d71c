"""Sampling a prepared call and recording every choice before anything is answered.

Each choice becomes an ``LLMCall``: the exact prompt and sampled ids, the sampler's
logprobs, the text and the parsed assistant message (tool calls), the finish reason and the
adapter step that served it. The call store commits it before the response leaves, so a
rollout that crashes keeps every call it completed.
"""

from __future__ import annotations

import time

from art_core.chat_formats import ParsedAnswer
from art_core.engines.base import GenerationRequest, GenerationResult, TokenCallback
from art_core.gateway.requests import PreparedCall
from art_core.trajectories import LLMCall


async def sample_and_record(
    call: PreparedCall, on_tokens: TokenCallback | None = None
) -> list[LLMCall]:
    """Run ``call`` on its engine, then record one ``LLMCall`` per choice, in order.

    Example:
        >>> calls = await sample_and_record(prepared)  # doctest: +SKIP
    """
    started = time.time()
    results = await call.served.engine.generate(
        GenerationRequest(
            call.prompt_ids,
            call.params,
            adapter=call.adapter,
            on_tokens=on_tokens,
            route_key=call.rollout_id,
        )
    )
    latency = time.time() - started
    if call.clock:
        call.clock.mark("queue+engine")
    calls = [to_llm_call(call, result, started, latency) for result in results]
    await call.served.store.record_request(calls)
    if call.clock:
        call.clock.mark("record")
    return calls


def to_llm_call(
    call: PreparedCall, result: GenerationResult, started: float, latency: float
) -> LLMCall:
    """The record of one choice: ids, logprobs, text, the parsed message and its finish.

    The answer is read in the model's own chat format (``served.chat.format``): reasoning,
    tool calls in the family's markup, or (lenient) bare call JSON, which is noted in the
    call's metadata as ``tool_call_parser: "bare_json"``."""
    tokenizer = call.served.tokenizer
    answer = parse_answer(call, result)
    message = answer.message()
    finish = result.finish_reason
    if answer.tool_calls and finish == "stop" and not answer.truncated:
        finish = "tool_calls"
    parsed_by = {"tool_call_parser": answer.parser} if answer.tool_calls else {}
    return LLMCall(
        rollout_id=call.rollout_id,
        index=call.index,
        choice_index=result.choice_index,
        model=call.chat.model,
        adapter_step=result.adapter_step,
        replica=result.replica,
        api=call.api,
        messages=call.messages,
        tools=call.tools,
        request_params=call.request_params,
        prompt_token_ids=call.prompt_ids,
        completion_token_ids=result.token_ids,
        logprobs=result.logprobs,
        completion_text=tokenizer.decode(result.token_ids, skip_special_tokens=False),
        response_message=message,
        finish_reason=finish,
        created_at=started,
        latency_s=latency,
        metadata={
            **call.metadata,
            **parsed_by,
            **({"top_logprobs": result.top_logprobs} if result.top_logprobs else {}),
        },
    )


def parse_answer(call: PreparedCall, result: GenerationResult) -> ParsedAnswer:
    """The answer one choice's ids make, in the served model's chat format (a stop string
    that ended it is cut first)."""
    chat_format = call.served.chat.format
    text = chat_format.decode(result.token_ids, parses_tools=call.parses_tools)
    if result.stop_string and result.stop_string in text:
        text = text[: text.index(result.stop_string)]
    return chat_format.parse(
        text,
        call.tools,
        parses_tools=call.parses_tools,
        opened_reasoning=call.opened_reasoning,
    )
