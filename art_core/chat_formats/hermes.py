"""Hermes / Qwen2.5 / Qwen3 tool calls: ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``.

What OpenAI answers is what a client expects, so: complete blocks become ``tool_calls``; a
block cut short by ``max_tokens`` becomes a tool call with the partial ``arguments`` text
(the finish reason says ``length``), and its markup never reaches ``content``; text around
the blocks stays the content (trailing whitespace dropped), or ``None`` when there is none.
Qwen's tokenizers have ``<tool_call>`` as an added token; the project's ChatML template
(tiny-random, SmolLM2) spells it as text: the grammar's quoted literal allows both.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from art_core.chat_formats.answer import (
    ParsedAnswer,
    answer_with_calls,
    arguments_json,
    tool_call,
)
from art_core.chat_formats.base import ToolCallFormat, ToolIndex
from art_core.chat_formats.markup import Markup
from art_core.chat_formats.schemas import call_object_schemas, json_rule, one_of

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_PARTIAL_NAME = re.compile(r'^\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)("?)')
_ARGUMENTS = re.compile(r'"(?:arguments|parameters)"\s*:\s*')


class HermesFormat(ToolCallFormat):
    """``<tool_call>`` blocks holding one JSON object each.

    Example:
        >>> p = HermesFormat().parse('<tool_call>\\n{"name": "f", "arguments": {"x": 1}}\\n</tool_call>', {"f": {}})
        >>> p.tool_calls[0]["function"]
        {'name': 'f', 'arguments': '{"x": 1}'}
        >>> cut = HermesFormat().parse('<tool_call>\\n{"name": "f", "arguments": {"x": 1', {"f": {}})
        >>> cut.content, cut.truncated, cut.tool_calls[0]["function"]["arguments"]
        (None, True, '{"x": 1')
    """

    name = "hermes"
    tokens: ClassVar[tuple[str, ...]] = (TOOL_CALL_OPEN, TOOL_CALL_CLOSE)
    markers: ClassVar[tuple[str, ...]] = (TOOL_CALL_OPEN,)

    def parse(self, text: str, tools: ToolIndex) -> ParsedAnswer:
        calls: list[dict[str, Any]] = []
        kept: list[str] = []
        position = 0
        for match in TOOL_CALL_RE.finditer(text):
            call = self._parse_one(match.group(1), tools)
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
            partial = self._parse_partial(rest[opened + len(TOOL_CALL_OPEN) :], tools)
            rest = rest[:opened]
            truncated = True
            if partial is not None:
                calls.append(partial)
        kept.append(rest)
        return answer_with_calls(text, kept, calls, truncated, self.name)

    def grammar(self, tools: list[dict[str, Any]], *, parallel: bool, markup: Markup) -> str:
        schemas, defs = call_object_schemas(tools)
        repeat = ' ("\\n" tool_call)*' if parallel else ""
        return (
            f"calls: tool_call{repeat}\n"
            f'tool_call: {markup.literal(TOOL_CALL_OPEN)} "\\n" call "\\n" '
            f"{markup.literal(TOOL_CALL_CLOSE)}\n"
            f"call: {json_rule(one_of(schemas), defs)}\n"
        )

    def call_of(self, payload: Any, tools: ToolIndex) -> dict[str, Any] | None:
        """The tool call a decoded ``{"name": ..., "arguments": {...}}`` object stands for
        (``parameters`` is accepted for ``arguments``, as Llama writes it)."""
        if not isinstance(payload, dict):
            return None
        name = payload.get("name")
        arguments = payload.get("arguments", payload.get("parameters", {}))
        if not isinstance(name, str) or name not in tools or not isinstance(arguments, dict):
            return None
        return tool_call(name, arguments_json(arguments), self.new_call_id())

    def _parse_one(self, body: str, tools: ToolIndex) -> dict[str, Any] | None:
        try:
            payload = json.loads(body)
        except json.JSONDecodeError:
            return None
        return self.call_of(payload, tools)

    def _parse_partial(self, body: str, tools: ToolIndex) -> dict[str, Any] | None:
        """The call an unfinished block was writing: its tool (a complete name, or the one
        tool a cut name can still become) and its arguments so far; None when no tool is
        certain."""
        try:  # the call's JSON is whole and only the closing tag was cut: that call, exactly
            payload, _ = json.JSONDecoder().raw_decode(body.lstrip())
        except json.JSONDecodeError:
            payload = None
        if payload is not None:
            return self.call_of(payload, tools)
        return partial_json_call(body, tools, self.new_call_id())


def partial_json_call(body: str, tools: ToolIndex, call_id: str) -> dict[str, Any] | None:
    """The call a cut ``{"name": "...", "arguments": ...`` was writing, when its tool is
    certain (a complete name, or the one tool a cut name can still become).

    Example:
        >>> partial_json_call('{"name": "fi', {"find": {}, "get": {}}, "c1")["function"]
        {'name': 'find', 'arguments': ''}
    """
    match = _PARTIAL_NAME.match(body)
    if match is None:
        return None
    name, closed = match.group(1), bool(match.group(2))
    candidates = (
        [n for n in tools if n == name] if closed else [n for n in tools if n.startswith(name)]
    )
    if len(candidates) != 1:
        return None
    found = _ARGUMENTS.search(body, match.end())
    arguments = body[found.end() :].rstrip() if found else ""
    return tool_call(candidates[0], arguments, call_id)
