"""From an OpenAI chat-completion request to what the engine runs: token ids and params.

``validate_request`` validates a chat body (and the ``x-art-metadata`` header; every wire
API's request becomes one, ``reading``); ``prepare_call`` renders the messages with the chat template (splicing the ids of earlier
calls of the rollout), checks the context, and compiles ``tool_choice`` / ``response_format``
into a grammar. Everything that can fail for the request's own reasons fails here, as a 4xx,
before any sampling starts.

Nothing CPU-heavy runs on the server's event loop: a small request (the usual agent turn) is
parsed, validated and rendered in place, which costs less than handing it to a thread; a
large body, a JSON Schema not checked before, or a long prompt goes to a worker thread. A
prompt that cannot fit the context is refused by its length before it is tokenized.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError

from art_core.chat_formats import ChatFormat
from art_core.engines.base import SamplingParams
from art_core.gateway.answers import CHAT_FORMAT, AnswerReader
from art_core.gateway.body import parse_json_object
from art_core.gateway.errors import APIError, validation_message
from art_core.gateway.grammar import json_grammar
from art_core.gateway.prompts import normalize_message
from art_core.gateway.rollout_limits import RolloutLimitsStore
from art_core.gateway.rollout_sampling import RolloutSampling, apply_rollout_sampling
from art_core.gateway.schemas import (
    ChatCompletionRequest,
    NamedToolChoice,
    SchemaChecks,
    schema_is_checked,
)
from art_core.gateway.served import ServedModel
from art_core.gateway.timing import StageClock

# Fields of the request that are recorded with each call (messages and tools are recorded in
# their own fields, metadata in the call's metadata; streaming options do not change what was
# sampled).
_NOT_RECORDED = frozenset({"messages", "tools", "stream", "stream_options", "metadata"})
# Up to these sizes a request is parsed, validated and rendered on the event loop (well
# under a millisecond); beyond them, on a worker thread.
INLINE_BODY_BYTES = 32 * 1024
INLINE_PROMPT_CHARS = 16 * 1024
DEFAULT_MAX_METADATA_BYTES = 64 * 1024


@dataclass
class ChatRequest:
    """A parsed, validated request: the body as sent, its model, and the call's metadata."""

    payload: dict[str, Any]
    chat: ChatCompletionRequest
    metadata: dict[str, Any]


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
    clock: StageClock | None = None  # where the time goes, when the gateway records it
    # The prompt ends inside a reasoning block (the answer starts in it).
    opened_reasoning: bool = False
    # The wire API the request came through (recorded with each call).
    api: str = "chat.completions"
    # How a choice's ids become its answer: the model's chat format, or raw text.
    reader: AnswerReader = CHAT_FORMAT

    @property
    def parses_tools(self) -> bool:
        """Whether the answer's text is parsed for tool calls."""
        return bool(self.tools) and self.chat.tool_choice != "none"


def validate_request(
    payload: dict[str, Any],
    header: str | None,
    schema_checks: SchemaChecks,
    max_metadata_bytes: int = DEFAULT_MAX_METADATA_BYTES,
) -> ChatRequest:
    """A chat-completion body validated (``APIError`` 400 naming what was wrong), with the
    call's metadata (the body's and the ``x-art-metadata`` header's). ``schema_checks``
    remembers the JSON Schemas that passed.

    Example:
        >>> validate_request({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, None, SchemaChecks()).chat.model
        'm'
    """
    chat = parse_chat_request(payload, schema_checks)
    return ChatRequest(payload, chat, request_metadata(chat, header, max_metadata_bytes))


def unchecked_schemas(payload: dict[str, Any], checks: SchemaChecks) -> bool:
    """Whether the body carries a JSON Schema not checked before (checking is slow).

    Example:
        >>> unchecked_schemas({"model": "m", "messages": []}, SchemaChecks())
        False
    """
    schemas: list[Any] = []
    tools = payload.get("tools")
    for tool in tools if isinstance(tools, list) else ():
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and function.get("parameters") is not None:
            schemas.append(function["parameters"])
    fmt = payload.get("response_format")
    spec = fmt.get("json_schema") if isinstance(fmt, dict) else None
    if isinstance(spec, dict) and spec.get("schema") is not None:
        schemas.append(spec["schema"])
    return not all(schema_is_checked(schema, checks) for schema in schemas)


def parse_chat_request(
    payload: dict[str, Any], schema_checks: SchemaChecks | None = None
) -> ChatCompletionRequest:
    """The validated request; ``APIError`` 400 naming the first bad fields otherwise."""
    try:
        return ChatCompletionRequest.model_validate(
            payload, context={"schema_checks": schema_checks}
        )
    except ValidationError as exc:
        message, param = validation_message(exc)
        raise APIError(400, message, param=param) from None


