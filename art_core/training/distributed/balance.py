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


def _assign(
    items: list[tuple[list[int], tuple[int, ...], int]], ranks: int
) -> tuple[int, list[list[int]]]:
    """Longest item first onto the rank it leaves least loaded; an item is (example indexes,
    shared prefix, tokens when run alone). Returns the largest load and each rank's indexes."""
    loads = [0] * ranks
    held: list[set[tuple[int, ...]]] = [set() for _ in range(ranks)]
    chosen: list[list[int]] = [[] for _ in range(ranks)]
    for indexes, prefix, cost in sorted(items, key=lambda item: (-item[2], item[0][0])):

        def load_after(rank: int, prefix: tuple[int, ...] = prefix, cost: int = cost) -> int:
            return loads[rank] + cost - (len(prefix) if prefix and prefix in held[rank] else 0)

        rank = min(range(ranks), key=lambda r: (load_after(r), loads[r], r))
        loads[rank] = load_after(rank)
        if prefix:
            held[rank].add(prefix)
        chosen[rank] += indexes
    return max(loads), chosen


def split_by_tokens(
    examples: Sequence[TrainingExample], ranks: int, *, share_prefixes: bool = True
) -> list[list[TrainingExample]]:
    """``ranks`` lists of examples with near-equal token counts, each in the input order.

    Two greedy splits are tried and the one whose busiest rank runs fewer tokens wins:
    rollouts one by one (fine-grained, each rank pays a shared prompt once), and whole
    groups of rollouts sharing a prompt (their prompt runs once in all). Examples without a
    trained token are dropped (packing drops them too). With one rank the input comes back
    unchanged (untrained examples aside), so a world of one packs exactly the micro-batches
    of the in-process trainer.

    Example:
        >>> from art_core.training.sequences import TokenSequence
        >>> def ex(n):
        ...     mask = [False] + [True] * (n - 1)
        ...     return TrainingExample(TokenSequence(list(range(n)), mask, [0.0] * n), 1, 1)
        >>> [[len(e) for e in part] for part in split_by_tokens([ex(8), ex(3), ex(4), ex(2)], 2)]
        [[8], [3, 4, 2]]
    """
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    useful = [i for i, e in enumerate(examples) if e.sequence.num_trainable_tokens > 0]
    if ranks == 1:
        return [[examples[i] for i in useful]]
    prefixes = {i: _prefix(examples[i]) if share_prefixes else () for i in useful}
    singles = [([i], prefixes[i], len(examples[i])) for i in useful]
    by_prefix: dict[tuple[int, ...], list[int]] = {}
    for i in useful:
        if prefixes[i]:
            by_prefix.setdefault(prefixes[i], []).append(i)
    groups = [
        (members, prefix, len(prefix) + sum(len(examples[i]) - len(prefix) for i in members))
        for prefix, members in by_prefix.items()
    ]
    groups += [([i], (), len(examples[i])) for i in useful if not prefixes[i]]
    _, chosen = min(_assign(singles, ranks), _assign(groups, ranks), key=lambda r: r[0])
    return [[examples[i] for i in sorted(indexes)] for indexes in chosen]
