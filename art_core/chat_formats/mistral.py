"""Mistral tool calls, after the ``[TOOL_CALLS]`` control token.

Two spellings, both parsed: a JSON list ``[TOOL_CALLS][{"name": ..., "arguments": {...}}]``
(v3 tokenizers: Mistral 7B v0.3, Nemo, Small 2409/2501) and one call per token
``[TOOL_CALLS]name[ARGS]{...}`` (v11+: Small 3.2, Magistral, Devstral; v7's
``[CALL_ID]id`` between them is read and dropped). A forced call is written the way the
model's template renders calls (``[ARGS]`` in the template: the second). Mistral's templates
accept only 9-character alphanumeric call ids, so those are the ids handed out.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from art_core.chat_formats.answer import (
    ParsedAnswer,
    arguments_json,
    decode_json_prefix,
    short_call_id,
    tool_call,
)
from art_core.chat_formats.base import ToolCallFormat, ToolIndex
from art_core.chat_formats.hermes import partial_json_call
from art_core.chat_formats.markup import Markup
from art_core.chat_formats.schemas import (
    call_object_schemas,
    embeddable,
    json_rule,
    one_of,
    parameters_of,
)

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"
_CALL_START = re.compile(r'\{\s*"name"')
_NAMED = re.compile(r"\s*([A-Za-z0-9_-]+)\s*(?:\[CALL_ID\]\s*[A-Za-z0-9]*\s*)?\[ARGS\]")


class MistralFormat(ToolCallFormat):
    """``[TOOL_CALLS]`` followed by a JSON list of calls, or by ``name[ARGS]{...}``.

    Example:
        >>> f = MistralFormat()
        >>> f.parse('[TOOL_CALLS][{"name": "f", "arguments": {"x": 1}}]', {"f": {}}).tool_calls[0]["function"]
        {'name': 'f', 'arguments': '{"x": 1}'}
        >>> f.parse('[TOOL_CALLS]f[ARGS]{"x": 2}', {"f": {}}).tool_calls[0]["function"]
        {'name': 'f', 'arguments': '{"x": 2}'}
    """

    name = "mistral"
    tokens = (TOOL_CALLS, ARGS, CALL_ID)
    markers = (TOOL_CALLS,)

    def __init__(self, style: Literal["list", "args"] = "list") -> None:
        self.style = style

    def new_call_id(self) -> str:
        return short_call_id()

    def parse(self, text: str, tools: ToolIndex) -> ParsedAnswer:
        opened = text.find(TOOL_CALLS)
        if opened < 0:
            return ParsedAnswer(content=text)
        content = text[:opened].rstrip() or None
        calls: list[dict[str, Any]] = []
        for block in text[opened + len(TOOL_CALLS) :].split(TOOL_CALLS):
            read = self._read_block(block, tools)
            if read is None:  # not a call of a known tool: the whole answer stays content
                return ParsedAnswer(content=text)
            block_calls, cut = read
            calls.extend(block_calls)
            if cut:
                return ParsedAnswer(content, calls, truncated=True, parser=self.name)
        return ParsedAnswer(content, calls, parser=self.name)

    def _read_block(self, block: str, tools: ToolIndex) -> tuple[list[dict[str, Any]], bool] | None:
        """The calls of the text after one ``[TOOL_CALLS]`` and whether it was cut short."""
        named = _NAMED.match(block)
        if named is not None:
            name, rest = named.group(1), block[named.end() :]
            if name not in tools:
                return None
            decoded = decode_json_prefix(rest)
            if decoded is None:  # cut inside the arguments
                return [tool_call(name, rest.strip(), self.new_call_id())], True
            arguments, end = decoded
            if not isinstance(arguments, dict) or rest[end:].strip():
                return None
            return [tool_call(name, arguments_json(arguments), self.new_call_id())], False
        decoded = decode_json_prefix(block)
        if decoded is None:
            return self._read_cut_list(block.lstrip(), tools)
        value, end = decoded
        if block[end:].strip():
            return None
        calls = self._list_calls(value, tools)
        return (calls, False) if calls else None

    def _read_cut_list(
        self, cut: str, tools: ToolIndex
    ) -> tuple[list[dict[str, Any]], bool] | None:
        """A list of calls cut short: its whole calls, then the one being written."""
        starts = [m.start() for m in _CALL_START.finditer(cut)]
        if not cut.startswith("[") or not starts:
            return None
        call = partial_json_call(cut[starts[-1] :], tools, self.new_call_id())
        if call is None:
            return None
        whole = self._list_calls(f"{cut[: starts[-1]].rstrip().rstrip(',')}]", tools)
        return [*(whole or []), call], True

    def _list_calls(self, value: Any, tools: ToolIndex) -> list[dict[str, Any]] | None:
        if isinstance(value, str):
            decoded = decode_json_prefix(value)
            value = decoded[0] if decoded else None
        calls = []
        for item in value if isinstance(value, list) else [value]:
            if not isinstance(item, dict):
                return None
            name, arguments = item.get("name"), item.get("arguments", {})
            if name not in tools or not isinstance(arguments, dict):
                return None
            calls.append(tool_call(name, arguments_json(arguments), self.new_call_id()))
        return calls

    def grammar(self, tools: list[dict[str, Any]], *, parallel: bool, markup: Markup) -> str:
        start = markup.literal(TOOL_CALLS)
        if self.style == "args":
            rules, alternatives = [], []
            for index, tool in enumerate(tools):
                name = tool["function"]["name"]
                schema, defs = embeddable(parameters_of(tool, {}), "p")
                alternatives.append(f"call_{index}")
                rules.append(
                    f"call_{index}: {start} {markup.literal(name)} {markup.literal(ARGS)} "
                    f"{json_rule(schema or {'type': 'object'}, defs)}"
                )
            repeat = "+" if parallel else ""
            return f"calls: ({' | '.join(alternatives)}){repeat}\n" + "\n".join(rules) + "\n"
        schemas, defs = call_object_schemas(tools)
        listing = {"type": "array", "items": one_of(schemas), "minItems": 1}
        if not parallel:
            listing["maxItems"] = 1
        return f"calls: {start} call_list\ncall_list: {json_rule(listing, defs)}\n"
