"""Llama 3.x tool calls: the answer is ``{"name": ..., "parameters": {...}}`` (JSON-based
tool calling of Llama 3.1-3.3), several separated by ``; ``, optionally after
``<|python_tag|>``.

The format has no closing markup: the answer *is* the call. So a call is recognised only when
the whole answer is call JSON; anything else is content.
"""

from __future__ import annotations

from typing import Any

from art_core.chat_formats.answer import ParsedAnswer
from art_core.chat_formats.bare_json import parse_cut_json_call, parse_json_calls
from art_core.chat_formats.base import ToolIndex
from art_core.chat_formats.hermes import HermesFormat
from art_core.chat_formats.markup import Markup
from art_core.chat_formats.schemas import call_object_schemas, json_rule, one_of

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonFormat(HermesFormat):
    """Bare JSON calls with a ``parameters`` key.

    Example:
        >>> p = Llama3JsonFormat().parse('{"name": "f", "parameters": {"x": 1}}', {"f": {}})
        >>> p.tool_calls[0]["function"]["arguments"], p.content
        ('{"x": 1}', None)
    """

    name = "llama3_json"
    tokens = (PYTHON_TAG,)
    markers = (PYTHON_TAG,)
    leading = ("{",)

    def parse(self, text: str, tools: ToolIndex) -> ParsedAnswer:
        parsed = parse_json_calls(text, tools, self, prefix=PYTHON_TAG)
        if parsed is not None:
            parsed.parser = self.name
            return parsed
        cut = parse_cut_json_call(text, tools, self.new_call_id(), prefix=PYTHON_TAG)
        if cut is not None:
            return ParsedAnswer(None, [cut], truncated=True, parser=self.name)
        return ParsedAnswer(content=text)

    def grammar(self, tools: list[dict[str, Any]], *, parallel: bool, markup: Markup) -> str:
        schemas, defs = call_object_schemas(tools, arguments_key="parameters")
        repeat = ' ("; " call)*' if parallel else ""
        return f"calls: call{repeat}\ncall: {json_rule(one_of(schemas), defs)}\n"
