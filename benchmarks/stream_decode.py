"""The text of a streamed answer: each id decoded once (``TextStream``) against the whole
answer decoded again at every write (what the gateway did before).

A streamed answer is written as its tokens come; at every write the gateway needs the text
so far (to cut stop strings, reasoning and tool-call markup). Decoding the whole answer
again at each write costs the answer's length every time, so a stream of n tokens costs n^2,
all of it on the event loop every request shares. For answers of ``--lengths`` tokens of
mixed text (ASCII, accented Latin, CJK, emoji), written one token at a time (the most writes
a stream makes), it prints the milliseconds of decoding per stream both ways and the ratio,
with each of the embedded tokenizers' families given by ``--models``.

Usage: bash run.sh bench stream_decode [--lengths 512,4096] [--models tiny-qwen2.5,tiny-llama3]
       bash run.sh bench stream_decode --smoke   (256 tokens, one tokenizer)
"""

from __future__ import annotations

import argparse
import time

from _machine import machine_line
from transformers import AutoTokenizer

from art_core.chat_formats.decoding import TextStream, decode_ids
from art_core.embedded import resolve_base_model

TEXT = "The quick brown fox jumps over the lazy dog. Grüße aus Köln, 世界 🙂\n"


def whole_each_write(tokenizer: object, ids: list[int]) -> float:
    """Seconds to decode ``ids[:k]`` whole for every k (the old stream)."""
    started = time.perf_counter()
    for k in range(1, len(ids) + 1):
        decode_ids(tokenizer, ids[:k], skip_special_tokens=True)
    return time.perf_counter() - started


def streamed(tokenizer: object, ids: list[int]) -> float:
    """Seconds to feed ``ids`` one at a time to a ``TextStream``, reading its text each time;
    checks the text is the whole decode's (a prefix where that ends inside a character)."""
    started = time.perf_counter()
    stream = TextStream(tokenizer, skip_special_tokens=True)
    for token in ids:
        stream.extend([token])
        _ = stream.text
    seconds = time.perf_counter() - started
    whole = decode_ids(tokenizer, ids, skip_special_tokens=True)
    if not (stream.text == whole or (whole.endswith("\ufffd") and whole.startswith(stream.text))):
        raise AssertionError(f"streamed text differs from the whole decode after {len(ids)} ids")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="512,4096", help="answer lengths, comma-separated")
    parser.add_argument("--models", default="tiny-qwen2.5,tiny-llama3,tiny-mistral,tiny-gemma3")
    parser.add_argument("--smoke", action="store_true", help="256 tokens, one tokenizer")
    args = parser.parse_args()
    if args.smoke:
        args.lengths, args.models = "256", "tiny-qwen2.5"
    print(machine_line())
    print("| tokenizer | tokens | whole decode at each write, ms | TextStream, ms | ratio |")
    print("|---|---|---|---|---|")
    for name in args.models.split(","):
        tokenizer = AutoTokenizer.from_pretrained(resolve_base_model(name))
        many = tokenizer.encode(TEXT * 800, add_special_tokens=False)
        for length in (int(x) for x in args.lengths.split(",")):
            ids = many[:length]
            old, new = whole_each_write(tokenizer, ids), streamed(tokenizer, ids)
            print(f"| {name} | {length} | {1000 * old:.1f} | {1000 * new:.1f} | {old / new:.0f}x |")


if __name__ == "__main__":
    main()
