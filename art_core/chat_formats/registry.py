"""Which chat format a model has: read from its chat template and tokenizer, or named.

Like vLLM's ``--tool-call-parser`` / ``--reasoning-parser``, a format can be named
explicitly (``tool_call_parser=``, ``reasoning_parser=``); otherwise it is detected from
what the template writes (``<|channel|>``, ``<function=``, ``[TOOL_CALLS]``,
``<|python_tag|>``, ``<tool_call>``) and which markup tokens the tokenizer has.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from art_core.chat_formats.base import ToolCallFormat
from art_core.chat_formats.format import ChatFormat
from art_core.chat_formats.harmony import HarmonyFormat
from art_core.chat_formats.hermes import HermesFormat
from art_core.chat_formats.llama3_json import Llama3JsonFormat
from art_core.chat_formats.markup import Markup
from art_core.chat_formats.mistral import MistralFormat
from art_core.chat_formats.qwen3_coder import Qwen3CoderFormat
from art_core.chat_formats.reasoning import ThinkTags

# Names as vLLM's tool-call parsers have them, plus the family names users know.
TOOL_CALL_PARSERS: dict[str, Callable[[], ToolCallFormat]] = {
    "hermes": HermesFormat,
    "qwen2.5": HermesFormat,
    "qwen3": HermesFormat,
    "qwen3_coder": Qwen3CoderFormat,
    "qwen3_xml": Qwen3CoderFormat,
    "llama3_json": Llama3JsonFormat,
    "llama4_json": Llama3JsonFormat,
    "mistral": MistralFormat,
    "mistral_args": lambda: MistralFormat(style="args"),
    "openai": HarmonyFormat,
    "gpt-oss": HarmonyFormat,
    "harmony": HarmonyFormat,
}
REASONING_PARSERS: dict[str, ThinkTags | None] = {
    "qwen3": ThinkTags("qwen3"),
    "deepseek_r1": ThinkTags("deepseek_r1"),
    "none": None,
}


def _template(tokenizer: Any) -> str:
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):  # several named templates: the default one
        template = template.get("default") or next(iter(template.values()), "")
    return str(template)


def detect_tool_format(tokenizer: Any) -> ToolCallFormat:
    """The tool-call format a model's template and tokenizer use (Hermes when unknown: the
    format of the project's own ChatML template).

    Example:
        >>> from transformers import AutoTokenizer
        >>> from art_core.embedded import resolve_base_model
        >>> tokenizer = AutoTokenizer.from_pretrained(resolve_base_model("tiny-qwen3"))
        >>> detect_tool_format(tokenizer).name
        'hermes'
    """
    template = _template(tokenizer)
    vocab = tokenizer.get_vocab()
    if "<|channel|>" in template or "<|channel|>" in vocab:
        return HarmonyFormat()
    if "<function=" in template and "<parameter=" in template:
        return Qwen3CoderFormat()
    if "[TOOL_CALLS]" in template or "[TOOL_CALLS]" in vocab:
        return MistralFormat(style="args" if "[ARGS]" in template else "list")
    if "<|python_tag|>" in template or (
        "<|start_header_id|>" in template and "ipython" in template
    ):
        return Llama3JsonFormat()
    return HermesFormat()


def detect_reasoning(tokenizer: Any, tools: ToolCallFormat) -> ThinkTags | None:
    """Think tags when the template writes them and the tokenizer knows both (harmony
    carries its reasoning in its own channels)."""
    if isinstance(tools, HarmonyFormat):
        return None
    vocab = tokenizer.get_vocab()
    template = _template(tokenizer)
    tags = ThinkTags()
    if tags.close in template and (tags.open in vocab or tags.close in vocab):
        return tags
    return None


def chat_format_for(
    tokenizer: Any,
    *,
    tool_call_parser: str | None = None,
    reasoning_parser: str | None = None,
) -> ChatFormat:
    """The chat format of a model: named, or detected from its template and tokenizer.

    Raises ``ValueError`` naming the known parsers for an unknown name.

    Example:
        >>> from transformers import AutoTokenizer
        >>> from art_core.embedded import resolve_base_model
        >>> tokenizer = AutoTokenizer.from_pretrained(resolve_base_model("tiny-qwen3"))
        >>> chat_format_for(tokenizer).name, chat_format_for(tokenizer, tool_call_parser="llama3_json").name
        ('hermes', 'llama3_json')
    """
    if tool_call_parser is not None:
        make = TOOL_CALL_PARSERS.get(tool_call_parser)
        if make is None:
            raise ValueError(
                f"unknown tool_call_parser {tool_call_parser!r}: use one of "
                f"{sorted(TOOL_CALL_PARSERS)}"
            )
        tools = make()
    else:
        tools = detect_tool_format(tokenizer)
    if reasoning_parser is not None:
        if reasoning_parser not in REASONING_PARSERS:
            raise ValueError(
                f"unknown reasoning_parser {reasoning_parser!r}: use one of "
                f"{sorted(REASONING_PARSERS)}"
            )
        reasoning = REASONING_PARSERS[reasoning_parser]
    else:
        reasoning = detect_reasoning(tokenizer, tools)
    keep = list(tools.tokens) + ([reasoning.open, reasoning.close] if reasoning else [])
    return ChatFormat(tools=tools, markup=Markup(tokenizer, keep=keep), reasoning=reasoning)


# The keys of a model's ``_internal_config`` that choose its chat format (vLLM's flag names).
CHAT_FORMAT_KEYS = ("tool_call_parser", "reasoning_parser")


def chat_format_settings(internal_config: Any) -> dict[str, str]:
    """The chat-format choices of a model's ``_internal_config`` (``tool_call_parser``,
    ``reasoning_parser``), checked; ``ValueError`` naming the known parsers otherwise.

    Example:
        >>> chat_format_settings({"tool_call_parser": "mistral", "peft_args": {"r": 8}})
        {'tool_call_parser': 'mistral'}
    """
    settings: dict[str, str] = {}
    known: dict[str, list[str]] = {
        "tool_call_parser": sorted(TOOL_CALL_PARSERS),
        "reasoning_parser": sorted(REASONING_PARSERS),
    }
    for key in CHAT_FORMAT_KEYS:
        value = (internal_config or {}).get(key)
        if value is None:
            continue
        if not isinstance(value, str) or value not in known[key]:
            raise ValueError(f"unknown {key} {value!r}: use one of {known[key]}")
        settings[key] = value
    return settings
