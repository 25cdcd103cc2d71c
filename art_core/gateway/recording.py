"""Sampling a prepared call and recording every choice before anything is answered.

Each choice becomes an ``LLMCall``: the exact prompt and sampled ids, the sampler's
logprobs, the text and the answer its API's reader makes of it (``answers``: the parsed
assistant message with tool calls, or the raw text), the finish reason and the adapter step
that served it. The call store commits it before the response leaves, so a rollout that
crashes keeps every call it completed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from art_core.chat_formats.decoding import decode_ids
from art_core.engines.base import (
    EngineError,
    GenerationRequest,
    GenerationResult,
    PromptLogprob,
    TokenCallback,
)
from art_core.gateway.requests import PreparedCall
from art_core.trajectories import LLMCall


@dataclass(frozen=True)
class Sampled:
    """A call's recorded choices, in order, and its prompt's scores when the request asked
    (``prompt_logprobs``; answered, not recorded)."""

    calls: list[LLMCall]
    prompt_logprobs: list[PromptLogprob | None] | None = None


async def sample_and_record(call: PreparedCall, on_tokens: TokenCallback | None = None) -> Sampled:
    """Run ``call`` on its engine, then record one ``LLMCall`` per choice, in order.

    Example:
        >>> sampled = await sample_and_record(prepared)  # fragment: a `prepared` call inside the gateway  # doctest: +SKIP
        >>> sampled.calls[0].finish_reason  # fragment  # doctest: +SKIP
        'stop'
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
    scored = results[0].prompt_logprobs if results else None
    if call.params.prompt_logprobs is not None and scored is None:
        # Nothing is recorded: the call failed as a whole (an engine that ignored the field).
        raise EngineError("this model's engine does not score prompts (prompt_logprobs)")
    if call.clock:
        call.clock.mark("queue+engine")
    calls = [to_llm_call(call, result, started, latency) for result in results]
    await call.served.store.record_request(calls)
    if call.clock:
        call.clock.mark("record")
    return Sampled(calls, scored)


def to_llm_call(
    call: PreparedCall, result: GenerationResult, started: float, latency: float
) -> LLMCall:
    """The record of one choice: ids, logprobs, text, the answer its API's reader makes of
    them (``call.reader``) and its finish.

    Example:
        >>> to_llm_call(prepared, result, time.time(), 0.1).completion_token_ids  # fragment: a `prepared` call and the engine's `result`  # doctest: +SKIP
        [9906, 0]
    """
    answer = call.reader.answer(call, result)
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
        completion_text=decode_ids(call.served.tokenizer, result.token_ids),
        response_message=answer.message,
        finish_reason=answer.finish_reason,
        created_at=started,
        latency_s=latency,
        metadata={
            **call.metadata,
            **answer.metadata,
            **({"top_logprobs": result.top_logprobs} if result.top_logprobs else {}),
        },
    )
