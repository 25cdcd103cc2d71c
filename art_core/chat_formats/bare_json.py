"""Tool calls written as bare JSON: the whole answer is ``{"name": ..., "arguments": ...}``.

Llama 3.x writes its calls this way by design (``{"name": ..., "parameters": ...}``, several
separated by ``;``, sometimes after ``<|python_tag|>``). Other models do it by mistake, in
their own format's place (Qwen2.5 at 0.5B writes a bare object, or one in a ```json fence):
the lenient fallback reads those too, and records that it did, so a reward can tell a call
in the model's own format from one that was guessed.
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


def parse_json_calls(
    text: str, tools: ToolIndex, reader: HermesFormat, *, prefix: str | None = None
) -> ParsedAnswer | None:
    """The calls of an answer that is nothing but call objects (one, several separated by
    ``;``, a list, or a fenced block of those), or None when it is anything else.

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
    position = 0
    while position < len(body):
        decoded = decode_json_prefix(body[position:])
        if decoded is None:
            return None
        value, end = decoded
        position += end
        for item in value if isinstance(value, list) else [value]:
            call = reader.call_of(item, tools)
            if call is None:
                return None
            calls.append(call)
        while position < len(body) and body[position] in _SEPARATORS:
            position += 1
    return ParsedAnswer(content=None, tool_calls=calls) if calls else None


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
    """The fallback: an answer whose whole content is bare call JSON, marked as such."""
    parsed = parse_json_calls(text, tools, reader)
    if parsed is not None:
        parsed.parser = "bare_json"
    return parsed
