"""From trajectory groups to the rollouts of one training step, and their examples.

This is where the data model meets the trainer: each group's rewards become advantages,
each trajectory's calls become token sequences, and skipped or empty inputs are counted so
the metrics say what was (not) trained on.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from art_core.training.advantages import (
    LossNormalization,
    ScaleRewards,
    group_advantages,
    population_std,
    rollout_token_weight,
    token_weight,
)
from art_core.training.packing import TrainingExample
from art_core.training.sequences import TokenSequence, assemble_sequences
from art_core.trajectories import TrajectoryGroup, require_finished

if TYPE_CHECKING:
    from art_core.distill.scores import TeacherScores


@dataclass
class Rollout:
    """The trainable part of one trajectory: its sequences and its advantage (and the
    trajectory's id, which the training signal is recorded under)."""

    sequences: list[TokenSequence]
    advantage: float
    trajectory_id: str = ""
    # On-policy distillation: the teacher's scores of each sequence (``attach_teacher``).
    teacher: list[TeacherScores] | None = None

    @property
    def num_trainable_tokens(self) -> int:
        return sum(seq.num_trainable_tokens for seq in self.sequences)


@dataclass
class PreparedBatch:
    """The rollouts to train on and metrics about the groups they came from."""

    rollouts: list[Rollout]
    metrics: dict[str, float] = field(default_factory=dict)


def _means(records: Sequence[dict[str, float | int | bool]]) -> dict[str, float]:
    values: dict[str, list[float]] = {}
    for metrics in records:
        for name, value in metrics.items():
            if isinstance(value, int | float) and math.isfinite(float(value)):
                values.setdefault(name, []).append(float(value))
    return {name: sum(v) / len(v) for name, v in values.items()}


def _user_metrics(groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
    """Trajectory metrics averaged over trajectories, group metrics over groups (e.g. RULER's
    judge calls, a sampler's report); a group metric named like a trajectory metric is
    recorded as ``train/group/{name}``."""
    per_trajectory = _means([t.metrics for group in groups for t in group.trajectories])
    per_group = _means([group.metrics for group in groups])
    metrics = {f"train/{name}": value for name, value in per_trajectory.items()}
    for name, value in per_group.items():
        metrics[f"train/group/{name}" if name in per_trajectory else f"train/{name}"] = value
    return metrics


def prepare_batch(
    groups: Sequence[TrajectoryGroup],
    *,
    scale_rewards: bool | ScaleRewards = "group",
    keep_equal_groups: bool = False,
) -> PreparedBatch:
    """Advantages and token sequences for every trajectory of groups that carry a signal.

    Trajectories without recorded calls still count in their group's reward statistics
    (they are real samples of the policy) but have nothing to train on. Groups whose
    rewards are all equal are skipped (and counted) unless ``keep_equal_groups``
    (distillation learns from them): then their advantages are 0.

    Example:
        >>> from art_core.trajectories import LLMCall, Trajectory
        >>> def traj(reward):
        ...     call = LLMCall(model="m", messages=[], prompt_token_ids=[1],
        ...                    completion_token_ids=[2], logprobs=[-1.0])
        ...     return Trajectory(calls=[call], reward=reward)
        >>> batch = prepare_batch([TrajectoryGroup([traj(1.0), traj(0.0)])], scale_rewards=False)
        >>> [r.advantage for r in batch.rollouts]
        [0.5, -0.5]
    """
    require_finished(groups)
    rollouts: list[Rollout] = []
    rewards = [trajectory.reward for group in groups for trajectory in group.trajectories]
    batch_std = population_std([float(reward) for reward in rewards])
    skipped = without_calls = breaks = sequences = 0
    for group in groups:
        group_rewards = [trajectory.reward for trajectory in group.trajectories]
        advantages = group_advantages(
            group_rewards, scale_rewards=scale_rewards, batch_std=batch_std
        )
        if advantages is None:
            skipped += 1
            if not keep_equal_groups:
                continue
            advantages = [0.0] * len(group_rewards)
        for trajectory, advantage in zip(group.trajectories, advantages, strict=True):
            if not trajectory.calls:
                without_calls += 1
                continue
            assembled = assemble_sequences(trajectory.calls)
            breaks += assembled.breaks
            sequences += len(assembled.sequences)
            rollout = Rollout(assembled.sequences, advantage, trajectory.id)
            if rollout.num_trainable_tokens > 0:
                rollouts.append(rollout)

    metrics = _user_metrics(groups)
    metrics.update(
        {
            "train/reward": statistics.fmean(rewards) if rewards else 0.0,
            "train/reward_std": statistics.pstdev(rewards) if rewards else 0.0,
            "train/num_groups": float(len(groups)),
            "train/num_trajectories": float(len(rewards)),
            "train/num_exceptions": float(sum(len(group.exceptions) for group in groups)),
            "train/groups_skipped": float(skipped),
            "train/trajectories_without_calls": float(without_calls),
            "train/num_rollouts_trained": float(len(rollouts)),
            "train/num_sequences": float(sequences),
            "train/sequence_breaks": float(breaks),
            "train/num_trainable_tokens": float(sum(r.num_trainable_tokens for r in rollouts)),
        }
    )
    return PreparedBatch(rollouts=rollouts, metrics=metrics)


def split_rollouts(rollouts: Sequence[Rollout], parts: int) -> list[list[Rollout]]:
    """Split rollouts into ``parts`` contiguous, near-equal chunks (one per optimizer step).

    Example:
        >>> [len(chunk) for chunk in split_rollouts([Rollout([], 0.0)] * 5, 2)]
        [3, 2]
    """
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    size, extra = divmod(len(rollouts), parts)
    chunks: list[list[Rollout]] = []
    start = 0
    for index in range(parts):
        end = start + size + (1 if index < extra else 0)
        if end > start:
            chunks.append(list(rollouts[start:end]))
        start = end
    return chunks


def to_examples(
    rollouts: Sequence[Rollout],
    *,
    start: int = 0,
    normalization: LossNormalization = "grpo",
    dr_grpo_length: int | None = None,
) -> list[TrainingExample]:
    """Examples of one optimizer step, with the loss weights of ``normalization``
    (``advantages.token_weight``: by default every rollout weighs ``1/len``) and, as metric
    weights, the per-rollout credit.

    Each example's ``source`` is ``(start + index of its rollout, index of its sequence)``.
    ``dr_grpo_length`` defaults to the most trained tokens of any of these rollouts.

    Example:
        >>> seq = TokenSequence([1, 2, 3], [False, True, True], [0.0, -1.0, -1.0])
        >>> [e.weight for e in to_examples([Rollout([seq], 1.0), Rollout([seq, seq], -1.0)])]
        [0.25, 0.125, 0.125]
        >>> [e.source for e in to_examples([Rollout([seq, seq], 1.0)], start=3)]
        [(3, 0), (3, 1)]
    """
    examples: list[TrainingExample] = []
    update_tokens = sum(rollout.num_trainable_tokens for rollout in rollouts)
    length = dr_grpo_length or max((r.num_trainable_tokens for r in rollouts), default=1)
    for index, rollout in enumerate(rollouts, start=start):
        credit = rollout_token_weight(rollout.num_trainable_tokens, len(rollouts))
        weight = token_weight(
            normalization,
            rollout_tokens=rollout.num_trainable_tokens,
            num_rollouts=len(rollouts),
            update_tokens=update_tokens,
            dr_grpo_length=length,
        )
        teacher: Sequence[TeacherScores | None] = rollout.teacher or [None] * len(rollout.sequences)
        examples += [
            TrainingExample(
                seq,
                rollout.advantage,
                weight,
                source=(index, position),
                metric_weight=None if weight == credit else credit,
                teacher=scores,
            )
            for position, (seq, scores) in enumerate(zip(rollout.sequences, teacher, strict=True))
        ]
    return examples


def update_examples(
    rollouts: Sequence[Rollout],
    parts: int,
    *,
    normalization: LossNormalization = "grpo",
    dr_grpo_length: int | None = None,
) -> list[list[TrainingExample]]:
    """The examples of each optimizer update of an epoch: ``rollouts`` split into ``parts``
    chunks (``split_rollouts``), each chunk weighted by ``normalization`` (with GRPO's and
    DAPO's, each chunk's weights sum to 1); sources index ``rollouts``. Dr. GRPO's length
    defaults to the most trained tokens of any rollout of the step, one constant for all
    chunks.

    Example:
        >>> seq = TokenSequence([1, 2], [False, True], [0.0, -1.0])
        >>> updates = update_examples([Rollout([seq], 1.0)] * 3, 2)
        >>> [[(e.source, e.weight) for e in update] for update in updates]
        [[((0, 0), 0.5), ((1, 0), 0.5)], [((2, 0), 1.0)]]
    """
    updates: list[list[TrainingExample]] = []
    length = dr_grpo_length or max((r.num_trainable_tokens for r in rollouts), default=1)
    start = 0
    for chunk in split_rollouts(rollouts, parts):
        updates.append(
            to_examples(chunk, start=start, normalization=normalization, dr_grpo_length=length)
        )
        start += len(chunk)
    return updates


def nothing_trained_reason(metrics: dict[str, float]) -> str:
    """Why a step's ``prepare_batch`` metrics leave no token to train on, naming the metrics.

    Example:
        >>> nothing_trained_reason({"train/num_groups": 2.0, "train/groups_skipped": 2.0,
        ...                         "train/num_trajectories": 8.0})
        'all 2 groups had equal rewards, so no advantage (train/groups_skipped=2)'
    """
    groups = int(metrics.get("train/num_groups", 0))
    skipped = int(metrics.get("train/groups_skipped", 0))
    trajectories = int(metrics.get("train/num_trajectories", 0))
    without_calls = int(metrics.get("train/trajectories_without_calls", 0))
    if trajectories == 0:
        exceptions = int(metrics.get("train/num_exceptions", 0))
        return f"the groups hold no trajectories (train/num_exceptions={exceptions})"
    if skipped == groups:
        return (
            f"all {groups} groups had equal rewards, so no advantage "
            f"(train/groups_skipped={skipped})"
        )
    reasons = []
    if skipped:
        reasons.append(f"{skipped} of {groups} groups had equal rewards (train/groups_skipped)")
    if without_calls:
        reasons.append(
            f"{without_calls} trajectories match no recorded call "
            f"(train/trajectories_without_calls={without_calls}): were their completions "
            "served by this model's gateway, and are their choices in messages_and_choices?"
        )
    reasons.append("no completion tokens to train on (train/num_trainable_tokens=0)")
    return "; ".join(reasons)
