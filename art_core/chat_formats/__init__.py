"""Chat formats of the model families: how each writes tool calls and reasoning.

One module per tool-call format (``hermes``, ``qwen3_coder``, ``llama3_json``, ``mistral``,
``harmony`` for gpt-oss), the lenient bare-JSON fallback, think tags, and the registry that
picks a model's format from its chat template and tokenizer (or by name).
"""

from art_core.chat_formats.answer import ParsedAnswer
from art_core.chat_formats.format import ChatFormat
from art_core.chat_formats.registry import (
    CHAT_FORMAT_KEYS,
    REASONING_PARSERS,
    TOOL_CALL_PARSERS,
    chat_format_for,
    chat_format_settings,
)

__all__ = [
    "CHAT_FORMAT_KEYS",
    "REASONING_PARSERS",
    "TOOL_CALL_PARSERS",
    "ChatFormat",
    "ParsedAnswer",
    "chat_format_for",
    "chat_format_settings",
]
