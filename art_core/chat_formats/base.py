"""The interface every tool-call format implements (one module per model family).

A format owns everything that depends on how a family writes tool calls, so the parts
that must agree cannot disagree: ``parse`` (model text -> calls), ``grammar`` (what a forced
call may be: always something ``parse`` accepts), ``markers`` (where streamed content must
stop, because markup starts there) and the ids of the calls it hands out.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from art_core.chat_formats.answer import ParsedAnswer, openai_call_id
from art_core.chat_formats.markup import Markup

# Tools by name: the parameters schema of each (what typed parsing needs).
ToolIndex = dict[str, dict[str, Any]]


def tool_index(tools: list[dict[str, Any]] | None) -> ToolIndex:
    """``tools`` (OpenAI function tools) by name.

    Example:
        >>> tool_index([{"type": "function", "function": {"name": "f"}}])
        {'f': {}}
    """
    return {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools or []}


class ToolCallFormat(ABC):
    """How one model family writes tool calls."""

    # The name users pick it by (vLLM's ``--tool-call-parser`` names where they exist).
    name: ClassVar[str]
    # Markup strings that may be special tokens and must survive decoding.
    tokens: ClassVar[tuple[str, ...]] = ()
    # Text that starts tool-call markup anywhere in an answer: streamed content stops there.
    markers: ClassVar[tuple[str, ...]] = ()
    # Text that starts a tool call only at the very start of an answer (bare JSON).
    leading: ClassVar[tuple[str, ...]] = ()
    # The format also carries reasoning and final text in its own markup (gpt-oss): every
    # answer is parsed, with or without tools.
    parses_every_answer: ClassVar[bool] = False

    @abstractmethod
    def parse(self, text: str, tools: ToolIndex) -> ParsedAnswer:
        """Split ``text`` into content and tool calls of known tools. A call that does not
        parse (bad JSON, unknown tool) stays in the content as written: the agent and the
        reward see the mistake. An unclosed call at the end is a partial (``truncated``)."""

    @abstractmethod
    def grammar(self, tools: list[dict[str, Any]], *, parallel: bool, markup: Markup) -> str:
        """Lark rules (``calls`` is the entry rule) for one call of one of ``tools`` (several
        with ``parallel``), spelled as this format writes them."""

    def parse_stream(self, text: str) -> ParsedAnswer:
        """For ``parses_every_answer`` formats: the reasoning and content of an answer
        still being sampled (messages that may become calls held back)."""
        return self.parse(text, {})

    def turn_end(self, text: str, start: int) -> tuple[int, str] | None:
        """Where the assistant turn rendered from ``start`` of a template's ``text`` ends and
        with which end text, when the format knows better than "the first end-of-turn
        token" (a harmony turn holds several messages); None: it does not."""
        return None

    def new_call_id(self) -> str:
        """The id of a call this format hands out."""
        return openai_call_id()
