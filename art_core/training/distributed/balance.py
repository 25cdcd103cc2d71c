"""Splitting one optimizer update's examples across data-parallel ranks by token count.

The examples arrive with their loss weights already computed over the whole update
(``batch.to_examples``): every trained token's weight is final, so where a token is run
does not change the update, only how long each rank works. The split balances the tokens
each rank runs (longest first onto the rank that ends up least loaded), and counts a
prompt that a rank already holds for another rollout of the same group as free, since
packing runs it once per row there (``packing.make_micro_batches``).
"""

from __future__ import annotations

from collections.abc import Sequence

from art_core.training.packing import TrainingExample, first_trained_index


def _prefix(example: TrainingExample) -> tuple[int, ...]:
    """The context before the first trained token: what rollouts of one group share."""
    return tuple(example.sequence.token_ids[: first_trained_index(example.sequence)])


def split_by_tokens(
    examples: Sequence[TrainingExample], ranks: int, *, share_prefixes: bool = True
) -> list[list[TrainingExample]]:
    """``ranks`` lists of examples with near-equal token counts, each in the input order.

    Examples without a trained token are dropped (packing drops them too). With one rank
    the input comes back unchanged (untrained examples aside), so a world of one packs
    exactly the micro-batches of the in-process trainer.

    Example:
        >>> from art_core.training.sequences import TokenSequence
        >>> def ex(n):
        ...     return TrainingExample(TokenSequence(list(range(n)), [True] * n, [0.0] * n), 1, 1)
        >>> [[len(e) for e in part] for part in split_by_tokens([ex(8), ex(3), ex(4), ex(2)], 2)]
        [[8], [3, 4, 2]]
    """
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    useful = [
        (index, example)
        for index, example in enumerate(examples)
        if example.sequence.num_trainable_tokens > 0
    ]
    if ranks == 1:
        return [[example for _, example in useful]]
    loads = [0] * ranks
    prefixes: list[set[tuple[int, ...]]] = [set() for _ in range(ranks)]
    chosen: list[list[int]] = [[] for _ in range(ranks)]
    for index, example in sorted(useful, key=lambda item: (-len(item[1]), item[0])):
        prefix = _prefix(example) if share_prefixes else ()

        def load_after(rank: int, example: TrainingExample = example, prefix=prefix) -> int:
            shared = len(prefix) if prefix and prefix in prefixes[rank] else 0
            return loads[rank] + len(example) - shared

        rank = min(range(ranks), key=lambda r: (load_after(r), loads[r], r))
        loads[rank] = load_after(rank)
        if prefix:
            prefixes[rank].add(prefix)
        chosen[rank].append(index)
    return [[examples[index] for index in sorted(indexes)] for indexes in chosen]
