"""What a model's answer is once its markup is read: content, tool calls, reasoning.

Every tool-call format returns a ``ParsedAnswer``; the gateway turns it into OpenAI's
assistant message (and the other wire APIs into theirs) and records it with the call.
"""

from __future__ import annotations

import json
import secrets
import string
import uuid
from dataclasses import dataclass, field
from typing import Any

# Mistral's templates accept only 9-character alphanumeric tool call ids.
_ALPHANUMERIC = string.ascii_letters + string.digits


@dataclass
class ParsedAnswer:
    """An answer split into the parts OpenAI's assistant message has.

    ``truncated``: a tool call was cut short (by ``max_tokens``): its ``arguments`` are a
    prefix of what the model meant. ``parser``: the format that recognised the tool calls
    (``"bare_json"`` when the lenient fallback did: the model did not use its own format, and
    a reward can tell).

    Example:
        >>> ParsedAnswer("hi", reasoning="greet").message()
        {'role': 'assistant', 'content': 'hi', 'reasoning_content': 'greet'}
    """

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    reasoning: str | None = None
    truncated: bool = False
    parser: str | None = None

    def message(self) -> dict[str, Any]:
        """The OpenAI assistant message (``reasoning_content`` as vLLM names it)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning is not None:
            message["reasoning_content"] = self.reasoning
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message


def answer_with_calls(
    text: str, kept: list[str], calls: list[dict[str, Any]], truncated: bool, parser: str
) -> ParsedAnswer:
    """The answer of a format whose calls sit among text: the text around them (``kept``,
    trailing whitespace dropped) is the content, or None; ``text`` as it is when it held no
    call at all.

    Example:
        >>> answer_with_calls("hi", ["hi"], [], False, "hermes").content
        'hi'
    """
    if not calls and not truncated:
        return ParsedAnswer(content=text)
    content = "".join(kept).rstrip()
    return ParsedAnswer(content or None, calls, truncated=truncated, parser=parser)


def tool_call(name: str, arguments: str, call_id: str) -> dict[str, Any]:
    """An OpenAI tool call.

    Example:
        >>> tool_call("f", "{}", "call_1")["function"]
        {'name': 'f', 'arguments': '{}'}
    """
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def openai_call_id() -> str:
    """An id like OpenAI's (``call_`` and 24 hex digits)."""
    return f"call_{uuid.uuid4().hex[:24]}"


def short_call_id() -> str:
    """A 9-character alphanumeric id (the only kind Mistral's templates accept).

    Example:
        >>> len(short_call_id()), short_call_id().isalnum()
        (9, True)
    """
    return "".join(secrets.choice(_ALPHANUMERIC) for _ in range(9))


def arguments_json(arguments: dict[str, Any]) -> str:
    """Arguments as the JSON string OpenAI's ``function.arguments`` carries."""
    return json.dumps(arguments, ensure_ascii=False)


def decode_json_prefix(text: str) -> tuple[Any, int] | None:
    """The JSON value at the start of ``text`` (leading whitespace skipped) and where it
    ends, or None when ``text`` does not start with one.

    Example:
        >>> decode_json_prefix(' {"a": 1} rest')
        ({'a': 1}, 9)
    """
    stripped = text.lstrip()
    try:
        value, end = json.JSONDecoder().raw_decode(stripped)
    except json.JSONDecodeError:
        return None
    return value, end + len(text) - len(stripped)
