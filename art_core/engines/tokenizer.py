"""Loading a chat tokenizer the same way for every engine: template with tools, end tokens,
and the chat format (tool calls, reasoning) of the model's family."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from art_core.chat_formats import ChatFormat, chat_format_for
from art_core.embedded.templates import tool_template_for

# Tokens that end an assistant turn in the families served: ChatML, Llama 3 (<|eom_id|> after
# a tool call), gpt-oss (<|return|>, <|call|>), Gemma (<end_of_turn>).
END_OF_TURN_TOKENS = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
)


@dataclass
class ChatTokenizer:
    """A model's tokenizer with its tool-capable chat template, end-of-turn ids and sizes.

    ``vocab_size`` is the larger of the tokenizer's and the model config's (padded
    vocabularies): any id below it is one the model can be given.
    """

    tokenizer: Any
    eos_token_ids: set[int]
    pad_token_id: int
    context_length: int
    vocab_size: int = 0
    # How the model writes tool calls and reasoning (detected, or named at load).
    format: ChatFormat = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.format is None:
            self.format = chat_format_for(self.tokenizer)


def load_chat_tokenizer(
    model_path: Path,
    *,
    tool_call_parser: str | None = None,
    reasoning_parser: str | None = None,
) -> ChatTokenizer:
    """The model folder's tokenizer, with a tool-capable template, its end-of-turn ids and
    its chat format (``tool_call_parser`` / ``reasoning_parser`` name one, as vLLM's flags
    do; by default it is detected from the template and tokenizer).

    A model whose own template cannot render tools gets a shipped tool template in its turn
    markup (Gemma's, else ChatML), so every engine renders prompts identically.

    Example:
        >>> from art_core.embedded import resolve_base_model
        >>> chat = load_chat_tokenizer(resolve_base_model("tiny-random"))
        >>> sorted(chat.eos_token_ids)
        [0, 2]
    """
    from transformers import AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    own = getattr(tokenizer, "chat_template", None) or ""
    if "tools" not in own:
        # In the model's own turn markup where one is shipped (Gemma), else ChatML.
        tokenizer.chat_template = tool_template_for(str(own))
    eos: set[int] = set()
    sources: list[Any] = [tokenizer.eos_token_id]
    if (Path(model_path) / "generation_config.json").is_file():
        sources.append(GenerationConfig.from_pretrained(model_path).eos_token_id)
    for source in sources:
        if isinstance(source, int):
            eos.add(source)
        elif isinstance(source, list):
            eos.update(int(x) for x in source)
    for token in END_OF_TURN_TOKENS:
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id >= 0 and token_id != tokenizer.unk_token_id:
            eos.add(token_id)
    if not eos:
        raise ValueError(f"{model_path}: the tokenizer defines no end-of-sequence token")
    config = json.loads((Path(model_path) / "config.json").read_text())
    context = int(config.get("max_position_embeddings") or 2048)
    vocab = max(len(tokenizer), int(config.get("vocab_size") or 0))
    pad = tokenizer.pad_token_id
    chat_format = chat_format_for(
        tokenizer, tool_call_parser=tool_call_parser, reasoning_parser=reasoning_parser
    )
    return ChatTokenizer(
        tokenizer, eos, pad if pad is not None else min(eos), context, vocab, chat_format
    )
