"""Group-relative advantages and per-rollout credit.

GRPO needs no value model: a rollout's advantage is how much better its reward is than the
other rollouts of the same scenario. A group whose rewards are all equal says nothing about
which behaviour is better, so it is skipped (and counted) rather than trained on with zero
advantage, which would only cost compute.

Credit is per rollout, not per token: every token a rollout trains on gets the weight
``1 / (tokens of that rollout * rollouts in the batch)``, so each rollout contributes the same
total weight however many calls or tokens it made.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# "Equal" rewards (within a float tolerance) are defined once, with the data model.
from art_core.trajectories import rewards_differ

# Added to the std before dividing (TRL and ART use the same order of magnitude).
STD_EPSILON = 1e-6


def group_advantages(rewards: Sequence[float], *, scale_rewards: bool = True) -> list[float] | None:
    """Advantages of one group's rollouts, or None when the group carries no signal.

    ``reward - mean(rewards)``, divided by ``std(rewards) + 1e-6`` (population std) when
    ``scale_rewards``. Returns None for groups with fewer than two rollouts or all-equal
    rewards.

    Example:
        >>> group_advantages([1.0, 0.0, 0.0, 1.0], scale_rewards=False)
        [0.5, -0.5, -0.5, 0.5]
        >>> [round(a, 4) for a in group_advantages([1.0, 0.0, 0.0, 1.0])]
        [1.0, -1.0, -1.0, 1.0]
        >>> group_advantages([0.3, 0.3]) is None
        True
    """
    values = [float(r) for r in rewards]
    if any(not math.isfinite(v) for v in values):
        raise ValueError(f"rewards must be finite numbers, got {values}")
    if not rewards_differ(values):
        return None
    mean = sum(values) / len(values)
    centered = [v - mean for v in values]
    if not scale_rewards:
        return centered
    std = math.sqrt(sum(c * c for c in centered) / len(values))
    return [c / (std + STD_EPSILON) for c in centered]


def rollout_token_weight(num_trainable_tokens: int, num_rollouts: int) -> float:
    """The loss weight of each trained token of a rollout: all rollouts weigh the same.

    The token weights of one batch sum to 1, so the loss is a mean over rollouts of each
    rollout's mean token loss.

    Example:
        >>> rollout_token_weight(4, 2)   # 4 tokens of one rollout out of 2 rollouts
        0.125
    """
    if num_trainable_tokens <= 0 or num_rollouts <= 0:
        raise ValueError(
            "a rollout's token weight needs at least one trained token and one rollout, got "
            f"{num_trainable_tokens} tokens and {num_rollouts} rollouts"
        )
    return 1.0 / (num_trainable_tokens * num_rollouts)
