"""Ids to text as the tokenizer's own ``decode`` makes it, without its per-call Python.

A fast tokenizer's ``decode`` (transformers' ``TokenizersBackend``) converts the ids one by
one in Python, then calls the Rust tokenizer. The gateway decodes every answer at least
twice (its text and its parsed message), every streamed write and, with stop strings, the
engine a tail of every row at every decode step: 64 ids cost ~10 us through the wrapper
and ~6 us directly (smollm2-135m's and tiny-random's tokenizers, this 2-core EPYC). Where the result is the same by construction (the backend's own ``_decode``,
no clean-up of tokenization spaces), the Rust tokenizer is called directly; anything else
(slow tokenizers, a subclass's own ``_decode``, clean-up on) goes through ``decode``.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from tokenizers.decoders import DecodeStream

# Where transformers (>= 5) defines its fast tokenizers' base: looked up, not imported (a
# tokenizer that is one has loaded it; importing transformers here would load it for
# every ``import art_core``).
_BACKEND_MODULE = "transformers.tokenization_utils_tokenizers"


def decode_ids(tokenizer: Any, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
    """``tokenizer.decode(list(ids), skip_special_tokens=...)``, faster where it can be.

    Example:
        >>> from transformers import AutoTokenizer
        >>> from art_core.embedded import resolve_base_model
        >>> tokenizer = AutoTokenizer.from_pretrained(resolve_base_model("tiny-random"))
        >>> ids = tokenizer.encode("Hello there", add_special_tokens=False)
        >>> decode_ids(tokenizer, ids) == tokenizer.decode(ids)
        True
    """
    if _decodes_directly(tokenizer):
        return str(tokenizer._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))
    return str(tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))


class TextStream:
    """The text of ids that come a few at a time: ``text`` is what ``decode_ids`` makes of
    every id so far (ids in ``dropped`` left out), each id decoded once.

    A stream decoded again whole at every write costs its length each time: 470 us for
    4,096 ids (tiny-qwen2.5's tokenizer, this 2-core EPYC), on the event loop, for every
    write of every stream. Where ``decode_ids`` calls the Rust tokenizer directly, the ids go
    through tokenizers' own incremental decoder (``DecodeStream``: it holds back the bytes of
    a character not yet complete, so ``text`` never ends inside one, and it equals the whole
    decode wherever that does not end inside one); any other tokenizer is decoded whole
    again, as before.

    Example:
        >>> from transformers import AutoTokenizer
        >>> from art_core.embedded import resolve_base_model
        >>> tokenizer = AutoTokenizer.from_pretrained(resolve_base_model("tiny-qwen2.5"))
        >>> ids = tokenizer.encode("Grüße, 世界", add_special_tokens=False)
        >>> stream = TextStream(tokenizer, skip_special_tokens=True)
        >>> for i in ids:
        ...     stream.extend([i])
        >>> stream.text
        'Grüße, 世界'
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        skip_special_tokens: bool,
        dropped: frozenset[int] = frozenset(),
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._dropped = dropped
        self._stream = (
            DecodeStream(skip_special_tokens=skip_special_tokens)
            if _decodes_directly(tokenizer)
            else None
        )
        self._ids: list[int] = []  # kept only where the whole is decoded again
        self.text = ""

    def extend(self, ids: Iterable[int]) -> None:
        """Add ``ids`` (the next ones sampled) to the text."""
        kept = [i for i in ids if i not in self._dropped] if self._dropped else list(ids)
        if self._stream is None:
            self._ids += kept
            self.text = decode_ids(
                self._tokenizer, self._ids, skip_special_tokens=self._skip_special
            )
            return
        pieces = [self._stream.step(self._tokenizer._tokenizer, i) for i in kept]
        self.text += "".join(piece for piece in pieces if piece)


def _decodes_directly(tokenizer: Any) -> bool:
    cls: type = type(tokenizer)
    return _class_decodes_directly(cls) and not getattr(
        tokenizer, "clean_up_tokenization_spaces", False
    )


@functools.lru_cache(maxsize=256)
def _class_decodes_directly(cls: type) -> bool:
    """Whether ``cls`` decodes with the fast backend's own ``decode`` and ``_decode``: decided
    once per class (it is asked at every decoded batch, stream write and stop-string row)."""
    backend = getattr(sys.modules.get(_BACKEND_MODULE), "TokenizersBackend", None)
    return (
        backend is not None
        and issubclass(cls, backend)
        and cls._decode is backend._decode  # type: ignore[attr-defined]
        and cls.decode is backend.decode  # type: ignore[attr-defined]
    )
