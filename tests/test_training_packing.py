"""Packing keeps attention inside each sequence; micro-batches respect the token budget."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from art_core.embedded import resolve_base_model
from art_core.training.packing import (
    TrainingExample,
    make_micro_batches,
    pack_row,
    pad_rows,
    plan_rows,
    shareable_prefix,
)
from art_core.training.sequences import TokenSequence


@pytest.fixture(scope="module")
def model():  # type: ignore[no-untyped-def]
    model = AutoModelForCausalLM.from_pretrained(resolve_base_model("tiny-random"))
    return model.eval()


def example(length: int, seed: int, prompt: list[int] | None = None) -> TrainingExample:
    """``length`` random ids, the completion after ``prompt`` (default: the first half) trained."""
    rng = random.Random(seed)
    prompt = prompt or [rng.randrange(3, 600) for _ in range(length // 2)]
    completion = [rng.randrange(3, 600) for _ in range(length - len(prompt))]
    mask = [False] * len(prompt) + [True] * len(completion)
    logprobs = [-1.0 if m else 0.0 for m in mask]
    return TrainingExample(TokenSequence(prompt + completion, mask, logprobs), 1.0, 1.0)


def alone_logits(model, ex: TrainingExample) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """Logits predicting each trained token, with the sequence run on its own."""
    with torch.no_grad():
        logits = model(torch.tensor([ex.sequence.token_ids])).logits[0]
    predict = torch.tensor([*ex.sequence.loss_mask[1:], False])
    return logits[predict]


def packed_logits(model, batch, **overrides) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """Logits predicting each trained token of the batch, in the batch's target order."""
    inputs = {
        "input_ids": batch.input_ids,
        "position_ids": batch.position_ids,
        "attention_mask": batch.attention_mask,
        "logits_to_keep": batch.predict_mask,
        "use_cache": False,
    }
    inputs.update(overrides)
    with torch.no_grad():
        return model(**inputs).logits[batch.target_rows]


def test_packed_row_gives_each_sequence_the_logits_it_has_alone(model) -> None:  # type: ignore[no-untyped-def]
    examples = [example(9, 1), example(14, 2), example(5, 3)]
    batch = pack_row(examples, share_prefixes=False)
    assert batch.input_ids.shape == (1, 28)
    assert batch.position_ids[0].tolist() == [*range(9), *range(14), *range(5)]
    logits = packed_logits(model, batch)
    expected = torch.cat([alone_logits(model, ex) for ex in examples])
    assert logits.shape == expected.shape == (batch.num_trainable_tokens, model.config.vocab_size)
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-4)
    # The per-token tensors line up with those logits: targets are the trained ids in order.
    targets = [
        t
        for ex in examples
        for t, m in zip(ex.sequence.token_ids, ex.sequence.loss_mask, strict=True)
        if m
    ]
    assert batch.target_ids.tolist() == targets

    # Without the block mask the second sequence would see the first: the check can fail.
    leaky = packed_logits(model, batch, attention_mask=torch.ones_like(batch.input_ids))
    assert not torch.allclose(leaky, expected, atol=1e-3)


def test_shared_prompts_are_run_once_and_give_the_same_logits(model) -> None:  # type: ignore[no-untyped-def]
    system = [11, 12, 13, 14, 15, 16]
    task_a, task_b = [*system, 21, 22, 23], [*system, 31, 32]
    examples = [
        example(16, 1, prompt=task_a),
        example(14, 2, prompt=task_a),
        example(12, 3, prompt=task_b),  # shares only the system prompt with task A
        example(13, 4, prompt=task_b),
        example(8, 5),  # shares nothing
    ]
    batch = pack_row(examples)
    # task A's prompt (9 tokens) is stored once, task B's suffix (2) once, the rest per rollout.
    stored = 16 + (14 - 9) + (12 - 6) + (13 - 8) + 8
    assert batch.num_tokens == batch.input_ids.shape[1] == stored
    assert shareable_prefix(examples[1].sequence, examples[0].sequence) == 9
    logits = packed_logits(model, batch)
    expected = torch.cat([alone_logits(model, ex) for ex in examples])
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-4)
    # The first completion token of both task-A rollouts is predicted by the same position.
    assert batch.target_rows[0] == batch.target_rows[16 - 9]
    targets = [
        t
        for ex in examples
        for t, m in zip(ex.sequence.token_ids, ex.sequence.loss_mask, strict=True)
        if m
    ]
    assert batch.target_ids.tolist() == targets


def test_padded_rows_match_too(model) -> None:  # type: ignore[no-untyped-def]
    examples = [example(12, 4), example(6, 5)]
    batch = pad_rows(examples)
    assert batch.input_ids.shape == (2, 12)
    logits = packed_logits(model, batch)
    expected = torch.cat([alone_logits(model, ex) for ex in examples])
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-4)


def test_varlen_attention_gets_no_mask_but_restarting_positions() -> None:
    batch = pack_row([example(4, 1), example(3, 2)], attn_implementation="flash_attention_2")
    assert batch.attention_mask is None
    assert batch.position_ids[0].tolist() == [0, 1, 2, 3, 0, 1, 2]


