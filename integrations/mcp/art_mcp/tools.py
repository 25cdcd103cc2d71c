"""MCP tools as OpenAI tool definitions (and back): names, descriptions, input schemas.

OpenAI function names must match ``^[a-zA-Z0-9_-]{1,64}$``; MCP tool names may contain dots,
slashes or spaces. ``ToolSet`` keeps the mapping both ways. Input schemas are passed through
almost unchanged (JSON Schema either way); only what bloats a small model's prompt for nothing
(pydantic's auto-generated ``title`` of each field, ``$schema``) is dropped.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from typing import Any

import mcp_types

COMPLETE_TASK = "complete_task"
_NAME_OK = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# Keywords whose value is a map of name -> schema / a list of schemas / one schema.
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_ONE = (
    "items",
    "additionalProperties",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
)


def complete_task_tool(max_answer_chars: int | None = None) -> dict[str, Any]:
    """The tool an agent calls to finish: its ``answer`` is the rollout's final answer.

    ``max_answer_chars`` bounds the answer (a grammar-constrained model then always closes
    the call before ``max_tokens``).

    Example:
        >>> complete_task_tool()["function"]["name"]
        'complete_task'
    """
    answer: dict[str, Any] = {"type": "string", "description": "The final answer."}
    if max_answer_chars is not None:
        answer["maxLength"] = max_answer_chars
    return {
        "type": "function",
        "function": {
            "name": COMPLETE_TASK,
            "description": "Finish the task: give the final answer to the user.",
            "parameters": {
                "type": "object",
                "properties": {"answer": answer},
                "required": ["answer"],
                "additionalProperties": False,
            },
        },
    }


def _clean(schema: Any) -> Any:
    """A copy of a JSON schema without ``title`` / ``$schema`` keywords, at every level."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ("title", "$schema"):
            continue
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _clean(sub) for name, sub in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            out[key] = [_clean(sub) for sub in value]
        elif key in _SCHEMA_ONE:
            out[key] = _clean(value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def close_objects(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` on each object schema that has
    ``properties`` and does not set it (what OpenAI's strict mode does).

    Example:
        >>> close_objects({"type": "object", "properties": {"a": {"type": "string"}}})["additionalProperties"]
        False
    """
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: close_objects(sub) for name, sub in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            out[key] = [close_objects(sub) for sub in value]
        elif key in _SCHEMA_ONE:
            out[key] = close_objects(value)
        else:
            out[key] = value
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def input_schema_to_parameters(
    schema: dict[str, Any] | None, *, strict: bool = False
) -> dict[str, Any]:
    """An MCP tool's ``inputSchema`` as OpenAI function ``parameters`` (always an object schema).

    ``strict=True`` also closes the object schemas (see ``close_objects``).

    Example:
        >>> input_schema_to_parameters({"type": "object", "title": "addArguments",
        ...     "properties": {"a": {"type": "integer", "title": "A"}}, "required": ["a"]})
        {'type': 'object', 'properties': {'a': {'type': 'integer'}}, 'required': ['a']}
    """
    if schema is None:
        return {"type": "object", "properties": {}}
    if not isinstance(schema, dict):
        raise ValueError(
            f"a tool's input schema must be a JSON object, got {type(schema).__name__}"
        )
    kind = schema.get("type", "object")
    if kind != "object":
        raise ValueError(f"a tool's input schema must have type 'object', got {kind!r}")
    parameters = _clean(schema)
    parameters["type"] = "object"
    parameters.setdefault("properties", {})
    if strict:
        parameters = close_objects(parameters)
    # keep "type" first: small models read the schema as text
    return {"type": "object", **{k: v for k, v in parameters.items() if k != "type"}}


def openai_name(name: str, taken: set[str]) -> str:
    """A valid, unused OpenAI function name for an MCP tool name.

    Example:
        >>> openai_name("files/read file", set())
        'files_read_file'
    """
    base = name if _NAME_OK.match(name) else (re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64] or "tool")
    candidate, n = base, 2
    while candidate in taken:
        suffix = f"_{n}"
        candidate, n = base[: 64 - len(suffix)] + suffix, n + 1
    return candidate


@dataclass
class ToolSet:
    """The OpenAI tool definitions of an MCP server's tools, and the name mapping.

    Example:
        >>> tools = ToolSet.from_mcp([mcp_types.Tool(name="add", inputSchema={"type": "object"})])
        >>> [t["function"]["name"] for t in tools.definitions]
        ['add']
    """

    definitions: list[dict[str, Any]] = field(default_factory=list)
    mcp_names: dict[str, str] = field(default_factory=dict)  # openai name -> MCP name

    @classmethod
    def from_mcp(
        cls,
        tools: list[mcp_types.Tool],
        *,
        include: list[str] | None = None,
        complete_task: bool = False,
        strict: bool = False,
        max_answer_chars: int | None = None,
    ) -> ToolSet:
        """Convert ``tools`` (only those named in ``include``, when given), then optionally
        add the ``complete_task`` tool. ``strict`` closes the object schemas."""
        if include is not None:
            known = {t.name for t in tools}
            missing = sorted(set(include) - known)
            if missing:
                raise ValueError(f"the server has no tool named {missing}; it has {sorted(known)}")
            tools = [t for t in tools if t.name in include]
        toolset = cls()
        taken = {COMPLETE_TASK} if complete_task else set()
        for tool in tools:
            name = openai_name(tool.name, taken)
            taken.add(name)
            try:
                parameters = input_schema_to_parameters(tool.input_schema, strict=strict)
            except ValueError as exc:
                raise ValueError(f"MCP tool {tool.name!r}: {exc}") from None
            function: dict[str, Any] = {"name": name}
            description = tool.description or tool.title
            if description:
                function["description"] = description.strip()
            function["parameters"] = parameters
            toolset.definitions.append({"type": "function", "function": function})
            toolset.mcp_names[name] = tool.name
        if complete_task:
            toolset.definitions.append(complete_task_tool(max_answer_chars))
        return toolset

    @property
    def names(self) -> list[str]:
        return [d["function"]["name"] for d in self.definitions]

    def parse_arguments(self, raw: str | None) -> dict[str, Any]:
        """A tool call's JSON arguments as a dict; ``ValueError`` with a clear message if not."""
        if raw is None or raw.strip() == "":
            return {}
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"the arguments are not valid JSON ({exc.msg} at {exc.pos})") from None
        if not isinstance(value, dict):
            raise ValueError(f"the arguments must be a JSON object, got {type(value).__name__}")
        return value
