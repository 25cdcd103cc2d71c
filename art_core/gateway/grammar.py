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


# Keywords whose values are data, not subschemas: a {"$ref": ...} inside them is left alone.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})


def _rebase_refs(node: Any, base: str) -> Any:
    """``node`` with every document-root ``$ref`` (``#``, ``#/...``) moved under ``base``."""
    if isinstance(node, list):
        return [_rebase_refs(item, base) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "$ref" and isinstance(value, str) and (value == "#" or value.startswith("#/")):
            out[key] = f"#{base}{value[1:]}"
        elif key in _DATA_KEYWORDS:
            out[key] = value
        else:
            out[key] = _rebase_refs(value, base)
    return out


def _tool_call_schemas(tools: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One ``{"name": ..., "arguments": ...}`` schema per tool, and the root ``$defs``.

    A tool's ``parameters`` is a schema document of its own: its ``$ref``s (pydantic's
    ``#/$defs/Model``, a recursive ``#``) point at its own root. Nested under ``arguments``
    they would point at the wrapper's root instead, so a parameters schema with references
    is moved to the root ``$defs`` and its references rebased there.
    """
    schemas: list[dict[str, Any]] = []
    defs: dict[str, Any] = {}
    for index, tool in enumerate(tools):
        function = tool["function"]
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
        if '"$ref"' in json.dumps(parameters):
            key = f"tool_{index}_parameters"
            # Its own `$id` / `$schema` would make it a separate document again: dropped.
            own = {k: v for k, v in parameters.items() if k not in ("$id", "$schema")}
            defs[key] = _rebase_refs(own, f"/$defs/{key}")
            parameters = {"$ref": f"#/$defs/{key}"}
        schemas.append(
            {
                "type": "object",
                "properties": {"name": {"const": function["name"]}, "arguments": parameters},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    return schemas, defs


def tool_call_grammar(tools: list[dict[str, Any]], *, parallel: bool = True) -> str:
    """A Lark grammar forcing one (or, with ``parallel``, several) ``<tool_call>`` blocks.

    Any parameters schema accepted with ``tool_choice="auto"`` works here: references are
    rebased (see ``_tool_call_schemas``), and keywords llguidance cannot enforce (``not``,
    ``if``/``then``, ``uniqueItems``, ...) are left unenforced (its ``lenient`` mode) rather
    than refusing the request; the call still parses, with the tool's name.

    Example:
        >>> tool_call_grammar([{"type": "function", "function": {"name": "f"}}])[:6]
        'start:'
    """
    if not tools:
        raise ValueError("a tool call can only be forced when `tools` are given")
    schemas, defs = _tool_call_schemas(tools)
    schema: dict[str, Any] = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    if defs:
        schema = {**schema, "$defs": defs}
    schema = {**schema, "x-guidance": {**JSON_OPTIONS, "lenient": True}}
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
