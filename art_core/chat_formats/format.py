"""One model's chat format: its tool-call format, its reasoning tags, its tokenizer's markup.

The gateway asks it everything that depends on the model family: the text of sampled ids,
the answer they make (content, reasoning, tool calls), the grammar of a forced call, what
part of an answer being streamed is safe to send, and where an assistant turn ends when the
template renders it back into history.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from art_core.chat_formats.answer import ParsedAnswer
from art_core.chat_formats.bare_json import BARE_JSON_OPENINGS, lenient_calls
from art_core.chat_formats.base import ToolCallFormat, tool_index
from art_core.chat_formats.decoding import TextStream
from art_core.chat_formats.hermes import HermesFormat
from art_core.chat_formats.markup import Markup
from art_core.chat_formats.reasoning import ThinkTags

# Tokens of the generation prompt read to tell whether it opens a reasoning block.
_PROMPT_TAIL_TOKENS = 16


@dataclass
class ChatFormat:
    """A model's tool-call format and reasoning tags over its tokenizer.

    ``lenient``: an answer that is nothing but bare call JSON (not the model's own format) is
    read as tool calls too (marked ``parser="bare_json"``).

    Example:
        >>> from transformers import AutoTokenizer
        >>> from art_core.chat_formats.registry import chat_format_for
        >>> from art_core.embedded import resolve_base_model
        >>> chat_format = chat_format_for(AutoTokenizer.from_pretrained(resolve_base_model("tiny-qwen3")))
        >>> tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        ...     "type": "object", "properties": {"city": {"type": "string"}}}}}]
        >>> text = '<tool_call>\\n{"name": "get_weather", "arguments": {"city": "Paris"}}\\n</tool_call>'
        >>> answer = chat_format.parse(text, tools, parses_tools=True, opened_reasoning=False)
        >>> [call["function"] for call in answer.tool_calls]
        [{'name': 'get_weather', 'arguments': '{"city": "Paris"}'}]
    """

    tools: ToolCallFormat
    markup: Markup
    reasoning: ThinkTags | None = None
    lenient: bool = True

    @property
    def name(self) -> str:
        return self.tools.name

    def describe(self) -> dict[str, Any]:
        """What this format is, for logs and the model's info."""
        return {
            "tool_call_parser": self.tools.name,
            "reasoning_parser": self.reasoning.name if self.reasoning else None,
        }

    # ------------------------------------------------------------------ reading answers
    def keeps_markup(self, parses_tools: bool) -> bool:
        """Whether answers are decoded with the format's special tokens kept."""
        return parses_tools or self.tools.parses_every_answer

    def decode(self, ids: Sequence[int], *, parses_tools: bool) -> str:
        """The text of sampled ``ids`` as the parser reads it."""
        return self.markup.decode(ids, keep_markup=self.keeps_markup(parses_tools))

    def text_stream(self, *, parses_tools: bool) -> TextStream:
        """``decode``'s text of sampled ids that come a few at a time (a streamed answer)."""
        return self.markup.text_stream(keep_markup=self.keeps_markup(parses_tools))

    def opened_reasoning(self, prompt_ids: Sequence[int]) -> bool:
        """Whether the prompt ends inside a reasoning block (the answer starts in it)."""
        if self.reasoning is None:
            return False
        tail = self.markup.decode(prompt_ids[-_PROMPT_TAIL_TOKENS:], keep_markup=False)
        return self.reasoning.opened_by(tail)

    def parse(
        self,
        text: str,
        tools: list[dict[str, Any]] | None,
        *,
        parses_tools: bool,
        opened_reasoning: bool,
    ) -> ParsedAnswer:
        """The answer ``text`` makes: reasoning, then tool calls (of ``tools``, when
        ``parses_tools``) in the model's format, else (``lenient``) as bare JSON, else
        content."""
        reasoning = None
        if self.reasoning is not None:
            reasoning, text = self.reasoning.split(text, opened=opened_reasoning)
        index = tool_index(tools) if parses_tools else {}
        if parses_tools or self.tools.parses_every_answer:
            parsed = self.tools.parse(text, index)
            if not parsed.tool_calls and not parsed.truncated and parses_tools and self.lenient:
                reader = self.tools if isinstance(self.tools, HermesFormat) else HermesFormat()
                parsed = lenient_calls(text, index, reader) or parsed
        else:
            parsed = ParsedAnswer(content=text)
        if reasoning is not None:
            parsed.reasoning = reasoning
            if parsed.content == "":
                parsed.content = None if parsed.tool_calls else ""
        return parsed

    # ---------------------------------------------------------------- forcing tool calls
    def tool_call_grammar(
        self, tools: list[dict[str, Any]], *, parallel: bool, opened_reasoning: bool
    ) -> str:
        """A Lark grammar whose every sentence is a call (several with ``parallel``) of one
        of ``tools`` in this format (after an optional reasoning block for thinking models).

        Example:
            >>> from transformers import AutoTokenizer
            >>> from art_core.chat_formats.registry import chat_format_for
            >>> from art_core.embedded import resolve_base_model
            >>> chat_format = chat_format_for(AutoTokenizer.from_pretrained(resolve_base_model("tiny-qwen3")))
            >>> tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
            >>> grammar = chat_format.tool_call_grammar(tools, parallel=False, opened_reasoning=False)
            >>> print(grammar.splitlines()[0])  # Qwen3 may think first: <think> is token 716
            start: (<[716]> reason SPACE)? calls
        """
        if not tools:
            raise ValueError("a tool call can only be forced when `tools` are given")
        rules = self.tools.grammar(tools, parallel=parallel, markup=self.markup)
        if self.reasoning is None:
            return f"start: calls\n{rules}"
        think = self.reasoning
        # The reasoning's text ends at the closing tag (the stop string is part of it).
        reason = f"reason[stop={self.markup.literal(think.close)}]: /(.|\\n)*/\n"
        if self.markup.is_token(think.close):  # a token, not text: it cannot be a stop string
            reason = (
                f"reason: REASON_TEXT {self.markup.literal(think.close)}\nREASON_TEXT: /(.|\\n)*/\n"
            )
        opening = "" if opened_reasoning else f"{self.markup.literal(think.open)} "
        block = f"{opening}reason SPACE"
        start = f"start: {block} calls\n" if opened_reasoning else f"start: ({block})? calls\n"
        return f"{start}{reason}SPACE: /[ \\t\\n]*/\n{rules}"

    # ---------------------------------------------------------------------- streaming
    def stream_split(
        self, text: str, *, parses_tools: bool, opened_reasoning: bool
    ) -> tuple[str | None, str]:
        """(reasoning, content) of an answer still being sampled that can be sent now: the
        same text the whole answer's ``parse`` gives, less what may still change."""
        if self.tools.parses_every_answer:
            parsed = self.tools.parse_stream(text)
            return parsed.reasoning, parsed.content or ""
        reasoning = None
        if self.reasoning is not None:
            reasoning, text = self.reasoning.stream_split(text, opened=opened_reasoning)
        if not parses_tools:
            return reasoning, text
        stripped = text.lstrip()
        openings = self.tools.leading + (BARE_JSON_OPENINGS if self.lenient else ())
        if any(stripped.startswith(o) or o.startswith(stripped) for o in openings):
            return reasoning, ""  # may be a call written as JSON: known at the end
        return reasoning, safe_before(text, self.tools.markers).rstrip()

    def turn_end(self, text: str, start: int, end_texts: Sequence[str]) -> tuple[int, str] | None:
        """Where an assistant turn rendered from ``start`` of a template's ``text`` ends, and
        with which end text (the first of ``end_texts``, unless the format knows better)."""
        found = self.tools.turn_end(text, start)
        if found is not None:
            return found
        ends = [(i, end) for end in end_texts if (i := text.find(end, start)) >= 0]
        return min(ends, key=lambda found: found[0]) if ends else None


def safe_before(text: str, markers: Sequence[str]) -> str:
    """``text`` up to the first of ``markers``, less an end that may still grow into one.

    Example:
        >>> safe_before("Sure.\\n<tool_ca", ["<tool_call>"])
        'Sure.\\n'
    """
    end = len(text) - partial_marker_suffix(text, markers)
    for marker in markers:
        found = text.find(marker)
        if found >= 0:
            end = min(end, found)
    return text[:end]


def partial_marker_suffix(text: str, markers: Sequence[str]) -> int:
    """The length of the longest end of ``text`` that starts one of ``markers``."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if marker.startswith(text[-size:]):
                longest = size
                break
    return longest
