"""OpenAI Responses (``POST /v1/responses``) at the gateway's edge.

A request becomes the gateway's chat request (``translate``); the recorded call becomes a
``response`` object (``response_body``) or its documented event stream (``stream_events``).

Supported: ``input`` as a string or items: messages (roles ``user``, ``assistant``,
``system``, ``developer``; content as a string or ``input_text`` / ``output_text`` parts),
``function_call`` / ``function_call_output``, ``custom_tool_call`` /
``custom_tool_call_output``, ``reasoning`` items (their text carried as the assistant turn's
reasoning); ``instructions``; tools of type ``function`` (strict or not), ``custom`` (free
text, or constrained by a ``regex`` grammar; a ``lark`` grammar is accepted and not
enforced) and ``namespace`` (its tools, named ``{namespace}__{name}`` to the model when the
namespace is not empty); ``tool_choice`` (``auto`` / ``none`` / ``required``, a named
function or custom tool, ``allowed_tools`` by its mode); ``parallel_tool_calls``,
``max_output_tokens`` (lowered to fit the context, recorded), ``temperature``, ``top_p``,
``text.format`` (``text`` / ``json_object`` / ``json_schema``), ``metadata``, ``stream``,
``previous_response_id`` (continues a response this gateway answered and kept for the same
rollout and caller token, ``ResponseStore``: ``store`` false keeps nothing) and ``store``.

Accepted and left out of the prompt, named in each call's ``request_params.ignored_fields``
(and logged once): hosted tools the gateway cannot run (``web_search``, ``file_search``,
``code_interpreter``, ``computer_use_preview``, ``image_generation``, ``mcp``, ``shell``, ...;
also listed in ``request_params.ignored_tools``), ``reasoning``, ``include`` (except
``reasoning.encrypted_content``, which returns the reasoning text as the item's
``encrypted_content`` for clients that echo it back), ``prompt_cache_key``, ``service_tier``,
``truncation``, ``user``, ``safety_identifier``, ``max_tool_calls``, ``top_logprobs``,
``stream_options``, ``context_management`` and any other field; items of hosted tool calls in
the input.

Refused (400): images and files in the input (text models), ``item_reference`` items,
``conversation``, ``prompt`` templates, ``background: true``, an unknown
``previous_response_id`` (one kept for another rollout or token is answered the same way).
"""

from __future__ import annotations

import hashlib
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from art_core.gateway.answering import sample_shielded, stream_answer
from art_core.gateway.deltas import StreamedText, TextDelta
from art_core.gateway.errors import APIError, validation_message
from art_core.gateway.reading import (
    Translated,
    prepare_translated,
    read_translated,
    recorded_fields,
)
from art_core.gateway.requests import PreparedCall
from art_core.gateway.routes import APIRoute
from art_core.gateway.serving import Serving, rollout_id
from art_core.gateway.wire import completion_response, event_stream, named_event
from art_core.trajectories import LLMCall, new_id

API = "responses"
# Fields this module serves (the rest are accepted, ignored and named in the record).
SERVED_FIELDS = frozenset(
    {
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "max_output_tokens",
        "temperature",
        "top_p",
        "text",
        "metadata",
        "stream",
        "previous_response_id",
        "store",
    }
)
# Recorded in fields of their own (messages, tools, metadata) or not about sampling.
NOT_RECORDED = frozenset({"input", "instructions", "tools", "metadata", "stream"})
HOSTED_TOOL_HINT = "hosted tools the gateway cannot run are accepted and left out"
# Items in ``input`` that record what a hosted tool did (the gateway never returns them).
HOSTED_CALL_ITEMS = frozenset(
    {
        "web_search_call",
        "file_search_call",
        "computer_call",
        "computer_call_output",
        "code_interpreter_call",
        "image_generation_call",
        "local_shell_call",
        "local_shell_call_output",
        "shell_call",
        "shell_call_output",
        "apply_patch_call",
        "apply_patch_call_output",
        "mcp_call",
        "mcp_list_tools",
        "mcp_approval_request",
        "mcp_approval_response",
        "tool_search_call",
        "tool_search_output",
        "compaction",
    }
)
MAX_ITEMS = 4096
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
CUSTOM_INPUT = "input"  # a custom tool's free text, as the one argument the model writes


