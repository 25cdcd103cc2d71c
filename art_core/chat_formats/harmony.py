"""gpt-oss's harmony format: an answer is a sequence of messages on channels.

After the generation prompt ``<|start|>assistant`` the model writes messages such as::

    <|channel|>analysis<|message|>I should look it up.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.lookup <|constrain|>json<|message|>{"q": "x"}<|call|>

or ends with ``<|channel|>final<|message|>The answer.<|return|>``. ``analysis`` is reasoning,
``final`` (and ``commentary`` addressed to no one: a preamble) is content, a message to
``functions.NAME`` is a tool call (the recipient may also sit before the channel, in the
header). The markup is special tokens, so every answer is parsed, with or without tools.
"""

from __future__ import annotations

import json
import re
from typing import Any

from art_core.chat_formats.answer import ParsedAnswer, tool_call
from art_core.chat_formats.base import ToolCallFormat, ToolIndex
from art_core.chat_formats.markup import Markup
from art_core.chat_formats.schemas import embeddable, json_rule, parameters_of

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
CONSTRAIN, CALL, RETURN = "<|constrain|>", "<|call|>", "<|return|>"
_ENDS = re.compile(r"<\|end\|>|<\|call\|>|<\|return\|>|<\|endoftext\|>")
_CHANNEL = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_MARKUP = re.compile(r"<\|(?:start|end|message|channel|constrain|call|return|endoftext)\|>")


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


class HarmonyFormat(ToolCallFormat):
    """Channels and recipients of gpt-oss messages.

    Example:
        >>> text = "<|channel|>analysis<|message|>hmm<|end|><|start|>assistant<|channel|>final<|message|>Hi<|return|>"
        >>> p = HarmonyFormat().parse(text, {})
        >>> p.reasoning, p.content
        ('hmm', 'Hi')
    """

    name = "openai"
    tokens = (START, END, MESSAGE, CHANNEL, CONSTRAIN, CALL, RETURN)
    parses_every_answer = True

    def parse_stream(self, text: str) -> ParsedAnswer:
        return self.parse(text, {}, streaming=True)

    def parse(self, text: str, tools: ToolIndex, *, streaming: bool = False) -> ParsedAnswer:
        """See ``ToolCallFormat.parse``; ``streaming``: the answer so far, whose messages to
        a recipient are held back (they become calls, or content once known not to be)."""
        if MESSAGE not in text:
            if CHANNEL in text:  # a header cut short: no message yet
                return ParsedAnswer(content=None)
            plain = _MARKUP.sub("", text).strip()  # no harmony markup: the text is content
            return ParsedAnswer(content=plain or None)
        reasoning: list[str] = []
        content: list[str] = []
        calls: list[dict[str, Any]] = []
        truncated = False
        for piece in text.split(START):
            header, found, rest = piece.partition(MESSAGE)
            if not found:
                continue  # a header cut short, or text between messages: not a message
            ended = _ENDS.search(rest)
            body = rest[: ended.start()] if ended else rest
            channel_match = _CHANNEL.search(header)
            channel = channel_match.group(1) if channel_match else ""
            recipient_match = _RECIPIENT.search(header)
            recipient = recipient_match.group(1) if recipient_match else None
            if recipient is not None and streaming:
                continue
            if recipient is not None and recipient.startswith("functions."):
                name = recipient.removeprefix("functions.")
                call = self._call(name, body, tools, whole=ended is not None)
                if call is not None:
                    calls.append(call)
                    # Without its end token (<|call|> is an end of turn, which decoding
                    # may drop) a call is whole when its arguments are.
                    truncated = truncated or (ended is None and not _is_json(body))
                    continue
                content.append(body)  # an unknown tool or bad arguments: shown as written
            elif channel == "analysis":
                reasoning.append(body)
            else:
                content.append(body)
        text_content = "".join(content).strip()
        return ParsedAnswer(
            content=text_content or None,
            tool_calls=calls,
            reasoning="\n".join(reasoning).strip() if reasoning else None,
            truncated=truncated,
            parser=self.name if calls else None,
        )

    def _call(
        self, name: str, body: str, tools: ToolIndex, *, whole: bool
    ) -> dict[str, Any] | None:
        if name not in tools:
            return None
        try:
            arguments = json.loads(body) if body.strip() or whole else None
        except json.JSONDecodeError:
            arguments = None
        if arguments is None:
            if whole:
                return None
            # Cut by max_tokens inside the arguments: the arguments so far.
            return tool_call(name, body.strip(), self.new_call_id())
        if not isinstance(arguments, dict):
            return None
        return tool_call(name, json.dumps(arguments, ensure_ascii=False), self.new_call_id())

    def grammar(self, tools: list[dict[str, Any]], *, parallel: bool, markup: Markup) -> str:
        lit = markup.literal
        rules = [
            # Reasoning first, if the model wants it (special tokens never match the text).
            f'analysis: {lit(CHANNEL)} "analysis" {lit(MESSAGE)} ANALYSIS_TEXT {lit(END)} '
            f'{lit(START)} "assistant"',
            "ANALYSIS_TEXT: /(.|\\n)*/",
        ]
        alternatives = []
        for index, tool in enumerate(tools):
            schema, defs = embeddable(parameters_of(tool, {}), "p")
            recipient = json.dumps(f"commentary to=functions.{tool['function']['name']} ")
            rules.append(
                f'call_{index}: {lit(CHANNEL)} {recipient} {lit(CONSTRAIN)} "json" '
                f"{lit(MESSAGE)} {json_rule(schema or {'type': 'object'}, defs)}"
            )
            alternatives.append(f"call_{index}")
        # One call per answer: harmony ends the turn with <|call|> after each call.
        return f"calls: analysis? ({' | '.join(alternatives)})\n" + "\n".join(rules) + "\n"

    def turn_end(self, text: str, start: int) -> tuple[int, str] | None:
        """Where the assistant turn rendered at ``start`` ends in a history: the end token
        before the first message that is not the assistant's (a turn may hold several)."""
        for match in re.finditer(re.escape(START), text[start:]):
            following = text[start + match.end() : start + match.end() + len("assistant")]
            if following != "assistant":
                before = text[: start + match.start()]
                for token in (END, CALL, RETURN):
                    if before.endswith(token):
                        return len(before) - len(token), token
                return None
        return None
