"""The training signal of a GRPO step: what each rollout was trained with.

For every rollout a step trains on, one JSON line goes to ``signals/{split}/{step:04d}.jsonl``
of the model folder (beside ``trajectories/{split}/{step:04d}.jsonl``, under the same step:
the one that sampled the rollouts), so a viewer can colour every sampled token by the
advantage it was trained with and show the importance ratio the trainer saw::

    {"trajectory_id": str, "advantage": float, "token_weight": float,
     "sequences": [{"call_ids": [str, ...], "trained_tokens": int,
                    "trainer_logprobs": [float | null, ...] | null}, ...]}

- ``advantage``: the rollout's group-relative advantage (``prepare_batch``, after
  ``scale_rewards``), which every trained token of the rollout carries;
- ``token_weight``: the loss weight of each of its trained tokens, as used
  (``to_examples``: ``1 / (its trained tokens * rollouts in its optimizer update)``, so with
  ``optimizer_steps_per_epoch > 1`` the rollouts of each chunk);
- ``sequences``: the rollout's training sequences (``assemble_sequences``), in order. A
  sequence's trained tokens are the completion tokens of its calls, call by call in
  ``call_ids`` order; ``trainer_logprobs`` holds the trainer's logprob of each of them, from
  the first forward of the step's first epoch, or from the pass over the unchanged policy
  that truncated importance sampling makes before any update when there is one.
  ``exp(trainer_logprob - sampler_logprob)`` is the importance ratio the trainer saw.
  Rounded to 6 significant digits; a non-finite value is null; the list is null where the
  trainer did not report it.

Only a step that trained writes the file (not one that trained nothing, not SFT). Lines are
appended, one write each; ``ModelFolder.read_training_signal`` reads them back by trajectory.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from art_core.training.batch import Rollout
from art_core.training.packing import MicroBatch, Source, TrainingExample

# The trainer's logprob of each trained token of an example, by the example's source.
SeenLogprobs = dict[Source, list[float]]


def round_logprob(value: float) -> float | None:
    """A logprob for the signal file: 6 significant digits, None when not finite.

    Example:
        >>> round_logprob(-0.123456789), round_logprob(float("nan"))
        (-0.123457, None)
    """
    value = float(value)
    return float(f"{value:.6g}") if math.isfinite(value) else None


def record_logprobs(seen: SeenLogprobs, batch: MicroBatch, logprobs: torch.Tensor) -> None:
    """Add a micro-batch's logprobs of its trained tokens to ``seen``, by example source
    (``batch.segments``); examples without a source (padding) are left out."""
    if all(source is None for source, _ in batch.segments):
        return
    values = logprobs.detach().float().tolist()  # the micro-batch's one transfer to the host
    offset = 0
    for source, count in batch.segments:
        if source is not None:
            seen[source] = values[offset : offset + count]
        offset += count


def signal_records(
    rollouts: Sequence[Rollout],
    updates: Sequence[Sequence[TrainingExample]],
    seen: Mapping[Source, Sequence[float | None]] | None,
) -> list[dict[str, Any]]:
    """The signal file's records of a step: one per rollout that ``updates`` (the examples
    of each optimizer update, sources indexing ``rollouts``) trained, in rollout order.

    ``seen`` holds the trainer's logprobs by source (``record_logprobs``); None records
    ``trainer_logprobs: null`` for every sequence.

    Example:
        >>> from art_core.training.batch import to_examples
        >>> from art_core.training.sequences import TokenSequence
        >>> seq = TokenSequence([1, 2, 3], [False, True, True], [0.0, -1.0, -1.0], ["c1"])
        >>> rollouts = [Rollout([seq], 0.5, "r1"), Rollout([seq], -0.5, "r2")]
        >>> records = signal_records(rollouts, [to_examples(rollouts)], {(0, 0): [-0.9, -1.1]})
        >>> records[0]
        {'trajectory_id': 'r1', 'advantage': 0.5, 'token_weight': 0.25, 'sequences': [{'call_ids': ['c1'], 'trained_tokens': 2, 'trainer_logprobs': [-0.9, -1.1]}]}
        >>> records[1]["sequences"][0]["trainer_logprobs"] is None
        True
    """
    weights: dict[int, float] = {}
    for examples in updates:
        for example in examples:
            if example.source is not None:
                weights[example.source[0]] = example.weight
    records: list[dict[str, Any]] = []
    for index, rollout in enumerate(rollouts):
        if index not in weights:
            continue
        sequences = []
        for position, sequence in enumerate(rollout.sequences):
            trained = sequence.num_trainable_tokens
            values = None if seen is None else seen.get((index, position))
            sequences.append(
                {
                    "call_ids": list(sequence.call_ids),
                    "trained_tokens": trained,
                    # A sequence without trained tokens is never run: nothing to report.
                    "trainer_logprobs": []
                    if trained == 0
                    else None
                    if values is None
                    else [None if v is None else round_logprob(v) for v in values],
                }
            )
        records.append(
            {
                "trajectory_id": rollout.trajectory_id,
                "advantage": rollout.advantage,
                "token_weight": weights[index],
                "sequences": sequences,
            }
        )
    return records


def encode_seen(seen: Mapping[Source, Sequence[float]]) -> list[list[Any]]:
    """``seen`` as JSON-ready ``[rollout, sequence, [logprob | None, ...]]`` items, rounded
    as the signal file stores them (a rank sends its share to the coordinator this way).

    Example:
        >>> decode_seen(encode_seen({(1, 0): [-0.25, float("inf")]}))
        {(1, 0): [-0.25, None]}
    """
    return [
        [rollout, position, [round_logprob(v) for v in values]]
        for (rollout, position), values in seen.items()
    ]


def decode_seen(items: Sequence[Sequence[Any]]) -> dict[Source, list[float | None]]:
    """``encode_seen``'s items back into logprobs by source."""
    return {
        (int(rollout), int(position)): [None if v is None else float(v) for v in values]
        for rollout, position, values in items
    }