def test_attention_masks_by_hand() -> None:
    a = TrainingExample(TokenSequence([1, 2, 3], [False, False, True], [0.0, 0.0, -1.0]), 1, 1)
    b = TrainingExample(TokenSequence([1, 2, 4, 5], [False, False, True, True], [0.0] * 4), 1, 1)
    # Without sharing: block-diagonal causal.
    assert pack_row([a, b], share_prefixes=False).attention_mask[0, 0].int().tolist() == [
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0],
        [0, 0, 0, 1, 0, 0, 0],
        [0, 0, 0, 1, 1, 0, 0],
        [0, 0, 0, 1, 1, 1, 0],
        [0, 0, 0, 1, 1, 1, 1],
    ]
    # With sharing, b stores [4, 5] and reads [1, 2] from a, but never a's own token 3.
    shared = pack_row([a, b])
    assert shared.input_ids.tolist() == [[1, 2, 3, 4, 5]]
    assert shared.position_ids.tolist() == [[0, 1, 2, 2, 3]]
    assert shared.attention_mask[0, 0].int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 1, 0, 1, 0],
        [1, 1, 0, 1, 1],
    ]
    # Position 1 predicts both a's 3 and b's 4; position 3 predicts b's 5.
    assert shared.predict_mask.int().tolist() == [[0, 1, 0, 1, 0]]
    assert shared.target_rows.tolist() == [0, 0, 1]


def test_micro_batches_respect_the_token_budget() -> None:
    lengths = [30, 7, 12, 50, 5, 21, 9, 16, 80]
    examples = [example(n, i) for i, n in enumerate(lengths)]
    for packing in (True, False):
        batches = make_micro_batches(examples, max_tokens=64, packing=packing, share_prefixes=False)
        seen = sorted(n for b in batches for n in [b.num_tokens])
        assert sum(b.num_sequences for b in batches) == len(lengths)
        assert sum(b.num_trainable_tokens for b in batches) == sum(n - n // 2 for n in lengths)
        for b in batches:
            padded = b.input_ids.numel()
            assert padded <= 64 or b.num_sequences == 1, (packing, padded, seen)
    packed = make_micro_batches(examples, max_tokens=64, share_prefixes=False)
    # First-fit decreasing: the 80-token sequence alone, the other 150 tokens in the minimum
    # of ceil(150 / 64) = 3 rows: 50+12 | 30+21+9 | 16+7+5.
    assert sorted(b.num_tokens for b in packed) == [28, 60, 62, 80]
    assert plan_rows([80, 10], 64) == [[0], [1]]


def test_a_group_sharing_its_prompt_fits_more_rollouts_per_row() -> None:
    prompt = list(range(100, 140))  # 40 shared prompt tokens, 8 rollouts of 50 tokens
    group = [example(50, seed, prompt=prompt) for seed in range(8)]
    plain = make_micro_batches(group, max_tokens=128, share_prefixes=False)
    shared = make_micro_batches(group, max_tokens=128)
    assert [b.num_sequences for b in plain] == [2, 2, 2, 2]
    # 40 + 8 * 10 = 120 tokens: the whole group in one row.
    assert [(b.num_sequences, b.num_tokens) for b in shared] == [(8, 120)]
    # Over budget, the group is split and each part stores the prompt once.
    split = make_micro_batches(group, max_tokens=100)
    assert all(b.num_tokens <= 100 for b in split)
    assert sum(b.num_sequences for b in split) == 8


def test_sequences_sharing_only_a_system_prompt_are_packed_by_what_they_share(model) -> None:  # type: ignore[no-untyped-def]
    """An agent's runs: every sequence starts with its system prompt, and a later call whose
    history the chat template rewrote starts a sequence of its own, with a longer context
    before its first trained token. Costed by what they share (the system prompt once), the
    five fit one row; costed per distinct prompt they took two."""
    system = list(range(100, 140))  # 40 tokens
    first_turn = [*system, 41, 42]
    rewritten = [*system, 51, 52, 53, 54, 55, 56]
    examples = [example(50, seed, prompt=first_turn) for seed in range(3)]
    examples += [example(56, seed, prompt=rewritten) for seed in (3, 4)]
    # 42 + 3 * 8 for the first turns, 56 - 40 and 56 - 46 for the rewritten ones.
    (batch,) = make_micro_batches(examples, max_tokens=128)
    assert (batch.num_sequences, batch.num_tokens) == (5, 92)
    assert batch.input_ids.shape[1] == 92
    # Each sequence still sees exactly its own context.
    logits = packed_logits(model, batch)
    # Packed in prefix order (sorted by token ids).
    order = sorted(examples, key=lambda ex: ex.sequence.token_ids)
    expected = torch.cat([alone_logits(model, ex) for ex in order])
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-4)
    # Under a smaller budget the chain is cut, and no row passes it.
    split = make_micro_batches(examples, max_tokens=64)
    assert all(b.num_tokens <= 64 for b in split)
    assert sum(b.num_sequences for b in split) == 5
    assert sum(b.num_trainable_tokens for b in split) == batch.num_trainable_tokens


def test_examples_without_trained_tokens_are_dropped() -> None:
    context_only = TrainingExample(TokenSequence([1, 2, 3], [False] * 3, [0.0] * 3), 1.0, 1.0)
    assert make_micro_batches([context_only], max_tokens=64) == []
