"""JSON Schemas of tool calls, as llguidance's ``%json`` needs them.

Compact, canonical JSON (``JSON_OPTIONS``), matching how chat templates render tool calls
back into the prompt (``{"name": "f", "arguments": {...}}``): the sampled text is then what
the next turn's prompt contains, so multi-turn token ids stay a clean prefix chain.
"""

from __future__ import annotations

import json
from typing import Any

JSON_OPTIONS: dict[str, Any] = {
    "whitespace_flexible": False,
    "key_separator": ": ",
    "item_separator": ", ",
}
EMPTY_OBJECT: dict[str, Any] = {"type": "object", "properties": {}}

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


def parameters_of(tool: dict[str, Any], default: dict[str, Any] = EMPTY_OBJECT) -> dict[str, Any]:
    """A tool's parameters schema (an empty object schema when it has none); for a
    ``strict`` tool, every object of it closed (see ``closed``).

    Example:
        >>> parameters_of({"function": {"name": "f", "strict": True,
        ...                             "parameters": {"type": "object", "properties": {}}}})
        {'type': 'object', 'properties': {}, 'additionalProperties': False}
    """
    parameters = tool["function"].get("parameters") or default
    return closed(parameters) if tool["function"].get("strict") else parameters


# Keywords whose values are subschemas, and those whose values map names to subschemas.
_SUBSCHEMA = frozenset({"items", "additionalItems", "contains", "not", "if", "then", "else"})
_SUBSCHEMA_LISTS = frozenset({"anyOf", "oneOf", "allOf", "prefixItems"})
_SUBSCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions"})


def closed(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` on every object schema that does not
    say otherwise: what a strict tool means (OpenAI's strict mode requires it; Anthropic's
    strict tools match the schema exactly), so a forced call names only declared keys.

    Example:
        >>> closed({"type": "object", "properties": {"a": {"type": "object"}}})
        {'type': 'object', 'properties': {'a': {'type': 'object', 'additionalProperties': False}}, 'additionalProperties': False}
    """
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _SUBSCHEMA:
            out[key] = closed(value)
        elif key in _SUBSCHEMA_LISTS and isinstance(value, list):
            out[key] = [closed(item) for item in value]
        elif key in _SUBSCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: closed(item) for name, item in value.items()}
        else:
            out[key] = value
    is_object = schema.get("type") == "object" or "properties" in schema
    if is_object and "additionalProperties" not in schema:
        out["additionalProperties"] = False
    return out


def embeddable(parameters: dict[str, Any], key: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``parameters`` as a subschema of a bigger one, and the ``$defs`` it then needs.

    A tool's ``parameters`` is a schema document of its own: its ``$ref``s (pydantic's
    ``#/$defs/Model``, a recursive ``#``) point at its own root. Nested in a wrapper they
    would point at the wrapper's root instead, so a schema with references moves to the
    root ``$defs`` (under ``key``) with its references rebased there.

    Example:
        >>> embeddable({"type": "object"}, "t0")
        ({'type': 'object'}, {})
    """
    if '"$ref"' not in json.dumps(parameters):
        return parameters, {}
    # Its own `$id` / `$schema` would make it a separate document again: dropped.
    own = {k: v for k, v in parameters.items() if k not in ("$id", "$schema")}
    return {"$ref": f"#/$defs/{key}"}, {key: _rebase_refs(own, f"/$defs/{key}")}


def call_object_schemas(
    tools: list[dict[str, Any]], *, arguments_key: str = "arguments"
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One ``{"name": ..., "<arguments_key>": ...}`` schema per tool, and the root ``$defs``.

    Example:
        >>> call_object_schemas([{"function": {"name": "f"}}])[0][0]["properties"]["name"]
        {'const': 'f'}
    """
    schemas: list[dict[str, Any]] = []
    defs: dict[str, Any] = {}
    for index, tool in enumerate(tools):
        parameters, more = embeddable(parameters_of(tool), f"tool_{index}_parameters")
        defs.update(more)
        schemas.append(
            {
                "type": "object",
                "properties": {
                    "name": {"const": tool["function"]["name"]},
                    arguments_key: parameters,
                },
                "required": ["name", arguments_key],
                "additionalProperties": False,
            }
        )
    return schemas, defs


def json_rule(schema: dict[str, Any], defs: dict[str, Any] | None = None) -> str:
    """A Lark ``%json`` body for ``schema``: canonical JSON, and keywords llguidance cannot
    enforce (``not``, ``if``/``then``, ``uniqueItems``...) left unenforced (its ``lenient``
    mode) rather than refusing the request: the call still parses, with its tool's name."""
    if defs:
        schema = {**schema, "$defs": {**schema.get("$defs", {}), **defs}}
    return f"%json {json.dumps({**schema, 'x-guidance': {**JSON_OPTIONS, 'lenient': True}})}"


def one_of(schemas: list[dict[str, Any]]) -> dict[str, Any]:
    """The schema matching any of ``schemas``."""
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
