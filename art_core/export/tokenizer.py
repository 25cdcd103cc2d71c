"""The tokenizer an export ships: the one the gateway renders prompts with (the base's
tokenizer with its tool-capable chat template, ``load_chat_tokenizer``)."""

from __future__ import annotations

from pathlib import Path

from art_core.engines.tokenizer import load_chat_tokenizer


def save_gateway_tokenizer(base_path: Path, folder: Path) -> None:
    """Save the gateway's tokenizer of ``base_path`` (template included: ``chat_template.jinja``
    / ``tokenizer_config.json``) into ``folder``, so ``AutoTokenizer.from_pretrained(folder)``
    renders the prompts the gateway built, tools included."""
    chat = load_chat_tokenizer(base_path)
    chat.tokenizer.save_pretrained(folder)
