"""What a tokenizer makes of a format's markup: special tokens, decoding, grammar literals.

Formats write their markup as strings (``<tool_call>``, ``[TOOL_CALLS]``, ``<|channel|>``).
Whether such a string is one added token of the tokenizer decides two things. Decoding with
``skip_special_tokens=True`` drops it when it is marked special (so the parser would never see
it). And a grammar must name the token itself: llguidance treats every added token as
special (spelled apart from text, whatever its ``special`` flag; Qwen's ``<tool_call>`` is
added but not special), so a quoted string could only be spelled out in pieces the model was
never trained to write, and the token it does write would be refused.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from art_core.chat_formats.decoding import TextStream, decode_ids


class Markup:
    """A tokenizer's view of the markup strings of one chat format.

    Example:
        >>> from transformers import AutoTokenizer
        >>> from art_core.embedded import resolve_base_model
        >>> tokenizer = AutoTokenizer.from_pretrained(resolve_base_model("tiny-mistral"))
        >>> markup = Markup(tokenizer, keep=["[TOOL_CALLS]"])
        >>> markup.literal("[TOOL_CALLS]")
        '<[5]>'
    """

    def __init__(self, tokenizer: Any, keep: Iterable[str] = ()) -> None:
        self.tokenizer = tokenizer
        decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        special = {int(i) for i, token in decoder.items() if getattr(token, "special", False)}
        special.update(int(i) for i in getattr(tokenizer, "all_special_ids", []) or [])
        self.special_ids = frozenset(special)
        # Added tokens by text (what llguidance spells apart from text).
        self.added_tokens = {str(getattr(t, "content", t)): int(i) for i, t in decoder.items()}
        kept = {
            self.added_tokens[text]
            for text in keep
            if text in self.added_tokens and self.added_tokens[text] in self.special_ids
        }
        # Decoding for parsing drops every special token but the kept markup.
        self._dropped = self.special_ids - kept
        self.keeps_special = bool(kept)

    def is_token(self, text: str) -> bool:
        """Whether ``text`` is exactly one added token of this tokenizer (a grammar must
        name it as a token: text patterns never match it)."""
        return text in self.added_tokens

    def literal(self, text: str) -> str:
        """``text`` in a llguidance Lark grammar: ``<[id]>`` for an added token, else a
        quoted string (which matches the text however it is tokenized)."""
        token = self.added_tokens.get(text)
        return f"<[{token}]>" if token is not None else json.dumps(text)

    def decode(self, ids: Sequence[int], *, keep_markup: bool) -> str:
        """The text of ``ids``: special tokens dropped, except the format's markup when
        ``keep_markup`` (the answer is then parsed for it)."""
        if not keep_markup or not self.keeps_special:
            return decode_ids(self.tokenizer, ids, skip_special_tokens=True)
        kept = [i for i in ids if i not in self._dropped]
        return decode_ids(self.tokenizer, kept, skip_special_tokens=False)

    def text_stream(self, *, keep_markup: bool) -> TextStream:
        """``decode``'s text of ids that come a few at a time (a streamed answer)."""
        if not keep_markup or not self.keeps_special:
            return TextStream(self.tokenizer, skip_special_tokens=True)
        return TextStream(self.tokenizer, skip_special_tokens=False, dropped=self._dropped)
