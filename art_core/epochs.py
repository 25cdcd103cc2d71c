"""Seeded shuffles, epoch by epoch: which items a training step takes.

Every item comes once per epoch, each epoch in its own order drawn from the seed and the
epoch's number, so a resumed run (the same seed, the step it stopped at) continues the same
schedule. SFT's batches, the scenario sampler's order and the integrations' training loops
(``art_mcp.train``'s scenarios, ``art_cli_agents.train``'s tasks) all draw from here.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TypeVar

Item = TypeVar("Item")

# Epoch e of seed s shuffles with random.Random(s * EPOCH_SEED_STRIDE + e): distinct seeds
# never share an epoch's order for any e below the stride.
EPOCH_SEED_STRIDE = 1_000_003


def epoch_order(count: int, seed: int, epoch: int) -> list[int]:
    """The order of ``count`` items in epoch ``epoch`` of ``seed``'s shuffle.

    Example:
        >>> sorted(epoch_order(5, seed=0, epoch=1)) == list(range(5))
        True
        >>> epoch_order(5, seed=0, epoch=1) == epoch_order(5, seed=0, epoch=1)
        True
    """
    order = list(range(count))
    random.Random(seed * EPOCH_SEED_STRIDE + epoch).shuffle(order)
    return order


def items_for_step(items: Sequence[Item], step: int, per_step: int, seed: int = 0) -> list[Item]:
    """The ``per_step`` items of step ``step``: consecutive slices of the seeded shuffle,
    epoch after epoch (a step may span two).

    Example:
        >>> pool = ["a", "b", "c", "d", "e"]
        >>> sorted(items_for_step(pool, 0, 5)) == pool
        True
        >>> items_for_step(pool, 3, 2) == items_for_step(pool, 3, 2)
        True
    """
    if not items:
        raise ValueError("no items to take a step's from")
    chosen: list[Item] = []
    orders: dict[int, list[int]] = {}  # a step spans one epoch or two: each shuffled once
    for index in range(step * per_step, (step + 1) * per_step):
        epoch, position = divmod(index, len(items))
        if epoch not in orders:
            orders[epoch] = epoch_order(len(items), seed, epoch)
        chosen.append(items[orders[epoch][position]])
    return chosen
