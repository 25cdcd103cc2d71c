"""Micro-batches under a token budget, with several sequences packed per row.

Rollouts vary wildly in length; padding each to the longest wastes most of the compute.
Packing puts sequences end to end in one row and keeps attention inside each of them: the
position ids restart at 0 for every sequence and a block-diagonal causal mask (4-D boolean,
``True`` = may attend) stops a token from seeing the sequence packed before it. Flash
attention implementations take the position ids alone (varlen kernels) and get no mask.

Only the logits of positions whose next token is trained are computed: ``predict_mask``
goes to the model as ``logits_to_keep`` (transformers >= 5 takes a boolean mask and returns
the kept positions flattened, row-major), which saves the ``(tokens, vocab)`` logits of all
context tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from art_core.training.sequences import TokenSequence

# Attention implementations that take packed rows from position ids (varlen) and no mask.
VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3", "kernels-community/flash-attn")


@dataclass
class TrainingExample:
    """A sequence to train on, with its rollout's advantage and per-token credit weight."""

    sequence: TokenSequence
    advantage: float
    weight: float

    def __len__(self) -> int:
        return len(self.sequence)


@dataclass
class MicroBatch:
    """Tensors for one forward/backward pass (CPU; the trainer moves them to its device).

    ``predict_mask[b, t]`` is true when the token at ``t + 1`` of row ``b`` is trained; the
    per-token tensors (``target_ids`` ...) list those tokens in row-major order.
    """

    input_ids: torch.Tensor  # (rows, length) long
    position_ids: torch.Tensor  # (rows, length) long
    attention_mask: torch.Tensor | None  # (rows, 1, length, length) bool, (rows, length), or None
    predict_mask: torch.Tensor  # (rows, length) bool
    target_ids: torch.Tensor  # (n,) long
    sampler_logprobs: torch.Tensor  # (n,) float
    advantages: torch.Tensor  # (n,) float
    weights: torch.Tensor  # (n,) float
    num_tokens: int  # real (non-padding) tokens in the batch
    num_sequences: int

    @property
    def num_trainable_tokens(self) -> int:
        return int(self.target_ids.shape[0])


def block_causal_mask(lengths: Sequence[int], row_length: int) -> torch.Tensor:
    """A ``(row_length, row_length)`` boolean mask: causal inside each packed sequence.

    Positions after the last sequence (padding) attend only to themselves, so no row of the
    mask is empty (an all-False row would give NaN in softmax).

    Example:
        >>> block_causal_mask([2, 1], 3).int().tolist()
        [[1, 0, 0], [1, 1, 0], [0, 0, 1]]
    """
    segment = torch.empty(row_length, dtype=torch.long)
    start = 0
    for index, length in enumerate(lengths):
        segment[start : start + length] = index
        start += length
    if start > row_length:
        raise ValueError(f"sequences of total length {start} do not fit a row of {row_length}")
    # Each padding position is a segment of its own.
    segment[start:] = torch.arange(len(lengths), len(lengths) + row_length - start)
    same_segment = segment.unsqueeze(0) == segment.unsqueeze(1)
    causal = torch.ones(row_length, row_length, dtype=torch.bool).tril()
    return same_segment & causal


