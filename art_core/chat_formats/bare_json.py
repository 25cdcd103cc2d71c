"""Tool calls written as bare JSON: the whole answer is ``{"name": ..., "arguments": ...}``.

Llama 3.x writes its calls this way by design (``{"name": ..., "parameters": ...}``, several
separated by ``;``, sometimes after ``<|python_tag|>``). Other models do it by mistake, in
their own format's place (Qwen2.5 at 0.5B writes a bare object, or one in a ```json fence):
the lenient fallback reads those too, and records that it did, so a reward can tell a call
in the model's own format from one that was guessed.

A small model also names tools that do not exist while giving the arguments of one that does
(Qwen2.5-Coder-0.5B under Claude Code: ``{"name": "CreateFile", "arguments": {"file_path":
"hello.txt", "content": "hello"}}``, where ``Write`` takes exactly those). The fallback takes
such a call as the one declared tool its arguments fit (every key one of its properties,
every required one given; none or several fitting: no call) and records it as
``bare_json_renamed``: the completion keeps the name the model wrote, and a reward can see it.
"""

from __future__ import annotations

import re
from typing import Any

from art_core.chat_formats.answer import ParsedAnswer, decode_json_prefix
from art_core.chat_formats.base import ToolIndex
from art_core.chat_formats.hermes import HermesFormat, partial_json_call

_FENCE = re.compile(r"^```(?:json)?[ \t]*\n?(.*?)\n?```$", re.DOTALL)
_SEPARATORS = " \t\r\n;,"
# The openings of an answer that may turn out to be a bare call: streaming holds them back.
BARE_JSON_OPENINGS = ("{", "[", "```")


def tool_fitting(arguments: Any, tools: ToolIndex) -> str | None:
    """The one tool of ``tools`` whose parameters ``arguments`` fit (each key one of its
    properties, each of its required properties given), or None when none or several do.

    Example:
        >>> tools = {"Write": {"properties": {"file_path": {}, "content": {}},
        ...                    "required": ["file_path", "content"]},
        ...          "Read": {"properties": {"file_path": {}}, "required": ["file_path"]}}
        >>> tool_fitting({"file_path": "a", "content": "b"}, tools)
        'Write'
        >>> tool_fitting({"file_path": "a"}, tools)  # Write's content is required
        'Read'
        >>> tool_fitting({"path": "a"}, tools) is None
        True
    """
    if not isinstance(arguments, dict) or not arguments:
        return None
    keys = set(arguments)
    fitting = []
    for name, schema in tools.items():
        properties = schema.get("properties") if isinstance(schema, dict) else None
        required = schema.get("required", []) if isinstance(schema, dict) else []
        if (
            isinstance(properties, dict)
            and isinstance(required, list)
            and keys <= set(properties)
            and set(required) <= keys
        ):
            fitting.append(name)
    return fitting[0] if len(fitting) == 1 else None


def _renamed(item: Any, tools: ToolIndex) -> dict[str, Any] | None:
    """``item`` with its unknown tool's name replaced by the one tool its arguments fit."""
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return None
    if item["name"] in tools:
        return None
    arguments = item.get("arguments", item.get("parameters"))
    name = tool_fitting(arguments, tools)
    return None if name is None else {**item, "name": name}


def parse_json_calls(
    text: str,
    tools: ToolIndex,
    reader: HermesFormat,
    *,
    prefix: str | None = None,
    rename: bool = False,
) -> ParsedAnswer | None:
    """The calls of an answer that is nothing but call objects (one, several separated by
    ``;``, a list, or a fenced block of those), or None when it is anything else. With
    ``rename``, a call naming no tool of ``tools`` is the one its arguments fit, if any
    (``tool_fitting``; the answer's ``parser`` then says ``bare_json_renamed``).

    Example:
        >>> p = parse_json_calls('{"name": "f", "parameters": {"x": 1}}', {"f": {}}, HermesFormat())
        >>> p.tool_calls[0]["function"]["arguments"]
        '{"x": 1}'
    """
    body = text.strip()
    if prefix and body.startswith(prefix):
        body = body[len(prefix) :].strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1).strip()
    if not body.startswith(("{", "[")):
        return None
    calls: list[dict[str, Any]] = []
    renamed = False
    position = 0
    while position < len(body):
        decoded = decode_json_prefix(body[position:])
        if decoded is None:
            return None
        value, end = decoded
        position += end
        for item in value if isinstance(value, list) else [value]:
            call = reader.call_of(item, tools)
            if call is None and rename:
                fixed = _renamed(item, tools)
                call = None if fixed is None else reader.call_of(fixed, tools)
                renamed = renamed or call is not None
            if call is None:
                return None
            calls.append(call)
        while position < len(body) and body[position] in _SEPARATORS:
            position += 1
    if not calls:
        return None
    parsed = ParsedAnswer(content=None, tool_calls=calls)
    if renamed:
        parsed.parser = "bare_json_renamed"
    return parsed


def parse_cut_json_call(
    text: str, tools: ToolIndex, call_id: str, *, prefix: str | None = None
) -> dict[str, Any] | None:
    """The call a bare-JSON answer cut by ``max_tokens`` was writing (see
    ``partial_json_call``), or None."""
    body = text.strip()
    if prefix and body.startswith(prefix):
        body = body[len(prefix) :].strip()
    if not body.startswith("{") or decode_json_prefix(body) is not None:
        return None
    return partial_json_call(body, tools, call_id)


def lenient_calls(text: str, tools: ToolIndex, reader: HermesFormat) -> ParsedAnswer | None:
    """The fallback: an answer whose whole content is bare call JSON, marked as such (a call
    naming no tool is the one its arguments fit: ``bare_json_renamed``)."""
    parsed = parse_json_calls(text, tools, reader, rename=True)
    if parsed is not None and parsed.parser != "bare_json_renamed":
        parsed.parser = "bare_json"
    return parsed
