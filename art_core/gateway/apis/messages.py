"""Anthropic Messages (``POST /v1/messages``, ``POST /v1/messages/count_tokens``) at the
gateway's edge.

A request becomes the gateway's chat request (``translate``); the recorded call becomes a
``message`` (``Answer.body``) or its documented event stream (``stream_events``); errors are
answered in Anthropic's shape (``error_response``). Anthropic's ``anthropic-version`` and
``anthropic-beta`` headers and the ``?beta=true`` query of the SDK's ``client.beta`` are
accepted (the betas are recorded as ``request_params.anthropic_beta``).

Supported: ``system`` (a string or text blocks, joined by a blank line); ``messages`` with
roles ``user``, ``assistant`` and ``system``, content as a string or blocks: ``text``
(blocks of one message joined by a blank line), ``tool_use`` (an assistant's tool call: its
``id`` kept, ``input`` as the call's JSON arguments), ``tool_result`` (one ``tool`` message
per result, before the message's text, content as a string or text blocks; ``is_error:
true`` prefixes the text with ``"Error: "``), ``thinking`` (an assistant's reasoning, as
its ``reasoning_content``), ``document`` (its text, when its source is ``text`` or
``content``) and ``search_result`` (its text blocks); ``tools`` of type ``custom`` (or no
type): ``name``, ``description``, ``input_schema``, ``strict``; ``tool_choice`` (``auto``,
``any``, ``tool`` by name, ``none``; ``disable_parallel_tool_use``); ``max_tokens`` (required;
lowered to fit the context, recorded as ``max_tokens_fitted``), ``temperature`` (0-1),
``top_p``, ``top_k``, ``stop_sequences`` (at most 4, reported back as ``stop_sequence``),
``metadata`` (the call's metadata, as the chat route's), ``output_config.format``
(``json_schema``: the answer is constrained to the schema), ``stream``. The answer is a
``message`` (``thinking`` block with an empty ``signature``, ``text`` block, ``tool_use``
blocks with the recorded call ids) with ``stop_reason`` ``end_turn`` / ``max_tokens`` /
``stop_sequence`` / ``tool_use`` and ``usage``, plus the chat route's extension fields
``call_id``, ``token_ids`` and ``adapter_step``. Echoing a message back (its text, its
``tool_use`` blocks) continues the recorded call token-exactly.

Accepted and left out of the prompt: the fields ``thinking`` (any type),
``context_management``, ``service_tier``, ``container``, ``mcp_servers``, ``betas``,
``inference_geo``, ``speed``, ``cache_control`` and any other field (named in each call's
``request_params.ignored_fields`` and logged once); ``output_config`` fields other than
``format`` (``effort``: recorded with ``output_config``); ``cache_control`` and
``citations`` of blocks, a thinking block's ``signature``; tools of Anthropic's own types
(``web_search_*``, ``web_fetch_*``, ``bash_*``, ``text_editor_*``, ``computer_*``,
``code_execution_*``, ``memory_*``, ...: named in ``request_params.ignored_tools``; a
``tool_choice`` naming one is ``auto``); ``redacted_thinking`` blocks, server-tool blocks
(``server_tool_use``, ``*_tool_result``, ``container_upload``, ...), thinking blocks in user
messages and documents without text (named in ``request_params.ignored_blocks``).
Consecutive messages of one role are not merged (chat templates render each).

Refused (400, in Anthropic's error shape): a missing or zero ``max_tokens``, images (the
gateway serves text models), a conversation that ends with an ``assistant`` message
(prefill), unknown roles or block types, fields of the wrong type. A model the gateway does
not serve is a 404.

``count_tokens`` answers ``{"input_tokens": N}``: the length of the prompt the same request
would run (spliced onto the rollout's earlier calls as ``create`` would be), nothing
sampled or recorded.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from art_core.gateway.answering import sample_shielded, stream_answer
from art_core.gateway.deltas import StreamedText, TextDelta
from art_core.gateway.errors import (
    APIError,
    anthropic_error_body,
    json_response,
    validation_message,
)
from art_core.gateway.pacing import StreamPacing
from art_core.gateway.reading import (
    Translated,
    prepare_translated,
    read_translated,
    recorded_fields,
)
from art_core.gateway.requests import PreparedCall, render_prompt
from art_core.gateway.routes import APIRoute
from art_core.gateway.serving import Serving, rollout_id
from art_core.gateway.wire import completion_response, event_stream, named_event
from art_core.trajectories import LLMCall, new_id

API = "messages"
# Fields this module serves (the rest are accepted, ignored and named in the record).
SERVED_FIELDS = frozenset(
    {
        "model",
        "messages",
        "system",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "stop_sequences",
        "tools",
        "tool_choice",
        "metadata",
        "stream",
        "output_config",
    }
)
# Recorded in fields of their own (messages, tools, metadata) or not about sampling.
NOT_RECORDED = frozenset({"messages", "system", "tools", "metadata", "stream"})
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_STOP_SEQUENCES, MAX_STOP_CHARS = 4, 256  # the chat request's bounds
MAX_NAMES = 32  # recorded names of ignored tools, blocks, betas (each cut to 64 characters)
BLOCK_JOIN = "\n\n"  # between the text blocks of one message (and of ``system``)
ERROR_PREFIX = "Error: "  # a tool_result with is_error: true
# Blocks of Anthropic's server tools (and other blocks the gateway has no use for) in a
# conversation: accepted and left out; any other ``*_tool_use`` / ``*_tool_result`` too.
SERVER_BLOCKS = frozenset(
    {
        "server_tool_use",
        "mcp_tool_use",
        "mcp_tool_result",
        "container_upload",
        "tool_reference",
        "compaction",
    }
)
SERVER_BLOCK = re.compile(r"^[a-z0-9_]+_tool_(use|result)$")
# Anthropic's stop reason of each chat finish reason ("stop" may be "stop_sequence").
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
# Anthropic's error type of each HTTP status (others: 4xx invalid_request_error, 5xx api_error).


class CountTokensRequest(BaseModel):
    """The top-level fields of a ``count_tokens`` request this gateway reads, with their
    types (checked before anything else; messages, blocks and tools are checked as they are
    translated). Other fields are accepted and named in the record."""

    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None


class MessagesRequest(CountTokensRequest):
    """The top-level fields of a Messages request this gateway reads, with their types."""

    max_tokens: int = Field(ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    stop_sequences: list[str] | None = None
    metadata: dict[str, Any] | None = None
    stream: bool | None = None


def _bad(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


def _joined(texts: list[str]) -> str:
    return BLOCK_JOIN.join(t for t in texts if t)


def _block(value: Any, where: str) -> tuple[dict[str, Any], str]:
    """A content block and its type; 400 unless it is an object with a string ``type``."""
    if not isinstance(value, dict):
        raise _bad(f"{where} must be a content block (an object)", where)
    kind = value.get("type")
    if not isinstance(kind, str):
        raise _bad(f"{where}.type must be a string", f"{where}.type")
    return value, kind


def _string(block: dict[str, Any], key: str, where: str) -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise _bad(f"{where}.{key} must be a string", f"{where}.{key}")
    return value


def _no_images(kind: str, where: str) -> None:
    if kind == "image":
        raise _bad(
            f"{where}: image blocks are not supported: the gateway serves text models", where
        )


def _is_server_block(kind: str) -> bool:
    return kind in SERVER_BLOCKS or bool(SERVER_BLOCK.match(kind))


class _Ignored:
    """Names of what was accepted and left out (recorded with the call, bounded)."""

    def __init__(self) -> None:
        self.blocks: set[str] = set()

    def block(self, kind: str) -> None:
        if len(self.blocks) < MAX_NAMES:
            self.blocks.add(kind[:64])


def _texts(content: Any, where: str, ignored: _Ignored) -> str:
    """The text of a string or a list of text blocks (``system``, a ``system`` message, a
    ``tool_result``'s content, a document's or search result's content)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"{where} must be a string or a list of text blocks", where)
    texts = []
    for i, raw in enumerate(content):
        block, kind = _block(raw, f"{where}.{i}")
        texts.append(_readable_text(block, kind, f"{where}.{i}", ignored))
    return _joined(texts)


def _readable_text(block: dict[str, Any], kind: str, where: str, ignored: _Ignored) -> str:
    """The text a text-like block carries: ``text``, ``document`` (a text source),
    ``search_result``; other non-image blocks the gateway knows are left out (""), images and
    unknown blocks are refused."""
    _no_images(kind, where)
    if kind == "text":
        return _string(block, "text", where)
    if kind == "document":
        source = block.get("source")
        if not isinstance(source, dict):
            raise _bad(f"{where}.source must be an object", f"{where}.source")
        if source.get("type") == "text":
            return _string(source, "data", f"{where}.source")
        if source.get("type") == "content":
            return _texts(source.get("content"), f"{where}.source.content", ignored)
        ignored.block(f"document:{source.get('type')}"[:64])  # a PDF, a URL, a file id
        return ""
    if kind == "search_result":
        return _texts(block.get("content"), f"{where}.content", ignored)
    if _is_server_block(kind):
        ignored.block(kind)
        return ""
    raise _bad(f"{where}: unknown or misplaced content block type {kind[:64]!r}", f"{where}.type")


def _arguments(block: dict[str, Any], where: str) -> str:
    value = block.get("input")
    if not isinstance(value, dict):
        raise _bad(f"{where}.input must be an object", f"{where}.input")
    return json.dumps(value, ensure_ascii=False)


class _Conversation:
    """Anthropic messages as chat messages, in order."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.ignored = _Ignored()

    def add(self, raw: Any, where: str) -> None:
        if not isinstance(raw, dict):
            raise _bad(f"{where} must be an object", where)
        role = raw.get("role")
        content = raw.get("content")
        if role == "system":
            text = _texts(content, f"{where}.content", self.ignored)
            self.messages.append({"role": "system", "content": text})
            return
        if role not in ("user", "assistant"):
            raise _bad(f"{where}.role must be user, assistant or system", f"{where}.role")
        if isinstance(content, str):
            self.messages.append({"role": role, "content": content})
            return
        if not isinstance(content, list):
            raise _bad(
                f"{where}.content must be a string or a list of content blocks", f"{where}.content"
            )
        if role == "user":
            self._user(content, where)
        else:
            self._assistant(content, where)

    def _user(self, content: list[Any], where: str) -> None:
        texts: list[str] = []
        results: list[dict[str, Any]] = []
        for i, raw in enumerate(content):
            at = f"{where}.content.{i}"
            block, kind = _block(raw, at)
            if kind == "tool_result":
                call_id = _string(block, "tool_use_id", at)
                inner = block.get("content")
                text = "" if inner is None else _texts(inner, f"{at}.content", self.ignored)
                if block.get("is_error") is True:
                    text = ERROR_PREFIX + text
                results.append({"role": "tool", "tool_call_id": call_id, "content": text})
            elif kind in ("thinking", "redacted_thinking"):
                self.ignored.block(kind)  # only an assistant thinks
            elif kind == "tool_use":
                raise _bad(f"{at}: tool_use blocks belong in assistant messages", f"{at}.type")
            else:
                texts.append(_readable_text(block, kind, at, self.ignored))
        self.messages.extend(results)
        if texts or not results:
            self.messages.append({"role": "user", "content": _joined(texts)})

    def _assistant(self, content: list[Any], where: str) -> None:
        texts: list[str] = []
        reasoning: list[str] = []
        calls: list[dict[str, Any]] = []
        for i, raw in enumerate(content):
            at = f"{where}.content.{i}"
            block, kind = _block(raw, at)
            _no_images(kind, at)
            if kind == "text":
                texts.append(_string(block, "text", at))
            elif kind == "thinking":
                reasoning.append(_string(block, "thinking", at))
            elif kind == "tool_use":
                calls.append(
                    {
                        "id": _string(block, "id", at),
                        "type": "function",
                        "function": {
                            "name": _string(block, "name", at),
                            "arguments": _arguments(block, at),
                        },
                    }
                )
            elif kind == "redacted_thinking" or _is_server_block(kind):
                self.ignored.block(kind)
            else:
                raise _bad(
                    f"{at}: {kind[:64]!r} blocks cannot be in assistant messages", f"{at}.type"
                )
        message: dict[str, Any] = {"role": "assistant", "content": _joined(texts)}
        if reasoning:
            message["reasoning_content"] = _joined(reasoning)
        if calls:
            message["tool_calls"] = calls
        self.messages.append(message)


@dataclass
class _Tools:
    chat_tools: list[dict[str, Any]] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  # types of Anthropic's own tools
    ignored_names: set[str] = field(default_factory=set)


def _tools(raw: list[dict[str, Any]] | None) -> _Tools:
    tools = _Tools()
    for i, tool in enumerate(raw or ()):
        where = f"tools.{i}"
        kind = tool.get("type")
        if kind not in (None, "custom"):
            if not isinstance(kind, str):
                raise _bad(f"{where}.type must be a string", f"{where}.type")
            if len(tools.ignored) < MAX_NAMES:
                tools.ignored.append(kind[:64])
            if isinstance(tool.get("name"), str):
                tools.ignored_names.add(tool["name"])
            continue
        name = tool.get("name")
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            raise _bad(f"{where}.name must be 1-64 letters, digits, '_' or '-'", f"{where}.name")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise _bad(
                f"{where}.input_schema must be a JSON Schema (an object)", f"{where}.input_schema"
            )
        function: dict[str, Any] = {"name": name, "parameters": schema}
        description = tool.get("description")
        if description is not None:
            if not isinstance(description, str):
                raise _bad(f"{where}.description must be a string", f"{where}.description")
            if description:
                function["description"] = description
        if isinstance(tool.get("strict"), bool):
            function["strict"] = tool["strict"]
        tools.chat_tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(raw: dict[str, Any] | None, tools: _Tools) -> tuple[Any, bool | None]:
    """The chat ``tool_choice`` and ``parallel_tool_calls`` (None: the default)."""
    if raw is None:
        return None, None
    kind = raw.get("type")
    disable = raw.get("disable_parallel_tool_use")
    if disable is not None and not isinstance(disable, bool):
        raise _bad(
            "tool_choice.disable_parallel_tool_use must be a boolean",
            "tool_choice.disable_parallel_tool_use",
        )
    parallel = None if disable is None else not disable
    names = {t["function"]["name"] for t in tools.chat_tools}
    if kind == "auto":
        return "auto", parallel
    if kind == "none":
        return "none", parallel
    if kind == "any":
        return ("required" if names else "auto"), parallel
    if kind == "tool":
        name = raw.get("name")
        if not isinstance(name, str):
            raise _bad("tool_choice of type tool needs a name", "tool_choice.name")
        if name in names:
            return {"type": "function", "function": {"name": name}}, parallel
        if name in tools.ignored_names:
            return "auto", parallel  # one of Anthropic's own tools, left out
        raise _bad(f"tool_choice names {name[:64]!r}, which is not among the tools", "tool_choice")
    raise _bad("tool_choice.type must be auto, any, tool or none", "tool_choice.type")


def _system_first(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Leading system messages joined into one (chat templates take one, at the start)."""
    lead = 0
    while lead < len(messages) and messages[lead]["role"] == "system":
        lead += 1
    if lead <= 1:
        return messages
    joined = _joined([m["content"] for m in messages[:lead]])
    return [{"role": "system", "content": joined}, *messages[lead:]]


def _response_format(output_config: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (output_config or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise _bad(
            "output_config.format must be {'type': 'json_schema', 'schema': {...}}",
            "output_config.format",
        )
    schema = fmt.get("schema")
    if not isinstance(schema, dict):
        raise _bad("output_config.format.schema must be an object", "output_config.format.schema")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}


def translate(
    payload: dict[str, Any], *, count_only: bool = False, betas: list[str] | None = None
) -> Translated:
    """A Messages request (or, with ``count_only``, a ``count_tokens`` request) as the chat
    request it becomes; ``APIError`` 400 naming what was wrong.

    Example:
        >>> translate({"model": "m", "max_tokens": 5, "system": "Be brief.",
        ...            "messages": [{"role": "user", "content": "hi"}]}).chat["messages"]
        [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'hi'}]
    """
    model: type[CountTokensRequest] = CountTokensRequest if count_only else MessagesRequest
    try:
        request = model.model_validate(payload)
    except ValidationError as exc:
        reason, param = validation_message(exc)
        raise APIError(400, reason, param=param) from None
    conversation = _Conversation()
    for i, message in enumerate(request.messages):
        conversation.add(message, f"messages.{i}")
    system = (
        _texts(request.system, "system", conversation.ignored) if request.system is not None else ""
    )
    head = [{"role": "system", "content": system}] if system else []
    messages = _system_first([*head, *conversation.messages])
    if not any(m["role"] != "system" for m in messages):
        raise _bad("messages has no user or assistant message: nothing to answer", "messages")
    if messages[-1]["role"] == "assistant":
        raise _bad(
            "the last message is an assistant message: prefilling the answer is not "
            "supported; end with a user message",
            "messages",
        )
    tools = _tools(request.tools)
    chat: dict[str, Any] = {"model": request.model, "messages": messages}
    if tools.chat_tools:
        chat["tools"] = tools.chat_tools
    choice, parallel = _tool_choice(request.tool_choice, tools)
    if tools.chat_tools and choice is not None:
        chat["tool_choice"] = choice
    if tools.chat_tools and parallel is not None:
        chat["parallel_tool_calls"] = parallel
    response_format = _response_format(request.output_config)
    if response_format is not None:
        chat["response_format"] = response_format
    stops: list[str] = []
    stream = False
    if isinstance(request, MessagesRequest):
        chat["max_tokens"] = request.max_tokens
        for name in ("temperature", "top_p", "top_k", "metadata"):
            value = getattr(request, name)
            if value is not None:
                chat[name] = value
        stops = request.stop_sequences or []
        if len(stops) > MAX_STOP_SEQUENCES or any(not s or len(s) > MAX_STOP_CHARS for s in stops):
            raise _bad(
                f"stop_sequences takes up to {MAX_STOP_SEQUENCES} non-empty strings of at "
                f"most {MAX_STOP_CHARS} characters",
                "stop_sequences",
            )
        if stops:
            chat["stop"] = stops
        stream = bool(request.stream)
    recorded = recorded_fields(payload, SERVED_FIELDS, NOT_RECORDED)
    if tools.ignored:
        recorded["ignored_tools"] = tools.ignored
    if conversation.ignored.blocks:
        recorded["ignored_blocks"] = sorted(conversation.ignored.blocks)
    if betas:
        recorded["anthropic_beta"] = betas
    return Translated(chat, recorded, {"stream": stream, "stops": stops})


def _betas(request: Request) -> list[str]:
    """The betas of the ``anthropic-beta`` headers (recorded; none changes the answer)."""
    names: list[str] = []
    for header in request.headers.getlist("anthropic-beta"):
        names += [n.strip()[:64] for n in header.split(",") if n.strip()]
    return sorted(set(names))[:MAX_NAMES]


def _tool_input(arguments: str) -> dict[str, Any]:
    """A recorded call's arguments as ``tool_use.input`` (``{}`` when they are not a JSON
    object: a call cut short by ``max_tokens``)."""
    try:
        value = json.loads(arguments or "{}")
    except (json.JSONDecodeError, TypeError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def _stop_sequence(recorded: LLMCall, stops: list[str]) -> str | None:
    """The stop sequence that ended the answer (the first one its sampled text completes)."""
    if recorded.finish_reason != "stop" or not stops:
        return None
    text = recorded.completion_text
    found = [(text.find(s) + len(s), s) for s in stops if s in text]
    return min(found)[1] if found else None


@dataclass
class Answer:
    """One recorded call as an Anthropic ``message``: its id handed out once."""

    call: PreparedCall
    translated: Translated
    id: str = field(default_factory=lambda: new_id("msg"))

    def stop(self, recorded: LLMCall) -> tuple[str, str | None]:
        """``stop_reason`` and ``stop_sequence``."""
        sequence = _stop_sequence(recorded, self.translated.context["stops"])
        if sequence is not None:
            return "stop_sequence", sequence
        return STOP_REASONS.get(recorded.finish_reason, "end_turn"), None

    @staticmethod
    def usage(recorded: LLMCall | None) -> dict[str, int]:
        return {
            "input_tokens": recorded.num_prompt_tokens if recorded else 0,
            "output_tokens": recorded.num_completion_tokens if recorded else 0,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }

    @staticmethod
    def tool_uses(recorded: LLMCall) -> list[dict[str, Any]]:
        return [
            {
                "type": "tool_use",
                "id": call["id"],
                "name": call["function"]["name"],
                "input": _tool_input(call["function"]["arguments"]),
            }
            for call in recorded.response_message.get("tool_calls") or []
        ]

    def content(self, recorded: LLMCall) -> list[dict[str, Any]]:
        """The blocks: thinking (when the model reasoned), text (when it wrote any, or when
        it called no tool), one ``tool_use`` per call."""
        message = recorded.response_message
        blocks: list[dict[str, Any]] = []
        if message.get("reasoning_content"):
            blocks.append(
                {"type": "thinking", "thinking": message["reasoning_content"], "signature": ""}
            )
        uses = self.tool_uses(recorded)
        if message.get("content") or not uses:
            blocks.append({"type": "text", "text": message.get("content") or ""})
        return blocks + uses

    def extension(self, recorded: LLMCall) -> dict[str, Any]:
        """The chat route's extension fields: the record's id, the sampled ids, the step."""
        return {
            "call_id": recorded.id,
            "token_ids": recorded.completion_token_ids,
            "adapter_step": recorded.adapter_step,
        }

    def body(self, recorded: LLMCall) -> dict[str, Any]:
        """The non-streamed ``message``."""
        reason, sequence = self.stop(recorded)
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.call.chat.model,
            "content": self.content(recorded),
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": self.usage(recorded),
            **self.extension(recorded),
        }

    def started(self) -> dict[str, Any]:
        """The ``message`` of ``message_start``: no content yet, the prompt's usage."""
        usage = self.usage(None)
        usage["input_tokens"] = len(self.call.prompt_ids)
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.call.chat.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage,
        }


async def create(serving: Serving, request: Request) -> Response:
    """``POST /v1/messages``: answer one request as a ``message`` or its event stream.

    Example:
        >>> APIRoute("/v1/messages", create, error_response=error_response) in ROUTES
        True
    """
    rollout = rollout_id(request)
    betas = _betas(request)

    def read(payload: dict[str, Any]) -> Translated:
        return translate(payload, betas=betas)

    chat, translated = await read_translated(serving, request, read)
    serving.log_ignored(API, translated.recorded)
    call = await prepare_translated(serving, chat, translated, api=API, rollout_id=rollout)
    answer = Answer(call, translated)
    if translated.context["stream"]:
        return event_stream(stream_events(answer, serving.stream_pacing))
    (sampled,) = await sample_shielded([call])
    return completion_response(answer.body(sampled.calls[0]))


async def count_tokens(serving: Serving, request: Request) -> Response:
    """``POST /v1/messages/count_tokens``: ``{"input_tokens": N}``, the length of the prompt
    ``create`` would run for the same request (nothing is sampled or recorded).

    Example:
        >>> APIRoute("/v1/messages/count_tokens", count_tokens, error_response=error_response) in ROUTES
        True
    """
    rollout = rollout_id(request)

    def read(payload: dict[str, Any]) -> Translated:
        return translate(payload, count_only=True)

    chat, _ = await read_translated(serving, request, read)
    served, _adapter = await serving.resolve(chat.chat.model)
    _messages, _tools, ids = await render_prompt(served, chat.chat, rollout)
    return json_response({"input_tokens": len(ids)})


def error_body(error: APIError) -> dict[str, Any]:
    """``error`` in Anthropic's shape: ``{"type": "error", "error": {"type", "message"}}``.

    Example:
        >>> error_body(APIError(404, "no such model", type="not_found_error"))
        {'type': 'error', 'error': {'type': 'not_found_error', 'message': 'no such model'}}
    """
    return anthropic_error_body(error.status, error.message)


def error_response(error: APIError) -> Response:
    """The answer to an error on the Messages routes, in Anthropic's shape, with its status."""
    return json_response(error_body(error), error.status)


def _event(kind: str, **fields: Any) -> str:
    return named_event(kind, {"type": kind, **fields})


def stream_events(answer: Answer, pacing: StreamPacing | None = None) -> AsyncIterator[str]:
    """The documented event sequence of a streamed message (``MessagesEncoder``).

    Example:
        >>> event_stream(stream_events(answer))  # fragment: an `answer` inside the gateway  # doctest: +SKIP
    """
    return stream_answer([answer.call], MessagesEncoder(answer), pacing)


class MessagesEncoder:
    """The event sequence of a streamed message (``answering.StreamEncoder``):
    ``message_start``, ``ping``, per content block ``content_block_start``, its deltas
    (``thinking_delta`` and ``text_delta`` as sampled; ``input_json_delta`` for a
    ``tool_use`` once the calls are parsed) and ``content_block_stop``, then
    ``message_delta`` (stop reason, usage, and the extension fields ``call_id``,
    ``token_ids``, ``adapter_step``) and ``message_stop``. An error while sampling ends the
    stream with an ``error`` event in Anthropic's shape."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.blocks: list[str] = []  # the kinds of the blocks started, in order
        self.opened = False  # whether the last started block is still open

    def start(self, kind: str, block: dict[str, Any]) -> list[str]:
        events = self.close()
        self.blocks.append(kind)
        self.opened = True
        index = len(self.blocks) - 1
        events.append(_event("content_block_start", index=index, content_block=block))
        return events

    def close(self) -> list[str]:
        if not self.opened:
            return []
        self.opened = False
        return [_event("content_block_stop", index=len(self.blocks) - 1)]

    def text(self, field_name: str, chunk: str) -> list[str]:
        """The events of new text in ``field_name`` (reasoning or content)."""
        events: list[str] = []
        last = self.blocks[-1] if self.opened else None
        if field_name == "reasoning_content":
            if "text" in self.blocks:
                return []  # reasoning after the answer began: only in the record
            if last != "thinking":
                events += self.start(
                    "thinking", {"type": "thinking", "thinking": "", "signature": ""}
                )
            body = {"type": "thinking_delta", "thinking": chunk}
        else:
            if last != "text":
                events += self.start("text", {"type": "text", "text": ""})
            body = {"type": "text_delta", "text": chunk}
        events.append(_event("content_block_delta", index=len(self.blocks) - 1, delta=body))
        return events

    def opening(self) -> Iterable[str]:
        return [_event("message_start", message=self.answer.started()), _event("ping")]

    def delta(self, delta: TextDelta) -> Iterable[str]:
        return self.text(delta.field, delta.text)

    def finished(self, recorded: list[list[LLMCall]], texts: list[StreamedText]) -> Iterable[str]:
        (choices,), (text,) = recorded, texts
        call = choices[0]
        for field_name, rest in text.rest(call).items():  # reasoning first, as written
            yield from self.text(field_name, rest)
        uses = self.answer.tool_uses(call)
        if "text" not in self.blocks and not uses:
            yield from self.start("text", {"type": "text", "text": ""})
        yield from self.close()
        for use in uses:
            yield from self.start("tool_use", {**use, "input": {}})
            partial = json.dumps(use["input"], ensure_ascii=False)
            yield _event(
                "content_block_delta",
                index=len(self.blocks) - 1,
                delta={"type": "input_json_delta", "partial_json": partial},
            )
            yield from self.close()
        reason, sequence = self.answer.stop(call)
        yield _event(
            "message_delta",
            delta={"stop_reason": reason, "stop_sequence": sequence},
            usage=self.answer.usage(call),
            **self.answer.extension(call),
        )
        yield _event("message_stop")

    def failed(
        self, error: APIError, recorded: list[list[LLMCall]], texts: list[StreamedText]
    ) -> Iterable[str]:
        return [_event("error", error=error_body(error)["error"])]


ROUTES = (
    APIRoute("/v1/messages", create, error_response=error_response),
    APIRoute("/v1/messages/count_tokens", count_tokens, error_response=error_response),
)
