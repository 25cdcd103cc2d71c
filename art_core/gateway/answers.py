"""How a choice's sampled ids become its answer, while streamed and once recorded.

Two readers, one per kind of API: ``ChatFormatReader`` reads the served model's chat format
(reasoning, content, tool calls in the family's markup; the chat APIs), ``RawTextReader``
the plain decoded text (Completions: no template, no parsing). The stream core asks a
reader for each choice's text so far (``streamed``), the recorder for the whole answer
(``answer``): the two agree, so a choice's streamed deltas are a prefix of its record.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from art_core.chat_formats import ChatFormat, ParsedAnswer
from art_core.chat_formats.decoding import TextStream, decode_ids
from art_core.chat_formats.format import safe_before
from art_core.engines.base import GenerationResult, SamplingParams


class ServedChat(Protocol):
    """What a reader needs of the served model: its chat format and tokenizer."""

    @property
    def format(self) -> ChatFormat: ...

    @property
    def tokenizer(self) -> Any: ...


class Served(Protocol):
    @property
    def chat(self) -> ServedChat: ...

    @property
    def tokenizer(self) -> Any: ...


class ReadCall(Protocol):
    """What a reader needs of a prepared call (``requests.PreparedCall`` has it): the
    served model, the sampling parameters (stop strings), the tools and how the prompt
    ended."""

    @property
    def served(self) -> Served: ...

    @property
    def params(self) -> SamplingParams: ...

    @property
    def tools(self) -> list[dict[str, Any]] | None: ...

    @property
    def parses_tools(self) -> bool: ...

    @property
    def opened_reasoning(self) -> bool: ...


@dataclass(frozen=True)
class ChoiceAnswer:
    """A choice's recorded answer: the assistant message, the finish reason, and what the
    call's metadata gains (how tool calls were parsed)."""

    message: dict[str, Any]
    finish_reason: str
    metadata: dict[str, Any] = field(default_factory=dict)


class AnswerReader(Protocol):
    """Reads a choice's ids: ``text_stream`` and ``streamed`` while sampling, ``answer``
    once done."""

    def text_stream(self, call: ReadCall) -> TextStream:
        """The text of a choice's ids as they are sampled, as ``streamed`` reads it."""
        ...

    def streamed(self, call: ReadCall, text: str) -> dict[str, str | None] | None:
        """The text fields of the text sampled so far (``text_stream``'s: reasoning_content,
        content), holding back what may still change; None while it ends inside a
        character."""
        ...

    def answer(self, call: ReadCall, result: GenerationResult) -> ChoiceAnswer:
        """The whole answer of a finished choice."""
        ...


class ChatFormatReader:
    """The served model's chat format reads the answer (``served.chat.format``): reasoning,
    tool calls in the family's markup, or (lenient) bare call JSON, which is noted in the
    call's metadata as ``tool_call_parser: "bare_json"``.

    Example:
        >>> reader = ChatFormatReader()
        >>> reader.answer(prepared, result).message["role"]  # fragment: a `prepared` call and the engine's `result`  # doctest: +SKIP
        'assistant'
    """

    def text_stream(self, call: ReadCall) -> TextStream:
        return call.served.chat.format.text_stream(parses_tools=call.parses_tools)

    def streamed(self, call: ReadCall, text: str) -> dict[str, str | None] | None:
        if text.endswith("\ufffd"):
            return None  # an incomplete UTF-8 sequence: wait for the next token
        reasoning, content = call.served.chat.format.stream_split(
            safe_before(text, [s for s in call.params.stop if s]),
            parses_tools=call.parses_tools,
            opened_reasoning=call.opened_reasoning,
        )
        return {"reasoning_content": reasoning, "content": content}

    def answer(self, call: ReadCall, result: GenerationResult) -> ChoiceAnswer:
        parsed = self.parse(call, result)
        finish = result.finish_reason
        if parsed.tool_calls and finish == "stop" and not parsed.truncated:
            finish = "tool_calls"
        parsed_by = {"tool_call_parser": parsed.parser} if parsed.tool_calls else {}
        return ChoiceAnswer(parsed.message(), finish, parsed_by)

    @staticmethod
    def parse(call: ReadCall, result: GenerationResult) -> ParsedAnswer:
        """The answer one choice's ids make, in the served model's chat format (a stop
        string that ended it is cut first)."""
        chat_format = call.served.chat.format
        text = chat_format.decode(result.token_ids, parses_tools=call.parses_tools)
        if result.stop_string and result.stop_string in text:
            text = text[: text.index(result.stop_string)]
        return chat_format.parse(
            text,
            call.tools,
            parses_tools=call.parses_tools,
            opened_reasoning=call.opened_reasoning,
        )


@dataclass(frozen=True)
class RawTextReader:
    """The plain decoded text (special tokens skipped unless ``skip_special`` is false), cut
    at the first stop string: Completions' answer.

    Example:
        >>> RawTextReader(skip_special=False).answer(prepared, result).message  # fragment: a `prepared` call and the engine's `result`  # doctest: +SKIP
        {'role': 'assistant', 'content': 'Hello'}
    """

    skip_special: bool = True

    def text(self, call: ReadCall, ids: list[int]) -> str:
        return decode_ids(call.served.tokenizer, ids, skip_special_tokens=self.skip_special)

    def text_stream(self, call: ReadCall) -> TextStream:
        return TextStream(call.served.tokenizer, skip_special_tokens=self.skip_special)

    def streamed(self, call: ReadCall, text: str) -> dict[str, str | None] | None:
        if text.endswith("\ufffd"):
            return None  # an incomplete UTF-8 sequence: wait for the next token
        return {"content": safe_before(text, call.params.stop)}

    def answer(self, call: ReadCall, result: GenerationResult) -> ChoiceAnswer:
        text = self.text(call, result.token_ids)
        ends = [i for s in call.params.stop if s and (i := text.find(s)) >= 0]
        content = text[: min(ends)] if ends else text
        return ChoiceAnswer({"role": "assistant", "content": content}, result.finish_reason)


CHAT_FORMAT = ChatFormatReader()
