"""Parse ``<tool_call>{...}</tool_call>`` blocks (Hermes / Qwen format) out of model text.

What OpenAI answers is what a client expects, so: complete blocks become ``tool_calls``; a
block cut short by ``max_tokens`` becomes a tool call with the partial ``arguments`` text
(the finish reason says ``length``), and its markup never reaches ``content``; text around
the blocks stays the content (trailing whitespace dropped), or ``None`` when there is none.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_PARTIAL_NAME = re.compile(r'^\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)("?)')
_ARGUMENTS = re.compile(r'"(?:arguments|parameters)"\s*:\s*')


@dataclass
class ParsedAssistant:
    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    # A tool call was cut short (its arguments are a prefix of the JSON the model meant).
    truncated: bool = False

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message


def parse_tool_calls(text: str, tool_names: set[str]) -> ParsedAssistant:
    """Split model text into content and OpenAI ``tool_calls``.

    A complete block whose JSON is invalid or names an unknown tool is left in the content,
    as the model wrote it: the agent (and the reward) should see the mistake, not a silent
    drop. An unclosed block at the end (the answer was cut) is a partial call.

    Example:
        >>> p = parse_tool_calls('<tool_call>\\n{"name": "f", "arguments": {"x": 1}}\\n</tool_call>', {"f"})
        >>> p.tool_calls[0]["function"]
        {'name': 'f', 'arguments': '{"x": 1}'}
        >>> cut = parse_tool_calls('<tool_call>\\n{"name": "f", "arguments": {"x": 1', {"f"})
        >>> cut.content, cut.truncated, cut.tool_calls[0]["function"]["arguments"]
        (None, True, '{"x": 1')
    """
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    position = 0
    for match in TOOL_CALL_RE.finditer(text):
        call = _parse_one(match.group(1), tool_names)
        if call is None:
            continue
        kept.append(text[position : match.start()])
        position = match.end()
        calls.append(call)
    rest = text[position:]
    truncated = False
    opened = rest.rfind(TOOL_CALL_OPEN)
    if opened >= 0 and TOOL_CALL_CLOSE not in rest[opened:]:
        # An unclosed block: the answer ended inside a tool call.
        partial = _parse_partial(rest[opened + len(TOOL_CALL_OPEN) :], tool_names)
        rest = rest[:opened]
        truncated = True
        if partial is not None:
            calls.append(partial)
    kept.append(rest)
    if not calls and not truncated:
        return ParsedAssistant(content=text)
    content = "".join(kept).rstrip()
    return ParsedAssistant(content=content or None, tool_calls=calls, truncated=truncated)


def _new_call(name: str, arguments: str) -> dict[str, Any]:
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _parse_one(body: str, tool_names: set[str]) -> dict[str, Any] | None:
    try:
        payload = json.loads(body)
    except json.JSONDecodeError:
        return None
    return _call_of(payload, tool_names)


def _call_of(payload: Any, tool_names: set[str]) -> dict[str, Any] | None:
    if not isinstance(payload, dict):
        return None
    name = payload.get("name")
    arguments = payload.get("arguments", payload.get("parameters", {}))
    if not isinstance(name, str) or name not in tool_names or not isinstance(arguments, dict):
        return None
    return _new_call(name, json.dumps(arguments, ensure_ascii=False))


def _parse_partial(body: str, tool_names: set[str]) -> dict[str, Any] | None:
    """The call an unfinished block was writing: its tool (a complete name, or the one tool
    a cut name can still become) and its arguments so far; None when no tool is certain."""
    try:  # the call's JSON is whole and only the closing tag was cut: that call, exactly
        payload, _ = json.JSONDecoder().raw_decode(body.lstrip())
    except json.JSONDecodeError:
        payload = None
    if payload is not None:
        return _call_of(payload, tool_names)
    match = _PARTIAL_NAME.match(body)
    if match is None:
        return None
    name, closed = match.group(1), bool(match.group(2))
    candidates = (
        [n for n in tool_names if n == name]
        if closed
        else [n for n in tool_names if n.startswith(name)]
    )
    if len(candidates) != 1:
        return None
    found = _ARGUMENTS.search(body, match.end())
    arguments = body[found.end() :].rstrip() if found else ""
    return _new_call(candidates[0], arguments)
