"""Grammars for constrained decoding (llguidance) from OpenAI request fields.

llguidance was chosen over xgrammar and outlines because it is a 3 MB wheel with no
dependencies (xgrammar pulls triton, ~1 GB, which it does not need on CPU), compiles JSON
schemas and Lark grammars in milliseconds, and computes a token mask in ~10 µs per step.
"""

from __future__ import annotations

import json
from typing import Any

# Compact, canonical JSON, matching how the chat template renders tool calls back into the
# prompt (`{"name": "f", "arguments": {...}}`): the sampled text is then exactly what the
# next turn's prompt contains, so multi-turn token ids stay a clean prefix chain.
JSON_OPTIONS: dict[str, Any] = {
    "whitespace_flexible": False,
    "key_separator": ": ",
    "item_separator": ", ",
}


def _tool_call_schema(tool: dict[str, Any]) -> dict[str, Any]:
    function = tool["function"]
    parameters = function.get("parameters") or {"type": "object", "properties": {}}
    return {
        "type": "object",
        "properties": {"name": {"const": function["name"]}, "arguments": parameters},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def tool_call_grammar(tools: list[dict[str, Any]], *, parallel: bool = True) -> str:
    """A Lark grammar forcing one (or, with ``parallel``, several) ``<tool_call>`` blocks.

    Example:
        >>> tool_call_grammar([{"type": "function", "function": {"name": "f"}}])[:6]
        'start:'
    """
    if not tools:
        raise ValueError("a tool call can only be forced when `tools` are given")
    schemas = [_tool_call_schema(tool) for tool in tools]
    schema: dict[str, Any] = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    schema = {**schema, "x-guidance": JSON_OPTIONS}
    repeat = ' ("\\n" tool_call)*' if parallel else ""
    return (
        f"start: tool_call{repeat}\n"
        'tool_call: "<tool_call>\\n" call "\\n</tool_call>"\n'
        f"call: %json {json.dumps(schema)}\n"
    )


def json_grammar(schema: dict[str, Any] | None) -> str:
    """A grammar for ``response_format``: any JSON object, or one matching ``schema``.

    Example:
        >>> json_grammar(None).startswith("start:")
        True
    """
    schema = {"type": "object"} if schema is None else schema
    return f"start: %json {json.dumps({**schema, 'x-guidance': JSON_OPTIONS})}\n"