def request_metadata(
    chat: ChatCompletionRequest,
    header: str | None,
    max_bytes: int = DEFAULT_MAX_METADATA_BYTES,
) -> dict[str, Any]:
    """The call's metadata: the body's ``metadata`` updated by the ``x-art-metadata`` header,
    at most ``max_bytes`` as JSON (it is recorded with the call)."""
    metadata = dict(chat.metadata or {})
    if header:
        extra = parse_json_object(header, what="the x-art-metadata header")
        metadata.update(extra)
    if metadata:
        size = len(orjson.dumps(metadata))
        if size > max_bytes:
            raise APIError(
                400,
                f"metadata (the body's and the x-art-metadata header's) is {size} bytes as "
                f"JSON; at most {max_bytes} are recorded with a call",
                param="metadata",
            )
    return metadata


def grammar_for(
    chat: ChatCompletionRequest,
    tools: list[dict[str, Any]] | None,
    chat_format: ChatFormat,
    *,
    opened_reasoning: bool = False,
) -> str | None:
    """The grammar every choice must follow (forced tool calls in the model's own format,
    JSON output), or None."""
    try:
        if tools and isinstance(chat.tool_choice, NamedToolChoice):
            name = chat.tool_choice.function["name"]
            chosen = [t for t in tools if t["function"]["name"] == name]
            return chat_format.tool_call_grammar(
                chosen, parallel=False, opened_reasoning=opened_reasoning
            )
        if tools and chat.tool_choice == "required":
            return chat_format.tool_call_grammar(
                tools, parallel=chat.parallel_tool_calls, opened_reasoning=opened_reasoning
            )
        fmt = chat.response_format
        if fmt is not None and fmt.type == "json_object":
            return json_grammar(None)
        if fmt is not None and fmt.type == "json_schema" and fmt.json_schema is not None:
            return json_grammar(fmt.json_schema.json_schema)
    except (ValueError, TypeError) as exc:
        raise APIError(400, f"cannot build a grammar: {exc}") from None
    return None


def _token_limit(chat: ChatCompletionRequest, served: ServedModel, prompt_len: int) -> int:
    """The most tokens to sample: the request's limit (or the served default), lowered to what
    the context leaves after the prompt; 400 only for a prompt that fills the context alone.

    A limit over the context is fitted, never refused, in every chat API: agents ask for what
    their usual hosted model allows (Claude Code and opencode send 32000 whatever the
    model), and a refusal would stop them on every call to a small-context model."""
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
    return min(limit, context - prompt_len)


async def prepare_call(
    served: ServedModel,
    adapter: str | None,
    request: ChatRequest,
    *,
    rollout_id: str | None,
    api: str = "chat.completions",
    request_params: dict[str, Any] | None = None,
    sampling: RolloutSampling | None = None,
    limits: RolloutLimitsStore | None = None,
) -> PreparedCall:
    """Render, tokenize and check one request for ``served`` (see the module). A token limit
    the context cannot hold is lowered to fit (recorded as
    ``request_params["max_tokens_fitted"]``). ``sampling``, the rollout's own settings
    (``Gateway.rollout_sampling``), override the request's (``rollout_sampling``; what
    was applied is recorded as ``request_params["rollout_sampling"]``). ``limits``
    (``Serving.rollout_limits``) admits the call or refuses it (403) when its rollout has had
    its ``max_calls``, after every check of the request and before anything is sampled.

    The other wire APIs translate their requests to a chat request and come here too:
    ``api`` names theirs, ``request_params`` are their own recorded parameters.

    Example:
        >>> call = await prepare_call(served, None, request, rollout_id="r1")  # fragment: a `served` model and a `request`  # doctest: +SKIP
        >>> call.params.temperature, call.index  # fragment  # doctest: +SKIP
        (1.0, 0)
    """
    chat = request.chat
    messages, tools, prompt_ids = await render_prompt(served, chat, rollout_id)
    limit = _token_limit(chat, served, len(prompt_ids))
    params_recorded = (
        recorded_params(request.payload) if request_params is None else dict(request_params)
    )
    if chat.token_limit is not None and limit < chat.token_limit:
        params_recorded["max_tokens_fitted"] = limit
    chat_format = served.chat.format
    opened_reasoning = chat_format.opened_reasoning(prompt_ids)
    params = SamplingParams(
        temperature=chat.temperature,
        top_p=chat.top_p,
        top_k=chat.top_k,
        max_tokens=limit,
        n=chat.n,
        stop=chat.stop_list,
        seed=chat.seed,
        top_logprobs=chat.top_logprobs or 0,
        grammar=grammar_for(chat, tools, chat_format, opened_reasoning=opened_reasoning),
    )
    # Admitted, then reserved, last: a request refused above takes no index (and so shifts
    # no derived seed) and counts nothing against its rollout's bound.
    if limits is not None:
        limits.admit(rollout_id)
    index = served.store.next_index(rollout_id)
    apply_rollout_sampling(sampling, params, params_recorded, index)
    return PreparedCall(
        served=served,
        chat=chat,
        messages=messages,
        tools=tools,
        rollout_id=rollout_id,
        metadata=request.metadata,
        request_params=params_recorded,
        prompt_ids=prompt_ids,
        params=params,
        adapter=adapter,
        index=index,
        opened_reasoning=opened_reasoning,
        api=api,
    )