def plan_rows(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Group sequence indices into rows of at most ``max_tokens`` tokens (first-fit decreasing).

    A sequence longer than the budget gets a row of its own rather than being cut.

    Example:
        >>> plan_rows([3, 5, 2, 4], max_tokens=7)
        [[1, 2], [3, 0]]
    """
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    rows: list[list[int]] = []
    room: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        length = lengths[index]
        for row, free in enumerate(room):
            if length <= free:
                rows[row].append(index)
                room[row] -= length
                break
        else:
            rows.append([index])
            room.append(max_tokens - length)
    return rows


def _per_token_tensors(examples: Sequence[TrainingExample]) -> dict[str, torch.Tensor]:
    """Row-major per-trained-token tensors of examples laid out one after another."""
    target_ids: list[int] = []
    sampler: list[float] = []
    advantages: list[float] = []
    weights: list[float] = []
    for example in examples:
        seq = example.sequence
        for token, trained, logprob in zip(seq.token_ids, seq.loss_mask, seq.logprobs, strict=True):
            if trained:
                target_ids.append(token)
                sampler.append(logprob)
                advantages.append(example.advantage)
                weights.append(example.weight)
    return {
        "target_ids": torch.tensor(target_ids, dtype=torch.long),
        "sampler_logprobs": torch.tensor(sampler, dtype=torch.float32),
        "advantages": torch.tensor(advantages, dtype=torch.float32),
        "weights": torch.tensor(weights, dtype=torch.float32),
    }


def _predict_mask_row(examples: Sequence[TrainingExample], row_length: int) -> list[bool]:
    """``True`` at the position before every trained token (its logits predict it)."""
    row: list[bool] = []
    for example in examples:
        mask = example.sequence.loss_mask
        row += [*mask[1:], False]
    return row + [False] * (row_length - len(row))


def pack_row(
    examples: Sequence[TrainingExample], *, attn_implementation: str | None = None
) -> MicroBatch:
    """One packed row: sequences end to end, position ids restarting, block-causal mask.

    Example:
        >>> seq = TokenSequence([5, 6, 7], [False, False, True], [0.0, 0.0, -0.7])
        >>> batch = pack_row([TrainingExample(seq, 1.0, 1.0)] * 2)
        >>> batch.position_ids.tolist(), batch.predict_mask.int().tolist()
        ([[0, 1, 2, 0, 1, 2]], [[0, 1, 0, 0, 1, 0]])
    """
    if not examples:
        raise ValueError("cannot pack an empty list of examples")
    lengths = [len(example) for example in examples]
    row_length = sum(lengths)
    input_ids = [token for example in examples for token in example.sequence.token_ids]
    positions = [p for length in lengths for p in range(length)]
    mask: torch.Tensor | None = None
    if attn_implementation not in VARLEN_ATTENTION:
        mask = block_causal_mask(lengths, row_length)[None, None]
    return MicroBatch(
        input_ids=torch.tensor([input_ids], dtype=torch.long),
        position_ids=torch.tensor([positions], dtype=torch.long),
        attention_mask=mask,
        predict_mask=torch.tensor([_predict_mask_row(examples, row_length)], dtype=torch.bool),
        num_tokens=row_length,
        num_sequences=len(examples),
        **_per_token_tensors(examples),
    )


def pad_rows(examples: Sequence[TrainingExample], *, pad_token_id: int = 0) -> MicroBatch:
    """One sequence per row, right-padded to the longest, with a 2-D padding mask.

    Example:
        >>> a = TokenSequence([5, 6], [False, True], [0.0, -0.1])
        >>> b = TokenSequence([5, 6, 7], [False, True, True], [0.0, -0.1, -0.2])
        >>> pad_rows([TrainingExample(a, 1.0, 1.0), TrainingExample(b, 1.0, 1.0)]).attention_mask.tolist()
        [[1, 1, 0], [1, 1, 1]]
    """
    if not examples:
        raise ValueError("cannot batch an empty list of examples")
    row_length = max(len(example) for example in examples)
    input_ids, attention, predict = [], [], []
    for example in examples:
        pad = row_length - len(example)
        input_ids.append(example.sequence.token_ids + [pad_token_id] * pad)
        attention.append([1] * len(example) + [0] * pad)
        predict.append(_predict_mask_row([example], row_length))
    return MicroBatch(
        input_ids=torch.tensor(input_ids, dtype=torch.long),
        position_ids=torch.arange(row_length).expand(len(examples), -1).clone(),
        attention_mask=torch.tensor(attention, dtype=torch.long),
        predict_mask=torch.tensor(predict, dtype=torch.bool),
        num_tokens=sum(len(example) for example in examples),
        num_sequences=len(examples),
        **_per_token_tensors(examples),
    )


def make_micro_batches(
    examples: Sequence[TrainingExample],
    *,
    max_tokens: int,
    packing: bool = True,
    attn_implementation: str | None = None,
    pad_token_id: int = 0,
) -> list[MicroBatch]:
    """Split examples into micro-batches of at most ``max_tokens`` tokens each.

    With ``packing``, each micro-batch is one packed row (first-fit decreasing). Without it,
    sequences of similar length are padded into rows and ``rows * longest <= max_tokens``.
    Examples with no trained token are dropped: they would cost a forward pass for nothing.

    Example:
        >>> seq = TokenSequence([5, 6, 7], [False, False, True], [0.0, 0.0, -0.7])
        >>> len(make_micro_batches([TrainingExample(seq, 1.0, 1.0)] * 5, max_tokens=6))
        3
    """
    useful = [example for example in examples if example.sequence.num_trainable_tokens > 0]
    if packing:
        rows = plan_rows([len(example) for example in useful], max_tokens)
        return [
            pack_row([useful[i] for i in row], attn_implementation=attn_implementation)
            for row in rows
        ]
    batches: list[MicroBatch] = []
    current: list[TrainingExample] = []
    for example in sorted(useful, key=len, reverse=True):
        # Sorted longest first, so the first example of a batch is its longest.
        if current and (len(current) + 1) * len(current[0]) > max_tokens:
            batches.append(pad_rows(current, pad_token_id=pad_token_id))
            current = []
        current.append(example)
    if current:
        batches.append(pad_rows(current, pad_token_id=pad_token_id))
    return batches
