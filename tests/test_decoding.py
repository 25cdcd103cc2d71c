"""``chat_formats.decoding.decode_ids`` is ``tokenizer.decode`` to the character, for every
embedded family's tokenizer, with and without special tokens, and takes the tokenizer's own
``decode`` wherever the direct call could differ (clean-up of spaces, a subclass's own
decoding)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from transformers import AutoTokenizer

from art_core.chat_formats import decoding
from art_core.chat_formats.decoding import decode_ids
from art_core.embedded import EMBEDDED_MODELS, resolve_base_model

NAMES = [name for name in EMBEDDED_MODELS if name.startswith("tiny-")]


@pytest.fixture(scope="module", params=NAMES)
def tokenizer(request: pytest.FixtureRequest) -> Any:
    return AutoTokenizer.from_pretrained(resolve_base_model(request.param))


def sequences(tokenizer: Any) -> list[list[int]]:
    """Random ids over the whole vocabulary (special and added tokens, byte pieces that
    make incomplete UTF-8), and the ids of text with spaces before punctuation."""
    rng = random.Random(0)
    size = len(tokenizer)
    special = sorted(tokenizer.all_special_ids)
    out = [[rng.randrange(size) for _ in range(rng.randrange(1, 80))] for _ in range(40)]
    out += [rng.sample(special, len(special)) + [rng.randrange(size) for _ in range(10)]]
    text = "Hello , world ! It 's  a   test .\n\ttabs\u2028and é 漢字 🙂 <tool_call>{}</tool_call>"
    out.append(tokenizer.encode(text, add_special_tokens=True))
    return [*out, []]


@pytest.mark.parametrize("skip_special_tokens", [False, True])
def test_the_same_text_as_the_tokenizers_decode(tokenizer: Any, skip_special_tokens: bool) -> None:
    assert decoding._decodes_directly(tokenizer)  # every embedded tokenizer is a fast one
    for ids in sequences(tokenizer):
        expected = tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        assert decode_ids(tokenizer, ids, skip_special_tokens=skip_special_tokens) == expected


def test_clean_up_or_a_subclass_goes_through_the_tokenizers_own_decode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(resolve_base_model("tiny-mistral"))
    ids = tokenizer.encode("Hello , world ! It 's fine .", add_special_tokens=False)
    monkeypatch.setattr(tokenizer, "clean_up_tokenization_spaces", True)
    assert not decoding._decodes_directly(tokenizer)
    assert decode_ids(tokenizer, ids) == tokenizer.decode(ids)

    class Shouting(type(tokenizer)):  # type: ignore[misc]
        def _decode(self, token_ids: Any, **kwargs: Any) -> str:
            return str(super()._decode(token_ids, **kwargs)).upper()

    tokenizer.__class__ = Shouting
    monkeypatch.setattr(tokenizer, "clean_up_tokenization_spaces", False)
    assert not decoding._decodes_directly(tokenizer)
    assert decode_ids(tokenizer, ids) == tokenizer.decode(ids) == tokenizer.decode(ids).upper()