# Unknown fields are recorded by name only (a caller's 200 KB field is not kept in memory
# with every call): at most this many names, each cut to this many characters.
MAX_IGNORED_NAMES, MAX_IGNORED_NAME_CHARS = 32, 64


def recorded_params(payload: dict[str, Any]) -> dict[str, Any]:
    """The request's parameters recorded with each call: the fields the gateway serves (not
    those recorded on their own), plus the sorted names of fields it ignored.

    Example:
        >>> recorded_params({"model": "m", "messages": [], "temperature": 0.5, "junk": "x" * 9})
        {'model': 'm', 'temperature': 0.5, 'ignored_fields': ['junk']}
    """
    known = ChatCompletionRequest.model_fields
    params = {k: v for k, v in payload.items() if k in known and k not in _NOT_RECORDED}
    ignored = sorted(k[:MAX_IGNORED_NAME_CHARS] for k in payload if k not in known)
    if ignored:
        params["ignored_fields"] = ignored[:MAX_IGNORED_NAMES]
    return params


async def render_prompt(
    served: ServedModel, chat: ChatCompletionRequest, rollout_id: str | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, list[int]]:
    """The request's messages and tools as the gateway records them, and the prompt's ids:
    the chat template with tools, spliced onto the ids of the rollout's earlier call (on
    the event loop for a short prompt, else on a worker thread). 400 for messages that
    cannot fit the context (by their length, before tokenizing) or that the template
    cannot render.

    Example:
        >>> messages, tools, ids = await render_prompt(served, chat, "r1")  # fragment: a `served` model and a parsed `chat` request  # doctest: +SKIP
    """
    messages = [normalize_message(m.model_dump(exclude_none=True)) for m in chat.messages]
    tools = [t.model_dump(exclude_none=True) for t in chat.tools] if chat.tools else None
    template_kwargs = chat.chat_template_kwargs
    chars = _check_prompt_length(served, messages)
    if tools:
        chars += len(orjson.dumps(tools))
    try:
        if chars <= INLINE_PROMPT_CHARS and not (rollout_id and served.store.evicted(rollout_id)):
            history = served.store.calls_for(rollout_id) if rollout_id else []
            prompt_ids = served.prompts.build(messages, tools, history, template_kwargs)
        else:
            prompt_ids = await asyncio.to_thread(
                _build_prompt, served, messages, tools, rollout_id, template_kwargs
            )
    except Exception as exc:  # a template that cannot render these messages
        raise APIError(400, f"cannot render the messages with the chat template: {exc}") from None
    return messages, tools, prompt_ids


def _check_prompt_length(served: ServedModel, messages: list[dict[str, Any]]) -> int:
    """The messages' length in characters; 400 when that many cannot fit the context.

    A token covers at most ``max_token_chars`` characters, so a prompt of more than
    ``context * max_token_chars`` characters is too long whatever its tokens: refused without
    tokenizing it (a 5 MB prompt costs seconds to tokenize).
    """
    chars = 0
    for message in messages:
        chars += len(message["content"])
        for call in message.get("tool_calls") or ():
            chars += len(call["function"]["arguments"]) + len(call["function"]["name"])
    context = served.engine.context_length
    most = context * served.prompts.max_token_chars
    if chars > most:
        raise APIError(
            400,
            f"the messages have {chars} characters, more than the {most} that the model's "
            f"context of {context} tokens can hold",
            param="messages",
            code="context_length_exceeded",
        )
    return chars


def _build_prompt(
    served: ServedModel,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    rollout_id: str | None,
    template_kwargs: dict[str, Any] | None,
) -> list[int]:
    """Prompt ids on a worker thread (the rollout's history may have to be read from disk)."""
    history = served.store.calls_for(rollout_id) if rollout_id else []
    return served.prompts.build(messages, tools, history, template_kwargs)
