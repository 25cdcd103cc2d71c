"""``chat_formats.decoding.decode_ids`` is ``tokenizer.decode`` to the character, for every
embedded family's tokenizer, with and without special tokens, and takes the tokenizer's own
``decode`` wherever the direct call could differ (clean-up of spaces, a subclass's own
decoding). ``TextStream``, fed the same ids a few at a time, has the same text after every
feed, except that it holds back a character not yet complete."""

from __future__ import annotations

import random
from typing import Any

import pytest
from transformers import AutoTokenizer

from art_core.chat_formats import decoding
from art_core.chat_formats.decoding import TextStream, decode_ids
from art_core.chat_formats.markup import Markup
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


def fed_in_pieces(stream: TextStream, ids: list[int], seed: int) -> list[tuple[str, list[int]]]:
    """Feed ``ids`` in pieces of 1-4 ids; the text after each feed and the ids so far."""
    rng = random.Random(seed)
    seen: list[tuple[str, list[int]]] = []
    at = 0
    while at < len(ids):
        piece = ids[at : at + rng.randrange(1, 5)]
        at += len(piece)
        stream.extend(piece)
        seen.append((stream.text, ids[:at]))
    return seen


def assert_streams_the_whole_decode(stream: TextStream, ids: list[int], whole: Any) -> None:
    """After every feed: the whole decode of the ids so far where that does not end inside a
    character, else a prefix of it (the complete characters; never a replacement char)."""
    for text, so_far in fed_in_pieces(stream, ids, seed=len(ids)):
        expected = whole(so_far)
        if expected.endswith("\ufffd"):
            assert expected.startswith(text) and not text.endswith("\ufffd"), (text, expected)
        else:
            assert text == expected, (so_far, text, expected)


@pytest.mark.parametrize("skip_special_tokens", [False, True])
def test_a_text_stream_has_the_whole_decodes_text_after_every_feed(
    tokenizer: Any, skip_special_tokens: bool
) -> None:
    # An id past the tokenizer's vocabulary (a model's output layer is often larger) adds no
    # text, as in the whole decode.
    for ids in [*sequences(tokenizer), [5, len(tokenizer) + 3, 6]]:
        stream = TextStream(tokenizer, skip_special_tokens=skip_special_tokens)
        assert_streams_the_whole_decode(
            stream,
            ids,
            lambda so_far: decode_ids(tokenizer, so_far, skip_special_tokens=skip_special_tokens),
        )


def test_a_markup_stream_keeps_the_formats_markup_and_drops_other_special_tokens() -> None:
    tokenizer = AutoTokenizer.from_pretrained(resolve_base_model("tiny-mistral"))
    markup = Markup(tokenizer, keep=["[TOOL_CALLS]"])
    ids = [*tokenizer.encode("Hi", add_special_tokens=True), 5, tokenizer.eos_token_id]
    ids += tokenizer.encode(' [{"name": "f", "arguments": {}}] é', add_special_tokens=False)
    stream = markup.text_stream(keep_markup=True)
    assert_streams_the_whole_decode(
        stream, ids, lambda so_far: markup.decode(so_far, keep_markup=True)
    )
    assert "[TOOL_CALLS]" in stream.text and tokenizer.eos_token not in stream.text


def test_a_slow_path_tokenizer_is_decoded_whole_again(monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = AutoTokenizer.from_pretrained(resolve_base_model("tiny-mistral"))
    monkeypatch.setattr(tokenizer, "clean_up_tokenization_spaces", True)
    ids = tokenizer.encode("Hello , world ! It 's fine . é", add_special_tokens=False)
    stream = TextStream(tokenizer, skip_special_tokens=True)
    assert_streams_the_whole_decode(
        stream, ids, lambda so_far: tokenizer.decode(so_far, skip_special_tokens=True)
    )
    assert not decoding._decodes_directly(tokenizer)
    assert stream.text == tokenizer.decode(ids, skip_special_tokens=True)
