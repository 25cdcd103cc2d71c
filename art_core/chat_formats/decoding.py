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
from collections.abc import Sequence
from typing import Any

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
