"""Micro-batches under a token budget, with several sequences packed per row.

Rollouts vary wildly in length; padding each to the longest wastes most of the compute.
Packing puts sequences end to end in one row and keeps attention inside each of them: the
position ids restart at 0 for every sequence and a block-diagonal causal mask (4-D boolean,
``True`` = may attend) stops a token from seeing the sequence packed before it. Flash
attention implementations take the position ids alone (varlen kernels) and get no mask.

The rollouts of a GRPO group share their prompt (for agents: system prompt, tool schemas,
task), often most of each sequence. With prefix sharing the prompt is stored once per row
and every rollout's own tokens attend to that copy, so the shared context is run once
instead of once per rollout; the mask makes each token see exactly what it would alone.

Only the logits of positions whose next token is trained are computed: ``predict_mask``
goes to the model as ``logits_to_keep`` (transformers >= 5 takes a boolean mask and returns
the kept positions flattened, row-major), which saves the ``(tokens, vocab)`` logits of all
context tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from art_core.training.sequences import TokenSequence

if TYPE_CHECKING:
    from art_core.distill.scores import TeacherScores

# Attention implementations that take packed rows from position ids (varlen) and no mask.
VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3", "kernels-community/flash-attn")


# Where an example came from: (index of its rollout in the step, index of the sequence in
# that rollout). Carried through packing so a trained token can be traced to its rollout.
Source = tuple[int, int]


@dataclass
class TrainingExample:
    """A sequence to train on, with its rollout's advantage and per-token loss weight (and,
    when known, its ``source``: see ``Source``).

    ``metric_weight`` is the per-rollout credit that averages the step's metrics (the loss
    weight unless a loss normalisation other than GRPO's made them differ); ``teacher`` the
    teacher's scores of its trained tokens, in on-policy distillation.
    """

    sequence: TokenSequence
    advantage: float
    weight: float
    source: Source | None = None
    metric_weight: float | None = None
    teacher: TeacherScores | None = None

    def __len__(self) -> int:
        return len(self.sequence)


@dataclass
class MicroBatch:
    """Tensors for one forward/backward pass (CPU; the trainer moves them to its device).

    ``predict_mask[b, t]`` is true where the logits of position ``t`` of row ``b`` are
    needed (they predict a trained token); the model returns those logits flattened in
    row-major order, and ``target_rows[i]`` says which of them predicts trained token ``i``
    (a shared prompt's last position predicts the first token of every rollout sharing it).
    The per-token tensors (``target_ids`` ...) list the trained tokens in sequence order:
    ``segments`` says whose they are, one ``(source, trained tokens)`` per example in that
    order (the first example's tokens come first, and so on).
    """

    input_ids: torch.Tensor  # (rows, length) long
    position_ids: torch.Tensor  # (rows, length) long
    attention_mask: torch.Tensor | None  # (rows, 1, length, length) bool, (rows, length), or None
    predict_mask: torch.Tensor  # (rows, length) bool
    target_rows: torch.Tensor  # (n,) long, indexes the kept (predict_mask) logits
    target_ids: torch.Tensor  # (n,) long
    sampler_logprobs: torch.Tensor  # (n,) float
    advantages: torch.Tensor  # (n,) float
    weights: torch.Tensor  # (n,) float, the loss weights
    num_tokens: int  # tokens actually run (shared prefixes counted once, no padding)
    num_sequences: int
    segments: list[tuple[Source | None, int]] = field(default_factory=list)
    metric_weights: torch.Tensor | None = None  # (n,) float; None = weights
    # On-policy distillation: the teacher's logprob of each trained token and its top-k.
    teacher_logprobs: torch.Tensor | None = None  # (n,) float
    teacher_top_ids: torch.Tensor | None = None  # (n, k) long
    teacher_top_logprobs: torch.Tensor | None = None  # (n, k) float

    @property
    def sequence_index(self) -> torch.Tensor:
        """``(n,)`` long: which example (0, 1, ...) each trained token belongs to, for
        sequence-level importance sampling."""
        counts = torch.tensor([count for _, count in self.segments], dtype=torch.long)
        return torch.repeat_interleave(torch.arange(len(self.segments)), counts)

    @property
    def num_trainable_tokens(self) -> int:
        return int(self.target_ids.shape[0])


def first_trained_index(sequence: TokenSequence) -> int:
    """Index of the first trained token (``len(sequence)`` when none is trained)."""
    return next((i for i, trained in enumerate(sequence.loss_mask) if trained), len(sequence))


def shareable_prefix(a: TokenSequence, b: TokenSequence) -> int:
    """How many leading tokens ``a`` can reuse from ``b``: common, and context in both.

    Trained tokens are never shared (each rollout trains its own with its own advantage).

    Example:
        >>> a = TokenSequence([1, 2, 3, 4], [False, False, True, True], [0.0, 0.0, -1.0, -1.0])
        >>> b = TokenSequence([1, 2, 5], [False, False, True], [0.0, 0.0, -1.0])
        >>> shareable_prefix(a, b)
        2
    """
    ids_a, ids_b = a.token_ids, b.token_ids
    low, high = 0, min(first_trained_index(a), first_trained_index(b))
    # Binary search on slice equality: list comparisons run in C, prompts can be long.
    while low < high:
        middle = (low + high + 1) // 2
        if ids_a[:middle] == ids_b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


@dataclass
class _Placed:
    """Where a sequence lives in a packed row."""

    example: TrainingExample
    start: int  # row position of its first stored token
    host: _Placed | None = None  # the sequence whose tokens it reads for its prefix
    shared: int = 0  # leading tokens read from the host instead of stored again

    def row_position(self, index: int) -> int:
        """The row position holding token ``index`` of this sequence."""
        if self.host is not None and index < self.shared:
            return self.host.row_position(index)
        return self.start + index - self.shared

    def row_positions(self) -> torch.Tensor:
        """Row positions of all its tokens, shared prefix included."""
        own = torch.arange(self.start, self.start + self.stored)
        if self.host is None:
            return own
        return torch.cat([self.host.row_positions()[: self.shared], own])

    @property
    def stored(self) -> int:
        return len(self.example) - self.shared


def _place(examples: Sequence[TrainingExample], share_prefixes: bool) -> list[_Placed]:
    """Lay sequences end to end; with sharing, each reuses the longest shareable prefix of
    any sequence already placed (so the cost of a sequence never exceeds its length minus
    what it shares with the first rollout of its group)."""
    placed: list[_Placed] = []
    start = 0
    for example in examples:
        here = _Placed(example, start)
        if share_prefixes and placed:
            best = max(placed, key=lambda p: shareable_prefix(example.sequence, p.example.sequence))
            shared = shareable_prefix(example.sequence, best.example.sequence)
            if shared > 0:
                here.host, here.shared = best, shared
        placed.append(here)
        start += here.stored
    return placed


def packed_attention_mask(placed: Sequence[_Placed], row_length: int) -> torch.Tensor:
    """``(row_length, row_length)`` boolean mask: each sequence sees only its own tokens.

    A stored token at sequence index ``i`` attends to the row positions of its sequence's
    tokens ``0..i``, wherever they are stored (its own span, or a host's shared prefix), so
    every token attends exactly as if its sequence ran alone.

    Example:
        >>> a = TrainingExample(TokenSequence([7, 8, 9], [False, False, True], [0, 0, -1.0]), 1, 1)
        >>> b = TrainingExample(TokenSequence([7, 8, 5], [False, False, True], [0, 0, -1.0]), 1, 1)
        >>> packed_attention_mask(_place([a, b], share_prefixes=True), 4).int().tolist()
        [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 0, 1]]
    """
    mask = torch.zeros(row_length, row_length, dtype=torch.bool)
    for item in placed:
        positions = item.row_positions()
        # Causal over the sequence's own indices: stored token i sees indices 0..i.
        sees = torch.ones(len(positions), len(positions), dtype=torch.bool).tril()[item.shared :]
        mask[positions[item.shared :, None], positions[None, :]] = sees
    return mask


def plan_rows(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Group item indices into rows of at most ``max_tokens`` tokens (first-fit decreasing).

    An item longer than the budget gets a row of its own rather than being cut.

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


def _per_token_tensors(
    placed: Sequence[_Placed],
) -> tuple[dict[str, Any], list[tuple[Source | None, int]]]:
    """Per-trained-token tensors, and the row position whose logits predict each token;
    and each example's source and number of trained tokens, in the tensors' order."""
    predict_positions: list[int] = []
    target_ids: list[int] = []
    sampler: list[float] = []
    advantages: list[float] = []
    weights: list[float] = []
    metric_weights: list[float] = []
    segments: list[tuple[Source | None, int]] = []
    teachers = [item.example.teacher for item in placed]
    if any(teacher is not None for teacher in teachers) and None in teachers:
        raise ValueError("some examples of a micro-batch carry teacher scores and some do not")
    for item in placed:
        seq = item.example.sequence
        before = len(target_ids)
        for index, (token, trained, logprob) in enumerate(
            zip(seq.token_ids, seq.loss_mask, seq.logprobs, strict=True)
        ):
            if trained:
                predict_positions.append(item.row_position(index - 1))
                target_ids.append(token)
                sampler.append(logprob)
                advantages.append(item.example.advantage)
                weights.append(item.example.weight)
                metric_weights.append(
                    item.example.weight
                    if item.example.metric_weight is None
                    else item.example.metric_weight
                )
        segments.append((item.example.source, len(target_ids) - before))
    tensors: dict[str, Any] = {
        "predict_positions": torch.tensor(predict_positions, dtype=torch.long),
        "target_ids": torch.tensor(target_ids, dtype=torch.long),
        "sampler_logprobs": torch.tensor(sampler, dtype=torch.float32),
        "advantages": torch.tensor(advantages, dtype=torch.float32),
        "weights": torch.tensor(weights, dtype=torch.float32),
        "metric_weights": torch.tensor(metric_weights, dtype=torch.float32),
    }
    scored = [teacher for teacher in teachers if teacher is not None]
    if scored:
        k = len(scored[0].top_ids[0]) if scored[0].top_ids else 0
        top_ids = [ids for teacher in scored for ids in teacher.top_ids]
        top_logprobs = [lps for teacher in scored for lps in teacher.top_logprobs]
        if any(len(ids) != k for ids in top_ids):
            raise ValueError("the teacher scores of one micro-batch differ in top_k")
        teacher_logprobs = [lp for teacher in scored for lp in teacher.token_logprobs]
        n = len(teacher_logprobs)
        tensors["teacher_logprobs"] = torch.tensor(teacher_logprobs, dtype=torch.float32)
        # reshape, not view: with k = 0 the lists are empty and the shape is (n, 0).
        tensors["teacher_top_ids"] = torch.tensor(top_ids, dtype=torch.long).reshape(n, k)
        tensors["teacher_top_logprobs"] = torch.tensor(top_logprobs, dtype=torch.float32).reshape(
            n, k
        )
        if tensors["teacher_logprobs"].shape[0] != len(target_ids):
            raise ValueError("the teacher scored another number of tokens than the examples train")
    return tensors, segments


def _keep_and_rows(
    predict_positions: torch.Tensor, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-major flat predict positions -> (bool keep mask, index of each in the kept rows)."""
    keep = torch.zeros(width, dtype=torch.bool)
    keep[predict_positions] = True
    kept_index = torch.cumsum(keep.long(), 0) - 1
    return keep, kept_index[predict_positions]


def pack_row(
    examples: Sequence[TrainingExample],
    *,
    attn_implementation: str | None = None,
    share_prefixes: bool = True,
) -> MicroBatch:
    """One packed row: sequences end to end, position ids restarting, per-sequence attention.

    With ``share_prefixes`` (not possible with varlen flash attention, which only knows
    position ids), a sequence whose context starts like one already in the row (the
    rollouts of a group share their prompt) stores only the rest and attends to that
    sequence's copy of the prefix: the prompt is run once per row, not once per rollout.

    Example:
        >>> seq = TokenSequence([5, 6, 7], [False, False, True], [0.0, 0.0, -0.7])
        >>> batch = pack_row([TrainingExample(seq, 1.0, 1.0)] * 2, share_prefixes=False)
        >>> batch.position_ids.tolist(), batch.predict_mask.int().tolist()
        ([[0, 1, 2, 0, 1, 2]], [[0, 1, 0, 0, 1, 0]])
        >>> pack_row([TrainingExample(seq, 1.0, 1.0)] * 2).position_ids.tolist()
        [[0, 1, 2, 2]]
    """
    if not examples:
        raise ValueError("cannot pack an empty list of examples")
    varlen = attn_implementation in VARLEN_ATTENTION
    placed = _place(examples, share_prefixes=share_prefixes and not varlen)
    input_ids: list[int] = []
    positions: list[int] = []
    for item in placed:
        input_ids += item.example.sequence.token_ids[item.shared :]
        positions += range(item.shared, len(item.example))
    row_length = len(input_ids)
    tensors, segments = _per_token_tensors(placed)
    keep, target_rows = _keep_and_rows(tensors.pop("predict_positions"), row_length)
    return MicroBatch(
        input_ids=torch.tensor([input_ids], dtype=torch.long),
        position_ids=torch.tensor([positions], dtype=torch.long),
        attention_mask=None if varlen else packed_attention_mask(placed, row_length)[None, None],
        predict_mask=keep[None],
        target_rows=target_rows,
        num_tokens=row_length,
        num_sequences=len(examples),
        segments=segments,
        **tensors,
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
    input_ids, attention = [], []
    for example in examples:
        pad = row_length - len(example)
        input_ids.append(example.sequence.token_ids + [pad_token_id] * pad)
        attention.append([1] * len(example) + [0] * pad)
    # Row b starts at flat position b * row_length of the (rows, length) grid.
    placed = [_Placed(example, row * row_length) for row, example in enumerate(examples)]
    tensors, segments = _per_token_tensors(placed)
    keep, target_rows = _keep_and_rows(tensors.pop("predict_positions"), len(examples) * row_length)
    return MicroBatch(
        input_ids=torch.tensor(input_ids, dtype=torch.long),
        position_ids=torch.arange(row_length).expand(len(examples), -1).clone(),
        attention_mask=torch.tensor(attention, dtype=torch.long),
        predict_mask=keep.view(len(examples), row_length),
        target_rows=target_rows,
        num_tokens=sum(len(example) for example in examples),
        num_sequences=len(examples),
        segments=segments,
        **tensors,
    )


def _prefix_units(
    examples: Sequence[TrainingExample], max_tokens: int
) -> list[tuple[list[TrainingExample], int]]:
    """Examples in prefix order, cut into units whose members share a leading context, each
    unit within the budget, with its token cost when every shared context is stored once.

    Sorted by their token ids, sequences that start alike are neighbours, and the longest
    prefix a sequence shares with any sequence before it is the one it shares with its
    neighbour. So a sequence costs its length minus what it can share with its neighbour
    (``_place`` reuses at least that much). This shares more than the prompt of a group:
    every sequence of an agent's runs starts with its system prompt, including the later
    calls of a run whose history the chat template rewrote (they start a sequence of their
    own, ``assemble_sequences``) and the runs of other tasks.

    Example:
        >>> system = [7] * 8
        >>> a = TokenSequence(system + [1, 2], [False] * 9 + [True], [0.0] * 10)
        >>> b = TokenSequence(system + [3, 4, 5], [False] * 10 + [True], [0.0] * 11)
        >>> [(len(unit), cost) for unit, cost in _prefix_units(
        ...     [TrainingExample(a, 1.0, 1.0), TrainingExample(b, 1.0, 1.0)], max_tokens=64)]
        [(2, 13)]
    """
    units: list[tuple[list[TrainingExample], int]] = []
    current: list[TrainingExample] = []
    cost = 0
    for example in sorted(examples, key=lambda e: e.sequence.token_ids):
        shared = shareable_prefix(example.sequence, current[-1].sequence) if current else 0
        if current and (shared == 0 or cost + len(example) - shared > max_tokens):
            units.append((current, cost))
            current, cost, shared = [], 0, 0
        current.append(example)
        cost += len(example) - shared
    if current:
        units.append((current, cost))
    return units


def make_micro_batches(
    examples: Sequence[TrainingExample],
    *,
    max_tokens: int,
    packing: bool = True,
    share_prefixes: bool = True,
    attn_implementation: str | None = None,
    pad_token_id: int = 0,
) -> list[MicroBatch]:
    """Split examples into micro-batches of at most ``max_tokens`` tokens each.

    With ``packing``, each micro-batch is one packed row (first-fit decreasing); with
    ``share_prefixes`` too, sequences that start alike (a group's prompt, an agent's system
    prompt) go to the same row and their common start is counted (and run) once. Without
    packing, sequences of similar length are padded into rows and ``rows * longest <=
    max_tokens``. Examples with no trained token are dropped:
    they would cost a forward pass for nothing.

    Example:
        >>> seq = TokenSequence([5, 6, 7], [False, False, True], [0.0, 0.0, -0.7])
        >>> [b.num_tokens for b in make_micro_batches([TrainingExample(seq, 1.0, 1.0)] * 5, max_tokens=6)]
        [6, 3]
    """
    useful = [example for example in examples if example.sequence.num_trainable_tokens > 0]
    if packing:
        share = share_prefixes and attn_implementation not in VARLEN_ATTENTION
        units = _prefix_units(useful, max_tokens) if share else [([e], len(e)) for e in useful]
        rows = plan_rows([cost for _, cost in units], max_tokens)
        return [
            pack_row(
                [example for i in row for example in units[i][0]],
                attn_implementation=attn_implementation,
                share_prefixes=share,
            )
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
