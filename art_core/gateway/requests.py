"""From an OpenAI chat-completion request to what the engine runs: token ids and params.

``prepare_call`` validates the body, resolves the model (and adapter step) it names, renders
the messages with the chat template (splicing the ids of earlier calls of the rollout),
checks the context, and compiles ``tool_choice`` / ``response_format`` into a grammar.
Everything that can fail for the request's own reasons fails here, as a 4xx, before any
sampling starts.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from art_core.engines.base import SamplingParams
from art_core.gateway.errors import APIError, validation_message
from art_core.gateway.grammar import json_grammar, tool_call_grammar
from art_core.gateway.prompts import normalize_message
from art_core.gateway.schemas import ChatCompletionRequest, NamedToolChoice

if TYPE_CHECKING:
    from art_core.gateway.app import ServedModel

# Fields of the request that are recorded with each call (messages and tools are recorded in
# their own fields; streaming options do not change what was sampled).
_NOT_RECORDED = frozenset({"messages", "tools", "stream", "stream_options"})


@dataclass
class PreparedCall:
    """One validated chat-completion request, ready to sample and record."""

    served: ServedModel
    chat: ChatCompletionRequest
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    rollout_id: str | None
    metadata: dict[str, Any]
    request_params: dict[str, Any]
    prompt_ids: list[int]
    params: SamplingParams
    adapter: str | None
    index: int = 0

    @property
    def parses_tools(self) -> bool:
        """Whether the answer's text is parsed for tool calls."""
        return bool(self.tools) and self.chat.tool_choice != "none"


def parse_chat_request(payload: dict[str, Any]) -> ChatCompletionRequest:
    """The validated request; ``APIError`` 400 naming the first bad fields otherwise."""
    try:
        return ChatCompletionRequest.model_validate(payload)
    except ValidationError as exc:
        message, param = validation_message(exc)
        raise APIError(400, message, param=param) from None


def request_metadata(chat: ChatCompletionRequest, header: str | None) -> dict[str, Any]:
    """The call's metadata: the body's ``metadata`` updated by the ``x-art-metadata`` header."""
    metadata = dict(chat.metadata or {})
    if header:
        try:
            extra = json.loads(header)
        except json.JSONDecodeError:
            extra = None
        if not isinstance(extra, dict):
            raise APIError(400, "the x-art-metadata header must be a JSON object")
        metadata.update(extra)
    return metadata


def grammar_for(chat: ChatCompletionRequest, tools: list[dict[str, Any]] | None) -> str | None:
    """The grammar every choice must follow (forced tool calls, JSON output), or None."""
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


def _token_limit(chat: ChatCompletionRequest, served: ServedModel, prompt_len: int) -> int:
    context = served.engine.context_length
    if prompt_len >= context:
        raise APIError(
            400,
            f"the prompt has {prompt_len} tokens; the model's context is {context}",
            param="messages",
            code="context_length_exceeded",
        )
    limit = chat.token_limit
    if limit is None:
        return min(served.default_max_tokens, context - prompt_len)
    if prompt_len + limit > context:
        raise APIError(
            400,
            f"max_tokens={limit} plus the prompt's {prompt_len} tokens exceeds the model's "
            f"context of {context}",
            param="max_tokens",
            code="context_length_exceeded",
        )
    return limit


async def prepare_call(
    served: ServedModel,
    adapter: str | None,
    chat: ChatCompletionRequest,
    payload: dict[str, Any],
    *,
    rollout_id: str | None,
    metadata: dict[str, Any],
) -> PreparedCall:
    """Render, tokenize and check one request for ``served`` (see the module)."""
    messages = [normalize_message(m.model_dump(exclude_none=True)) for m in chat.messages]
    tools = [t.model_dump(exclude_none=True) for t in chat.tools] if chat.tools else None
    history = served.store.calls_for(rollout_id) if rollout_id else []
    try:
        prompt_ids = await asyncio.to_thread(served.prompts.build, messages, tools, history)
    except Exception as exc:  # a template that cannot render these messages
        raise APIError(400, f"cannot render the messages with the chat template: {exc}") from None
    limit = _token_limit(chat, served, len(prompt_ids))
    params = SamplingParams(
        temperature=chat.temperature,
        top_p=chat.top_p,
        top_k=chat.top_k,
        max_tokens=limit,
        n=chat.n,
        stop=chat.stop_list,
        seed=chat.seed,
        top_logprobs=chat.top_logprobs or 0,
        grammar=grammar_for(chat, tools),
    )
    return PreparedCall(
        served=served,
        chat=chat,
        messages=messages,
        tools=tools,
        rollout_id=rollout_id,
        metadata=metadata,
        request_params={k: v for k, v in payload.items() if k not in _NOT_RECORDED},
        prompt_ids=prompt_ids,
        params=params,
        adapter=adapter,
        index=served.store.next_index(rollout_id),
    )
