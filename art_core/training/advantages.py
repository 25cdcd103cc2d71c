"""Group-relative advantages and per-rollout credit.

GRPO needs no value model: a rollout's advantage is how much better its reward is than the
other rollouts of the same scenario. A group whose rewards are all equal says nothing about
which behaviour is better, so it is skipped (and counted) rather than trained on with zero
advantage, which would only cost compute.

How token losses add up to a step's loss is ``token_weight``'s (one place, the formulas
there): per rollout by default, every token alike (DAPO) or over a constant (Dr. GRPO).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

# "Equal" rewards (within a float tolerance) are defined once, with the data model.
from art_core.trajectories import rewards_differ

# Added to the std before dividing (TRL and ART use the same order of magnitude).
STD_EPSILON = 1e-6

ScaleRewards = Literal["group", "batch", "none"]
LossNormalization = Literal["grpo", "dapo", "dr_grpo"]


def population_std(values: Sequence[float]) -> float:
    """The population standard deviation (0.0 for fewer than two values).

    Example:
        >>> population_std([1.0, 0.0, 0.0, 1.0])
        0.5
    """
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def group_advantages(
    rewards: Sequence[float],
    *,
    scale_rewards: bool | ScaleRewards = "group",
    batch_std: float | None = None,
    keep_equal: bool = False,
) -> list[float] | None:
    """Advantages of one group's rollouts, or None when the group carries no signal.

    ``A_i = r_i - mean(r)``, then divided by ``std + 1e-6`` (population std):

    - ``"group"`` (GRPO; ``True``): the std of this group's rewards;
    - ``"batch"``: ``batch_std``, the std of every reward of the step (TRL's "batch": a group
      with little spread is not blown up to unit scale);
    - ``"none"`` (Dr. GRPO; ``False``): not divided.

    Returns None for groups with fewer than two rollouts or all-equal rewards, unless
    ``keep_equal`` (distillation trains them too): then their advantages are all 0.

    Example:
        >>> group_advantages([1.0, 0.0, 0.0, 1.0], scale_rewards="none")
        [0.5, -0.5, -0.5, 0.5]
        >>> [round(a, 4) for a in group_advantages([1.0, 0.0, 0.0, 1.0])]
        [1.0, -1.0, -1.0, 1.0]
        >>> [round(a, 4) for a in group_advantages([1.0, 0.0], scale_rewards="batch", batch_std=1.0)]
        [0.5, -0.5]
        >>> group_advantages([0.3, 0.3]) is None, group_advantages([0.3, 0.3], keep_equal=True)
        (True, [0.0, 0.0])
    """
    values = [float(r) for r in rewards]
    if any(not math.isfinite(v) for v in values):
        raise ValueError(f"rewards must be finite numbers, got {values}")
    mode: str = (
        ("group" if scale_rewards else "none") if isinstance(scale_rewards, bool) else scale_rewards
    )
    if mode not in ("group", "batch", "none"):
        raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', got {scale_rewards!r}")
    if not rewards_differ(values):
        return [0.0] * len(values) if keep_equal else None
    mean = sum(values) / len(values)
    centered = [v - mean for v in values]
    if mode == "none":
        return centered
    if mode == "batch":
        if batch_std is None:
            raise ValueError(
                "scale_rewards='batch' needs batch_std (the std of the step's rewards)"
            )
        std = batch_std
    else:
        std = population_std(values)
    return [c / (std + STD_EPSILON) for c in centered]


def token_weight(
    normalization: LossNormalization,
    *,
    rollout_tokens: int,
    num_rollouts: int,
    update_tokens: int,
    dr_grpo_length: int,
) -> float:
    """The loss weight of each trained token of a rollout; the step's loss is
    ``sum over trained tokens of weight * token loss`` (summed over micro-batches).

    With ``T_i`` the rollout's trained tokens, ``R`` the rollouts of the optimizer update and
    ``T`` their trained tokens together:

    - ``"grpo"``: ``1 / (T_i * R)``, the mean over rollouts of each rollout's token mean
      (GRPO's ``1/G sum_i 1/|o_i| sum_t``): every rollout weighs the same, whatever its length;
    - ``"dapo"``: ``1 / T``, DAPO's token-level mean: every token weighs the same, so longer
      rollouts count for more;
    - ``"dr_grpo"``: ``1 / (R * L)``, Dr. GRPO's constant normaliser (``L`` =
      ``dr_grpo_length``): no length bias and no std bias; weights sum to ``T / (R * L)``.

    Example:
        >>> token_weight("grpo", rollout_tokens=4, num_rollouts=2, update_tokens=10, dr_grpo_length=8)
        0.125
        >>> token_weight("dapo", rollout_tokens=4, num_rollouts=2, update_tokens=10, dr_grpo_length=8)
        0.1
        >>> token_weight("dr_grpo", rollout_tokens=4, num_rollouts=2, update_tokens=10, dr_grpo_length=8)
        0.0625
    """
    if normalization == "grpo":
        return rollout_token_weight(rollout_tokens, num_rollouts)
    if rollout_tokens <= 0 or num_rollouts <= 0:
        raise ValueError(
            f"a token weight needs a rollout with trained tokens, got {rollout_tokens} tokens "
            f"and {num_rollouts} rollouts"
        )
    if normalization == "dapo":
        return 1.0 / update_tokens
    if normalization == "dr_grpo":
        if dr_grpo_length <= 0:
            raise ValueError(f"dr_grpo_length must be >= 1, got {dr_grpo_length}")
        return 1.0 / (num_rollouts * dr_grpo_length)
    raise ValueError(
        f"loss_normalization must be 'grpo', 'dapo' or 'dr_grpo', got {normalization!r}"
    )


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