class ResponsesRequest(BaseModel):
    """The top-level fields of a Responses request this gateway reads, with their types
    (checked before anything else; items and tools are checked as they are translated).
    Other fields are accepted and named in the record."""

    model_config = ConfigDict(extra="allow")

    model: str
    input: str | list[Any] | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    text: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    stream: bool | None = None
    previous_response_id: str | None = None
    store: bool | None = None


def _bad(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


def _text_of(content: Any, where: str) -> str:
    """The text of a message's content (a string or a list of text parts)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"{where}.content must be a string or a list of content parts", where)
    texts = []
    for i, part in enumerate(content):
        if not isinstance(part, dict):
            raise _bad(f"{where}.content.{i} must be an object", f"{where}.content.{i}")
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text", "summary_text", "reasoning_text"):
            text = part.get("text")
            if not isinstance(text, str):
                raise _bad(f"{where}.content.{i}.text must be a string", f"{where}.content.{i}")
            texts.append(text)
        elif kind == "refusal":
            texts.append(str(part.get("refusal") or ""))
        elif kind in ("input_image", "input_file", "input_audio"):
            raise _bad(
                f"{where}.content.{i}: {kind} is not supported: the gateway serves text models",
                f"{where}.content.{i}",
            )
        else:
            raise _bad(f"{where}.content.{i}: unknown content part type {kind!r}", where)
    return "".join(texts)


@dataclass
class ToolNames:
    """The tools of a request as the model sees them: function tools, custom tools as a
    function of one string argument, namespaced tools flattened."""

    chat_tools: list[dict[str, Any]] = field(default_factory=list)
    custom: set[str] = field(default_factory=set)  # model-side names of custom tools
    # model-side name -> (namespace, name) for tools in a namespace
    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)  # hosted tool types left out

    def model_name(self, name: str, namespace: str | None) -> str:
        return f"{namespace}__{name}" if namespace else name


def _tools(raw: Any) -> ToolNames:
    names = ToolNames()
    if raw is None:
        return names
    if not isinstance(raw, list):
        raise _bad("tools must be a list", "tools")
    for i, tool in enumerate(raw):
        where = f"tools.{i}"
        if not isinstance(tool, dict):
            raise _bad(f"{where} must be an object", where)
        if tool.get("type") == "namespace":
            namespace, inner = tool.get("name"), tool.get("tools")
            if not isinstance(namespace, str) or not isinstance(inner, list):
                raise _bad(f"{where}: a namespace needs a name and tools", where)
            for j, member in enumerate(inner):
                if not isinstance(member, dict):
                    raise _bad(f"{where}.tools.{j} must be an object", f"{where}.tools.{j}")
                _add_tool(names, member, f"{where}.tools.{j}", namespace or None)
        else:
            _add_tool(names, tool, where, None)
    return names


def _add_tool(names: ToolNames, tool: dict[str, Any], where: str, namespace: str | None) -> None:
    """One function or custom tool as a chat function tool (a hosted tool is only named)."""
    kind = tool.get("type")
    name = tool.get("name")
    if kind not in ("function", "custom"):
        names.ignored.append(str(kind)[:64])
        return
    if not isinstance(name, str) or not NAME.match(name):
        raise _bad(f"{where}.name must be 1-64 letters, digits, '_' or '-'", f"{where}.name")
    model_name = names.model_name(name, namespace)
    if not NAME.match(model_name):
        raise _bad(
            f"{where}: {namespace!r}__{name!r} is longer than the 64 characters of a tool name",
            where,
        )
    description = tool.get("description")
    if description is not None and not isinstance(description, str):
        raise _bad(f"{where}.description must be a string", f"{where}.description")
    if kind == "function":
        parameters = tool.get("parameters")
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        function = {"name": model_name, "parameters": parameters}
        if isinstance(tool.get("strict"), bool):
            function["strict"] = tool["strict"]
    else:
        names.custom.add(model_name)
        function = {"name": model_name, "parameters": _custom_input_schema(tool, where)}
    if description:
        function["description"] = description
    if namespace:
        names.namespaced[model_name] = (namespace, name)
    names.chat_tools.append({"type": "function", "function": function})


def _custom_input_schema(tool: dict[str, Any], where: str) -> dict[str, Any]:
    """A custom tool's free-text input as a function's parameters (``{"input": str}``),
    constrained by its ``regex`` grammar when it has one."""
    text_schema: dict[str, Any] = {"type": "string"}
    fmt = tool.get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "grammar":
        syntax, definition = fmt.get("syntax"), fmt.get("definition")
        if not isinstance(definition, str) or syntax not in ("regex", "lark"):
            raise _bad(
                f"{where}.format: a grammar needs syntax 'regex' or 'lark' and a definition",
                f"{where}.format",
            )
        if syntax == "regex":
            # A JSON Schema pattern matches anywhere in the string: anchored, the whole
            # input must match, as a custom tool's regex grammar means.
            text_schema["pattern"] = f"^(?:{definition})$"
    return {
        "type": "object",
        "properties": {CUSTOM_INPUT: text_schema},
        "required": [CUSTOM_INPUT],
        "additionalProperties": False,
    }


def _tool_choice(raw: Any, names: ToolNames) -> Any:
    if raw is None or raw in ("auto", "none", "required"):
        return raw
    if not isinstance(raw, dict):
        raise _bad("tool_choice must be 'auto', 'none', 'required' or an object", "tool_choice")
    kind = raw.get("type")
    if kind in ("function", "custom"):
        name = raw.get("name")
        if not isinstance(name, str):
            raise _bad("a named tool_choice needs a name", "tool_choice")
        model_name = names.model_name(name, raw.get("namespace"))
        if not any(t["function"]["name"] == model_name for t in names.chat_tools):
            raise _bad(f"tool_choice names {name!r}, which is not among the tools", "tool_choice")
        return {"type": "function", "function": {"name": model_name}}
    if kind == "allowed_tools":
        return "required" if raw.get("mode") == "required" else "auto"
    return "auto"  # a hosted tool: the model may call any of its own tools


def _reasoning_text(item: dict[str, Any], where: str) -> str:
    content = item.get("content")
    if isinstance(content, list) and content:
        return _text_of(content, where)
    summary = item.get("summary")
    if isinstance(summary, list) and summary:
        return "\n\n".join(_text_of([part], f"{where}.summary") for part in summary)
    encrypted = item.get("encrypted_content")
    return encrypted if isinstance(encrypted, str) else ""


def _arguments(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise _bad(f"{where}.arguments must be a JSON string", f"{where}.arguments")
    return value


class _Conversation:
    """Input items folded into chat messages: consecutive assistant items (reasoning, an
    assistant message, calls) make one assistant turn, as the gateway returned them."""

    def __init__(self, names: ToolNames) -> None:
        self.names = names
        self.messages: list[dict[str, Any]] = []
        self.ignored_items: list[str] = []

    def _assistant(self) -> dict[str, Any]:
        last = self.messages[-1] if self.messages else None
        if last is None or last["role"] != "assistant":
            last = {"role": "assistant", "content": ""}
            self.messages.append(last)
        return last

    def add(self, item: Any, where: str) -> None:
        if not isinstance(item, dict):
            raise _bad(f"{where} must be an object", where)
        kind = item.get("type", "message")
        if not isinstance(kind, str):
            raise _bad(f"{where}.type must be a string", f"{where}.type")
        if kind == "message":
            self.add_message(item, where)
        elif kind == "reasoning":
            self.add_reasoning(item, where)
        elif kind in ("function_call", "custom_tool_call"):
            self.add_call(item, kind, where)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str):
                raise _bad(f"{where}.call_id must be a string", f"{where}.call_id")
            text = output if isinstance(output, str) else _text_of(output, f"{where}.output")
            self.messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
        elif kind == "item_reference":
            raise _bad(
                f"{where}: item_reference items are not supported; send the items themselves "
                "or use previous_response_id",
                where,
            )
        elif kind in HOSTED_CALL_ITEMS:
            self.ignored_items.append(kind)
        else:
            raise _bad(f"{where}: unknown input item type {kind!r}", f"{where}.type")

    def add_message(self, item: dict[str, Any], where: str) -> None:
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise _bad(
                f"{where}.role must be user, assistant, system or developer", f"{where}.role"
            )
        text = _text_of(item.get("content"), where)
        if role != "assistant":
            self.messages.append(
                {"role": "system" if role == "developer" else role, "content": text}
            )
            return
        turn = self._assistant()
        if turn.get("tool_calls"):  # a new answer after calls: its own turn
            turn = {"role": "assistant", "content": ""}
            self.messages.append(turn)
        turn["content"] += text

    def add_reasoning(self, item: dict[str, Any], where: str) -> None:
        text = _reasoning_text(item, where)
        turn = self._assistant()
        if turn.get("tool_calls") or turn["content"]:
            turn = {"role": "assistant", "content": ""}
            self.messages.append(turn)
        if text:
            turn["reasoning_content"] = turn.get("reasoning_content", "") + text

    def add_call(self, item: dict[str, Any], kind: str, where: str) -> None:
        call_id, name = item.get("call_id"), item.get("name")
        if not isinstance(call_id, str) or not isinstance(name, str):
            raise _bad(f"{where}: a {kind} needs call_id and name", where)
        namespace = item.get("namespace") if isinstance(item.get("namespace"), str) else None
        model_name = self.names.model_name(name, namespace)
        if kind == "function_call":
            arguments = _arguments(item.get("arguments"), where)
        else:
            free_text = item.get("input")
            if not isinstance(free_text, str):
                raise _bad(f"{where}.input must be a string", f"{where}.input")
            arguments = orjson.dumps({CUSTOM_INPUT: free_text}).decode()
        self._assistant().setdefault("tool_calls", []).append(
            {
                "id": call_id,
                "type": "function",
                "function": {"name": model_name, "arguments": arguments},
            }
        )


def _system_first(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """System and developer messages before the first other message joined into one (chat
    templates take one system message, at the start)."""
    lead = 0
    while lead < len(messages) and messages[lead]["role"] == "system":
        lead += 1
    if lead <= 1:
        return messages
    joined = "\n\n".join(m["content"] for m in messages[:lead] if m["content"])
    return [{"role": "system", "content": joined}, *messages[lead:]]


@dataclass
class StoredResponse:
    """What a later ``previous_response_id`` continues: the conversation's chat messages
    (input and answer, without the instructions, which are not carried over)."""

    messages: list[dict[str, Any]]
    size: int


# Who a stored response belongs to: the rollout of the route that stored it (None on the
# plain ``/v1`` route) and a digest of the caller's token (None when it sent none).
Scope = tuple[str | None, str | None]


def response_scope(request: Request, rollout: str | None) -> Scope:
    """The scope of a request's stored responses: its rollout (None on plain ``/v1``) and the
    SHA-256 of the token it sent (``Authorization: Bearer`` first, else ``x-api-key``, as
    ``art_core.server.auth.bearer_token`` reads them), so the store keeps no token itself.

    Example:
        >>> response_scope(request, "r1")  # fragment: a Starlette `request`  # doctest: +SKIP
        ('r1', '9f86d0...')
    """
    token: str | None = None
    api_key: str | None = None
    for name, value in request.scope.get("headers", []):
        if name == b"authorization" and token is None:
            scheme, _, given = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and given.strip():
                token = given.strip()
        elif name == b"x-api-key" and value.strip():
            api_key = value.decode("latin-1").strip()
    token = token if token is not None else api_key
    digest = None if token is None else hashlib.sha256(token.encode("utf-8")).hexdigest()
    return rollout, digest


class ResponseStore:
    """Responses kept for ``previous_response_id``, newest last, bounded by count and bytes
    (the oldest are forgotten first, whatever their scope; continuing one of those is a 400
    naming it).

    Each response is kept under its ``Scope`` (rollout and caller token) and found only from
    the same scope: the store is gateway-wide, and a rollout is the unit of isolation (its
    calls, its sequences, its reward), so one rollout (or caller) continuing another's
    response would record the other's conversation as its own. A lookup from another scope
    is a plain miss, answered exactly as an unknown id (no oracle of what others kept).

    Example:
        >>> store = ResponseStore(max_responses=2)
        >>> store.put(("r1", None), "resp_1", [{"role": "user", "content": "hi"}])
        >>> store.get(("r1", None), "resp_1")
        [{'role': 'user', 'content': 'hi'}]
        >>> store.get(("r2", None), "resp_1") is None
        True
    """

    def __init__(self, max_responses: int = 4096, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple[Scope, str], StoredResponse] = OrderedDict()
        self._bytes = 0

    def put(self, scope: Scope, response_id: str, messages: list[dict[str, Any]]) -> None:
        size = len(orjson.dumps(messages))
        if size > self.max_bytes:
            return
        key = (scope, response_id)
        replaced = self._items.pop(key, None)
        if replaced is not None:
            self._bytes -= replaced.size
        self._items[key] = StoredResponse(messages, size)
        self._bytes += size
        while len(self._items) > self.max_responses or self._bytes > self.max_bytes:
            self._bytes -= self._items.popitem(last=False)[1].size

    def get(self, scope: Scope, response_id: str) -> list[dict[str, Any]] | None:
        key = (scope, response_id)
        stored = self._items.get(key)
        if stored is None:
            return None
        self._items.move_to_end(key)
        return stored.messages


def _check_supported(payload: dict[str, Any]) -> None:
    """400 for a body of the wrong shape, or asking for what the gateway does not do."""
    try:
        ResponsesRequest.model_validate(payload)
    except ValidationError as exc:
        message, param = validation_message(exc)
        raise APIError(400, message, param=param) from None
    for name in ("conversation", "prompt"):
        if payload.get(name) is not None:
            raise _bad(
                f"{name} is not supported: the gateway keeps no conversations or prompt "
                "templates; send the input (or previous_response_id)",
                name,
            )
    if payload.get("background"):
        raise _bad("background responses are not supported", "background")


def _input_conversation(raw_input: Any, names: ToolNames) -> _Conversation:
    """The request's ``input`` (a string or items) as chat messages."""
    conversation = _Conversation(names)
    if isinstance(raw_input, str):
        conversation.messages.append({"role": "user", "content": raw_input})
    elif isinstance(raw_input, list):
        if len(raw_input) > MAX_ITEMS:
            raise _bad(f"input has {len(raw_input)} items; at most {MAX_ITEMS}", "input")
        for i, item in enumerate(raw_input):
            conversation.add(item, f"input.{i}")
    elif raw_input is not None:
        raise _bad("input must be a string or a list of items", "input")
    return conversation


def _response_format(text: Any) -> dict[str, Any] | None:
    """``text.format`` as the chat request's ``response_format`` (None for plain text)."""
    if text is not None and not isinstance(text, dict):
        raise _bad("text must be an object", "text")
    fmt = (text or {}).get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        return {
            "type": "json_schema",
            "json_schema": {"name": fmt.get("name") or "response", "schema": fmt.get("schema")},
        }
    if isinstance(fmt, dict) and fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise _bad("text.format.type must be text, json_object or json_schema", "text.format")
    return None


def translate(payload: dict[str, Any], previous: list[dict[str, Any]] | None = None) -> Translated:
    """A Responses request as the chat request it becomes (``previous``: the messages of the
    response it continues).

    Example:
        >>> translate({"model": "m", "input": "hi", "instructions": "Be brief."}).chat["messages"]
        [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'hi'}]
    """
    _check_supported(payload)
    names = _tools(payload.get("tools"))
    conversation = _input_conversation(payload.get("input"), names)
    instructions = payload.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _bad("instructions must be a string", "instructions")
    carried = list(previous or [])
    head = [{"role": "system", "content": instructions}] if instructions else []
    messages = _system_first([*head, *carried, *conversation.messages])
    if not messages:
        raise _bad("input is empty: nothing to answer", "input")
    chat: dict[str, Any] = {"model": payload.get("model"), "messages": messages}
    if names.chat_tools:
        chat["tools"] = names.chat_tools
        chat["tool_choice"] = _tool_choice(payload.get("tool_choice"), names)
        if isinstance(payload.get("parallel_tool_calls"), bool):
            chat["parallel_tool_calls"] = payload["parallel_tool_calls"]
    for source, target in (
        ("max_output_tokens", "max_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("metadata", "metadata"),
    ):
        if payload.get(source) is not None:
            chat[target] = payload[source]
    response_format = _response_format(payload.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    recorded = recorded_fields(payload, SERVED_FIELDS, NOT_RECORDED)
    if names.ignored:
        recorded["ignored_tools"] = names.ignored[:32]
    if conversation.ignored_items:
        recorded["ignored_input_items"] = sorted(set(conversation.ignored_items))[:32]
    include = payload.get("include")
    return Translated(
        chat,
        recorded,
        {
            "names": names,
            "tools": payload.get("tools") or [],
            "tool_choice": payload.get("tool_choice") or "auto",
            "encrypted_reasoning": isinstance(include, list)
            and "reasoning.encrypted_content" in include,
            "conversation": [*carried, *conversation.messages],
        },
    )


@dataclass
class Answer:
    """One recorded call as a response: ids handed out once, output items in order."""

    call: PreparedCall
    payload: dict[str, Any]
    translated: Translated
    scope: Scope  # where the response is kept (``ResponseStore``)
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))
    message_id: str = field(default_factory=lambda: new_id("msg"))
    reasoning_id: str = field(default_factory=lambda: new_id("rs"))

    def reasoning_item(self, text: str, status: str = "completed") -> dict[str, Any]:
        item: dict[str, Any] = {
            "type": "reasoning",
            "id": self.reasoning_id,
            "summary": [],
            "content": [{"type": "reasoning_text", "text": text}] if text else [],
            "status": status,
        }
        if self.translated.context["encrypted_reasoning"]:
            item["encrypted_content"] = text
        return item

    def message_item(self, text: str, status: str = "completed") -> dict[str, Any]:
        parts = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
        return {
            "type": "message",
            "id": self.message_id,
            "role": "assistant",
            "status": status,
            "content": parts if status == "completed" else [],
        }

    def call_items(self, recorded: LLMCall) -> list[dict[str, Any]]:
        names: ToolNames = self.translated.context["names"]
        items = []
        for call in recorded.response_message.get("tool_calls") or []:
            model_name = call["function"]["name"]
            arguments = call["function"]["arguments"]
            namespace, name = names.namespaced.get(model_name, (None, model_name))
            item: dict[str, Any]
            if model_name in names.custom:
                try:
                    text = orjson.loads(arguments).get(CUSTOM_INPUT, "")
                except (orjson.JSONDecodeError, AttributeError):
                    text = arguments
                item = {"type": "custom_tool_call", "id": new_id("ctc"), "input": str(text)}
            else:
                item = {"type": "function_call", "id": new_id("fc"), "arguments": arguments}
            item.update({"call_id": call["id"], "name": name, "status": "completed"})
            if namespace:
                item["namespace"] = namespace
            items.append(item)
        return items

    def output(self, recorded: LLMCall) -> list[dict[str, Any]]:
        message = recorded.response_message
        items = []
        if message.get("reasoning_content"):
            items.append(self.reasoning_item(message["reasoning_content"]))
        if message.get("content") or not message.get("tool_calls"):
            items.append(self.message_item(message.get("content") or ""))
        return items + self.call_items(recorded)

    def body(
        self, recorded: LLMCall | None, output: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        """The ``response`` object: in progress (``recorded`` None) or finished."""
        payload = self.payload
        status, incomplete = "in_progress", None
        usage = None
        if recorded is not None:
            status = "incomplete" if recorded.finish_reason == "length" else "completed"
            if status == "incomplete":
                incomplete = {"reason": "max_output_tokens"}
            prompt, completion = recorded.num_prompt_tokens, recorded.num_completion_tokens
            usage = {
                "input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": completion,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + completion,
            }
        fmt = (
            (payload.get("text") or {}).get("format")
            if isinstance(payload.get("text"), dict)
            else None
        )
        body: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": incomplete,
            "instructions": payload.get("instructions"),
            "max_output_tokens": payload.get("max_output_tokens"),
            "model": self.call.chat.model,
            "output": (output if output is not None else self.output(recorded)) if recorded else [],
            "parallel_tool_calls": self.call.chat.parallel_tool_calls,
            "previous_response_id": payload.get("previous_response_id"),
            "reasoning": {"effort": None, "summary": None},
            "store": payload.get("store", True) is not False,
            # What was sampled with (a rollout's own settings replace the request's).
            "temperature": self.call.params.temperature,
            "text": {"format": fmt or {"type": "text"}},
            "tool_choice": self.translated.context["tool_choice"],
            "tools": self.translated.context["tools"],
            "top_p": self.call.params.top_p,
            "truncation": "disabled",
            "usage": usage,
            "metadata": payload.get("metadata") or {},
        }
        if recorded is not None:
            # The extension fields of the chat route: the record's id, the sampled ids and
            # the adapter step that served them.
            body.update(
                call_id=recorded.id,
                token_ids=recorded.completion_token_ids,
                adapter_step=recorded.adapter_step,
            )
        return body


def stored_responses(serving: Serving) -> ResponseStore:
    """The responses ``serving`` keeps for ``previous_response_id`` (one store a gateway)."""
    return serving.state(API, ResponseStore)


def _remember(store: ResponseStore, answer: Answer, recorded: LLMCall) -> None:
    if answer.payload.get("store") is False:
        return
    conversation = answer.translated.context["conversation"]
    store.put(answer.scope, answer.id, [*conversation, recorded.response_message])


def _previous(store: ResponseStore, scope: Scope, payload: dict[str, Any]) -> Any:
    """The messages of the response ``payload`` continues (None when it continues none);
    400 for an id this gateway did not keep for the scope."""
    previous_id = payload.get("previous_response_id")
    if previous_id is None:
        return None
    if not isinstance(previous_id, str):
        raise _bad("previous_response_id must be a string", "previous_response_id")
    previous = store.get(scope, previous_id)
    if previous is None:
        # One message for every miss: whether another rollout or token kept this id
        # is not the caller's to learn.
        raise _bad(
            f"previous_response_id {previous_id[:80]!r} is not a response this "
            "gateway kept for this rollout and token (unknown, kept for another, "
            "answered with store: false, or forgotten)",
            "previous_response_id",
        )
    return previous


async def create(serving: Serving, request: Request) -> Response:
    """``POST /v1/responses``: answer one request as a ``response`` or its event stream.

    Example:
        >>> APIRoute("/v1/responses", create) in ROUTES
        True
    """
    rollout = rollout_id(request)
    scope = response_scope(request, rollout)
    store = stored_responses(serving)
    payloads: list[dict[str, Any]] = []

    def read(payload: dict[str, Any]) -> Translated:
        payloads.append(payload)
        return translate(payload, _previous(store, scope, payload))

    chat, translated = await read_translated(serving, request, read)
    payload = payloads[0]
    if payload.get("stream") not in (None, False, True):
        raise _bad("stream must be a boolean", "stream")
    serving.log_ignored(API, translated.recorded)
    call = await prepare_translated(serving, chat, translated, api=API, rollout_id=rollout)
    answer = Answer(call, payload, translated, scope)
    if payload.get("stream"):
        return event_stream(
            stream_answer([call], ResponsesEncoder(answer, store), serving.stream_pacing)
        )
    (sampled,) = await sample_shielded([call])
    _remember(store, answer, sampled.calls[0])
    return completion_response(answer.body(sampled.calls[0]))


class ResponsesEncoder:
    """The documented event sequence of a streamed response (``answering.StreamEncoder``):
    ``response.created``, ``response.in_progress``, per output item ``output_item.added``,
    its deltas (``reasoning_text.delta``, ``output_text.delta`` as sampled;
    ``function_call_arguments.delta`` / ``custom_tool_call_input.delta`` once the calls are
    parsed) and ``...done`` events, then ``response.completed`` (or ``response.incomplete``)
    with usage; ``error`` and ``response.failed`` when sampling fails. Events are numbered
    (``sequence_number``)."""

    def __init__(self, answer: Answer, store: ResponseStore) -> None:
        self.answer = answer
        self.store = store
        self.sequence = 0
        self.output: list[dict[str, Any]] = []  # the items done, in order
        self.opened: str | None = None  # the item being streamed: "reasoning" or "message"
        self.streamed = {"reasoning_content": "", "content": ""}

    def event(self, kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return named_event(kind, payload)

    def close(self) -> list[str]:
        """The done events of the item being streamed."""
        answer, index = self.answer, len(self.output)
        events = []
        if self.opened == "reasoning":
            whole = self.streamed["reasoning_content"]
            events.append(
                self.event(
                    "response.reasoning_text.done",
                    item_id=answer.reasoning_id,
                    output_index=index,
                    content_index=0,
                    text=whole,
                )
            )
            item = answer.reasoning_item(whole)
        elif self.opened == "message":
            whole = self.streamed["content"]
            part = {"type": "output_text", "text": whole, "annotations": [], "logprobs": []}
            events.append(
                self.event(
                    "response.output_text.done",
                    item_id=answer.message_id,
                    output_index=index,
                    content_index=0,
                    text=whole,
                    logprobs=[],
                )
            )
            events.append(
                self.event(
                    "response.content_part.done",
                    item_id=answer.message_id,
                    output_index=index,
                    content_index=0,
                    part=part,
                )
            )
            item = answer.message_item(whole)
        else:
            return events
        events.append(self.event("response.output_item.done", output_index=index, item=item))
        self.output.append(item)
        self.opened = None
        return events

    def open_item(self, kind: str) -> list[str]:
        """The events that start an item of ``kind`` (closing the one before)."""
        if self.opened == kind:
            return []
        events = self.close() if self.opened is not None else []
        self.opened = kind
        index = len(self.output)
        if kind == "reasoning":
            item = self.answer.reasoning_item("", status="in_progress")
            events.append(self.event("response.output_item.added", output_index=index, item=item))
            return events
        item = self.answer.message_item("", status="in_progress")
        events.append(self.event("response.output_item.added", output_index=index, item=item))
        events.append(
            self.event(
                "response.content_part.added",
                item_id=self.answer.message_id,
                output_index=index,
                content_index=0,
                part={"type": "output_text", "text": "", "annotations": [], "logprobs": []},
            )
        )
        return events

    def text(self, field_name: str, delta: str) -> list[str]:
        """The events of new text in ``field_name`` (reasoning or content)."""
        kind = "reasoning" if field_name == "reasoning_content" else "message"
        if kind == "reasoning" and (
            self.opened == "message" or any(i["type"] == "message" for i in self.output)
        ):
            return []  # reasoning after the answer began: it comes with the final record
        events = self.open_item(kind)
        self.streamed[field_name] += delta
        fields: dict[str, Any] = {
            "item_id": self.answer.reasoning_id if kind == "reasoning" else self.answer.message_id,
            "output_index": len(self.output),
            "content_index": 0,
            "delta": delta,
        }
        if kind == "message":
            fields["logprobs"] = []
        name = (
            "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        )
        events.append(self.event(name, **fields))
        return events

    def call_item_events(self, call_item: dict[str, Any]) -> list[str]:
        """A tool call's item, whole: added, its one delta, done."""
        index = len(self.output)
        custom = call_item["type"] == "custom_tool_call"
        done_field = "input" if custom else "arguments"
        whole = call_item[done_field]
        prefix = "response.custom_tool_call_input" if custom else "response.function_call_arguments"
        added = {**call_item, "status": "in_progress", done_field: ""}
        done: dict[str, Any] = {
            "item_id": call_item["id"],
            "output_index": index,
            done_field: whole,
        }
        if not custom:
            done["name"] = call_item["name"]
        self.output.append(call_item)
        return [
            self.event("response.output_item.added", output_index=index, item=added),
            self.event(f"{prefix}.delta", item_id=call_item["id"], output_index=index, delta=whole),
            self.event(f"{prefix}.done", **done),
            self.event("response.output_item.done", output_index=index, item=call_item),
        ]

    def opening(self) -> Iterable[str]:
        return [
            self.event("response.created", response=self.answer.body(None)),
            self.event("response.in_progress", response=self.answer.body(None)),
        ]

    def delta(self, delta: TextDelta) -> Iterable[str]:
        return self.text(delta.field, delta.text)

    def finished(self, recorded: list[list[LLMCall]], texts: list[StreamedText]) -> Iterable[str]:
        (choices,), (text,) = recorded, texts
        call = choices[0]
        for field_name, rest in text.rest(call).items():  # reasoning first, as written
            yield from self.text(field_name, rest)
        if self.opened is None and not self.output and not call.response_message.get("tool_calls"):
            yield from self.open_item("message")
        yield from self.close()
        for call_item in self.answer.call_items(call):
            yield from self.call_item_events(call_item)
        _remember(self.store, self.answer, call)
        final = self.answer.body(call, self.output)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        yield self.event(kind, response=final)

    def failed(
        self, error: APIError, recorded: list[list[LLMCall]], texts: list[StreamedText]
    ) -> Iterable[str]:
        code = error.code or error.type
        failed = self.answer.body(None)
        failed.update(status="failed", error={"code": code, "message": error.message})
        return [
            self.event("error", code=code, message=error.message, param=None),
            self.event("response.failed", response=failed),
        ]


def stream_events(serving: Serving, answer: Answer) -> AsyncIterator[str]:
    """The events of a streamed response (``ResponsesEncoder``).

    Example:
        >>> event_stream(stream_events(serving, answer))  # fragment: the gateway's `serving` and an `answer`  # doctest: +SKIP
    """
    return stream_answer(
        [answer.call],
        ResponsesEncoder(answer, stored_responses(serving)),
        serving.stream_pacing,
    )


ROUTES = (APIRoute("/v1/responses", create),)
