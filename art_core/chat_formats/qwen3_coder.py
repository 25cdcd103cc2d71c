"""Qwen3-Coder tool calls: XML-like ``<function=NAME>`` blocks with one ``<parameter=P>`` per
argument, inside ``<tool_call>`` markup::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

Parameter values are text: a string parameter's value is taken as written, any other is
read as JSON (a value that is not JSON is kept as text: the tool sees the mistake). The
parameter types come from the tools' schemas.
"""

from __future__ import annotations

import json
import re
from typing import Any

from art_core.chat_formats.answer import (
    ParsedAnswer,
    answer_with_calls,
    arguments_json,
    tool_call,
)
from art_core.chat_formats.base import ToolCallFormat, ToolIndex
from art_core.chat_formats.markup import Markup
from art_core.chat_formats.schemas import embeddable, json_rule

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_OPEN_BLOCK = re.compile(r"(?:<tool_call>\s*)?<function=([^>\n]+)>")
_OPEN_PARAMETER = re.compile(r"\s*<parameter=([^>\n]+)>\n?")
_CLOSE_FUNCTION = re.compile(r"\s*</function>(?:\s*</tool_call>)?")
_CLOSED = re.compile(r"</function>")
_OPEN_FUNCTION = re.compile(r"(?:<tool_call>\s*)?<function=([^>\n]*)(>?)")
_VALUE_END = "\n</parameter>"


def _text_choices(schema: Any) -> list[str] | None:
    """The values of a parameter that is an enum (or const) of strings, else None."""
    if not isinstance(schema, dict):
        return None
    values = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if isinstance(values, list) and values and all(isinstance(v, str) for v in values):
        return values
    return None


def _value(text: str, schema: Any) -> Any:
    """A parameter's value: text for a string parameter, else its JSON (text if invalid)."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind == "string" or kind == ["string"] or _text_choices(schema) is not None:
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _read_call(
    text: str, position: int, parameters: dict[str, Any]
) -> tuple[dict[str, Any], int, bool] | None:
    """The parameters written from ``position`` (just after ``<function=NAME>``), where the
    call ends, and whether it was closed; None when the text there is not parameters.

    Read in order, as the grammar writes them: a value runs to the first ``\\n</parameter>``
    (so it may hold any other markup text)."""
    properties = parameters.get("properties") or {}
    arguments: dict[str, Any] = {}
    while True:
        closing = _CLOSE_FUNCTION.match(text, position)
        if closing is not None:
            return arguments, closing.end(), True
        opening = _OPEN_PARAMETER.match(text, position)
        if opening is None:
            return (arguments, len(text), False) if not text[position:].strip() else None
        name = opening.group(1).strip()
        end = text.find(_VALUE_END, opening.end())
        if end < 0:  # cut inside this value: the parameters before it
            return arguments, len(text), False
        arguments[name] = _value(text[opening.end() : end], properties.get(name))
        position = end + len(_VALUE_END)


class Qwen3CoderFormat(ToolCallFormat):
    """``<tool_call><function=...><parameter=...>`` blocks.

    Example:
        >>> text = "<tool_call>\\n<function=f>\\n<parameter=n>\\n3\\n</parameter>\\n</function>\\n</tool_call>"
        >>> Qwen3CoderFormat().parse(text, {"f": {"properties": {"n": {"type": "integer"}}}}).tool_calls[0]["function"]
        {'name': 'f', 'arguments': '{"n": 3}'}
    """

    name = "qwen3_coder"
    tokens = (TOOL_CALL_OPEN, TOOL_CALL_CLOSE)
    markers = (TOOL_CALL_OPEN, "<function=")

    def parse(self, text: str, tools: ToolIndex) -> ParsedAnswer:
        calls: list[dict[str, Any]] = []
        kept: list[str] = []
        position = 0
        truncated = False
        for opening in _OPEN_BLOCK.finditer(text):
            if opening.start() < position:
                continue  # inside a call already read (a value may hold markup text)
            name = opening.group(1).strip()
            read = _read_call(text, opening.end(), tools.get(name, {}))
            if read is None:  # not a call: left in the content as written
                continue
            arguments, end, whole = read
            if name not in tools:
                continue
            kept.append(text[position : opening.start()])
            position = end
            if not whole:  # cut by max_tokens: the whole parameters so far, JSON unclosed
                calls.append(tool_call(name, arguments_json(arguments)[:-1], self.new_call_id()))
                truncated = True
                break
            calls.append(tool_call(name, arguments_json(arguments), self.new_call_id()))
        rest = text[position:]
        if not truncated:
            opened = min((i for m in self.markers if (i := rest.find(m)) >= 0), default=-1)
            if (
                opened >= 0
                and _OPEN_FUNCTION.match(rest[opened:])
                and not _CLOSED.search(rest[opened:])
            ):
                truncated = True  # cut inside the markup, before a call could be read
                partial = self._partial(rest[opened:], tools)
                rest = rest[:opened]
                if partial is not None:
                    calls.append(partial)
        kept.append(rest)
        return answer_with_calls(text, kept, calls, truncated, self.name)

    def _partial(self, block: str, tools: ToolIndex) -> dict[str, Any] | None:
        """A call cut inside its ``<function=`` markup: its tool when certain, no arguments."""
        match = _OPEN_FUNCTION.match(block)
        if match is None:
            return None
        name = match.group(1).strip()
        candidates = (
            [n for n in tools if n == name]
            if match.group(2)
            else [n for n in tools if n.startswith(name)]
        )
        if len(candidates) != 1:
            return None
        return tool_call(candidates[0], "", self.new_call_id())

    def grammar(self, tools: list[dict[str, Any]], *, parallel: bool, markup: Markup) -> str:
        rules: list[str] = []
        functions: list[str] = []
        for t, tool in enumerate(tools):
            parameters = tool["function"].get("parameters") or {}
            properties = parameters.get("properties") or {}
            required = set(parameters.get("required") or [])
            parts = []
            for p, (name, schema) in enumerate(properties.items()):
                rule = f"p_{t}_{p}"
                head = json.dumps(f"<parameter={name}>\n")
                choices = _text_choices(schema)
                if choices is not None:  # an enum of strings: one of them, as text
                    rules.append(
                        f'{rule}: {head} ({" | ".join(map(json.dumps, choices))}) "\\n</parameter>\\n"'
                    )
                elif isinstance(schema, dict) and schema.get("type") == "string":
                    # Any text; the stop string closes it (and is part of the value's lexeme).
                    rules.append(f'{rule}: {head} v_{t}_{p} "\\n"')
                    rules.append(f'v_{t}_{p}[stop="\\n</parameter>"]: /(.|\\n)*/')
                else:
                    value, defs = embeddable(schema if isinstance(schema, dict) else {}, "v")
                    rules.append(f'{rule}: {head} v_{t}_{p} "\\n</parameter>\\n"')
                    rules.append(f"v_{t}_{p}: {json_rule(value or {}, defs)}")
                parts.append(rule if name in required else f"{rule}?")
            head = json.dumps(f"<function={tool['function']['name']}>\n")
            rules.append(f'f_{t}: {head} {" ".join(parts)} "</function>\\n"')
            functions.append(f"f_{t}")
        repeat = ' ("\\n" tool_call)*' if parallel else ""
        return (
            f"calls: tool_call{repeat}\n"
            f'tool_call: {markup.literal(TOOL_CALL_OPEN)} "\\n" ({" | ".join(functions)}) '
            f"{markup.literal(TOOL_CALL_CLOSE)}\n" + "\n".join(rules) + "\n"
        )
