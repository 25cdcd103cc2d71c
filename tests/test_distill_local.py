"""``LocalTeacher`` on tiny-random: its scores are a plain forward's fp32 logprobs at the
trained tokens, batching changes nothing, a PEFT adapter is applied, bad input is refused."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

from art_core.distill.local import LocalTeacher
from art_core.distill.scores import MAX_TOP_K, TeacherScores, trained_positions
from art_core.embedded import BaseModelError, resolve_base_model
from art_core.training.sequences import TokenSequence

TOP_K = 5
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def base_path() -> Path:
    return resolve_base_model("tiny-random")


@pytest.fixture(scope="module")
def base_model(base_path: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def vocab_size(base_model: Any) -> int:
    return int(base_model.get_input_embeddings().num_embeddings)


def make_sequence(rng: random.Random, vocab: int, length: int, trained: set[int]) -> TokenSequence:
    ids = [rng.randrange(vocab) for _ in range(length)]
    mask = [i in trained for i in range(length)]
    return TokenSequence(ids, mask, [-0.5 if m else 0.0 for m in mask])


@pytest.fixture(scope="module")
def sequences(vocab_size: int) -> list[TokenSequence]:
    """Different lengths, context between and after trained tokens, nothing trained, empty."""
    rng = random.Random(0)
    return [
        make_sequence(rng, vocab_size, 23, {5, 6, 7, 15, 16}),  # context after the last one
        make_sequence(rng, vocab_size, 6, {1, 2, 3, 4, 5}),
        make_sequence(rng, vocab_size, 12, set()),
        make_sequence(rng, vocab_size, 41, {*range(10, 20), *range(30, 41)}),
        TokenSequence([], [], []),
        make_sequence(rng, vocab_size, 9, {8}),
    ]


def direct_scores(model: Any, seq: TokenSequence, top_k: int) -> TeacherScores:
    """The reference: one unpadded forward, fp32 log_softmax of every position."""
    positions = trained_positions(seq)
    if not positions:
        return TeacherScores([], [], [])
    with torch.no_grad():
        logp = model(torch.tensor([seq.token_ids])).logits[0].float().log_softmax(-1)
    rows = logp[[j - 1 for j in positions]]
    picked = rows.gather(-1, torch.tensor([seq.token_ids[j] for j in positions])[:, None])
    values, ids = torch.topk(rows, top_k, dim=-1)
    return TeacherScores(picked[:, 0].tolist(), ids.tolist(), values.tolist())


def assert_close(got: list[TeacherScores], want: list[TeacherScores]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.top_ids == w.top_ids
        assert g.token_logprobs == pytest.approx(w.token_logprobs, abs=TOLERANCE)
        for g_row, w_row in zip(g.top_logprobs, w.top_logprobs, strict=True):
            assert g_row == pytest.approx(w_row, abs=TOLERANCE)


def test_scores_match_a_direct_forward_batched_or_not(
    base_path: Path, base_model: Any, sequences: list[TokenSequence]
) -> None:
    want = [direct_scores(base_model, seq, TOP_K) for seq in sequences]
    batched = LocalTeacher(base_path, device="cpu")
    positions = [trained_positions(seq) for seq in sequences]
    assert len(batched._batches(sequences, positions)) == 1  # all four in one padded batch
    got = batched.score(sequences, TOP_K)
    assert_close(got, want)
    assert batched._kept_logits.masked  # only the trained positions' logits were computed
    assert [len(s.token_logprobs) for s in got] == [5, 5, 0, 21, 0, 1]
    for scores in got:
        for row in scores.top_logprobs:
            assert row == sorted(row, reverse=True)

    one_by_one = LocalTeacher(base_path, device="cpu", max_tokens_per_batch=1)
    assert len(one_by_one._batches(sequences, positions)) == 4
    assert_close(one_by_one.score(sequences, TOP_K), got)

    # Where the model takes no boolean logits_to_keep, every position's logits are computed.
    one_by_one._kept_logits.masked = False
    assert_close(one_by_one.score(sequences, TOP_K), got)


def test_an_embedded_name_resolves(sequences: list[TokenSequence], base_model: Any) -> None:
    teacher = LocalTeacher("tiny-random", device="cpu")
    assert_close(
        teacher.score(sequences[:2], 1), [direct_scores(base_model, s, 1) for s in sequences[:2]]
    )


def test_an_adapter_is_applied(
    base_path: Path, base_model: Any, sequences: list[TokenSequence], tmp_path: Path
) -> None:
    torch.manual_seed(3)
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    fresh = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    get_peft_model(fresh, config).save_pretrained(str(tmp_path / "adapter"))
    reference = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32),
        tmp_path / "adapter",
    ).eval()

    teacher = LocalTeacher(base_path, adapter=tmp_path / "adapter", device="cpu")
    got = teacher.score(sequences, TOP_K)
    assert_close(got, [direct_scores(reference, seq, TOP_K) for seq in sequences])
    base = [direct_scores(base_model, seq, TOP_K) for seq in sequences]
    differences = [
        abs(g - b)
        for got_seq, base_seq in zip(got, base, strict=True)
        for g, b in zip(got_seq.token_logprobs, base_seq.token_logprobs, strict=True)
    ]
    assert max(differences) > 1e-3


def test_top_k_zero_bad_input_and_reload(
    base_path: Path, sequences: list[TokenSequence], vocab_size: int, tmp_path: Path
) -> None:
    teacher = LocalTeacher(base_path, device="cpu")
    scores = teacher.score(sequences, 0)
    assert [len(s.token_logprobs) for s in scores] == [5, 5, 0, 21, 0, 1]
    assert all(s.top_ids == [[]] * len(s.token_logprobs) for s in scores)
    assert all(s.top_logprobs == [[]] * len(s.token_logprobs) for s in scores)

    outside = TokenSequence([1, vocab_size], [False, True], [0.0, -1.0])
    with pytest.raises(ValueError, match="share a tokenizer"):
        teacher.score([outside], 1)
    with pytest.raises(ValueError, match="top_k"):
        teacher.score(sequences, MAX_TOP_K + 1)
    with pytest.raises(ValueError, match="top_k"):
        teacher.score(sequences, -1)

    teacher.close()
    assert teacher._model is None
    teacher.close()  # twice is fine
    again = teacher.score(sequences, 0)
    assert_close(again, scores)

    with pytest.raises(BaseModelError):
        LocalTeacher(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match=r"adapter_config\.json"):
        LocalTeacher(base_path, adapter=tmp_path)
