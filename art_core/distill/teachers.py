"""From a ``TeacherConfig`` to a teacher, and from a teacher to scored rollouts.

The trainer (one process) and the distributed coordinator (before it splits the work over
ranks) both call ``score_rollouts`` once per step, after the rollouts are assembled and
before any forward pass, so every rank trains on the same teacher scores.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from art_core.distill.endpoint import EndpointTeacher
from art_core.distill.scores import Teacher, TeacherScores

if TYPE_CHECKING:
    from art_core.training.batch import Rollout
    from art_core.training.config import TeacherConfig


def make_teacher(config: TeacherConfig, *, device: str | None = None) -> Teacher:
    """The teacher ``config`` describes: an ``EndpointTeacher`` when it has a ``base_url``,
    else a ``LocalTeacher`` (loaded on first use, on ``device``).

    Example:
        >>> from art_core.training.config import TeacherConfig
        >>> type(make_teacher(TeacherConfig(model="tiny-random"))).__name__
        'LocalTeacher'
    """
    if config.base_url is not None:
        api_key = None
        if config.api_key_env is not None:
            api_key = os.environ.get(config.api_key_env)
            if not api_key:
                raise ValueError(
                    f"the teacher's API key is read from ${config.api_key_env}, which is not set"
                )
        return EndpointTeacher(
            config.base_url, config.model, api_key=api_key, timeout_s=config.timeout_s
        )
    # Torch and transformers: on first use.
    from art_core.distill.local import LocalTeacher

    return LocalTeacher(config.model, adapter=config.adapter, device=device)


def teacher_key(config: TeacherConfig) -> tuple[str | None, ...]:
    """What identifies one teacher (a trainer keeps its teacher while this stays the same)."""
    return (config.base_url, config.model, config.adapter, config.api_key_env)


def score_rollouts(
    rollouts: Sequence[Rollout],
    teacher: Teacher,
    *,
    top_k: int,
    vocab_size: int | None = None,
) -> dict[str, float]:
    """Score every sequence of ``rollouts`` with ``teacher`` and attach the scores
    (``rollout.teacher``); return timing and size metrics.

    Every answer is checked (``TeacherScores.check``) before anything is attached, so a
    broken teacher fails the step before it trains, naming the rollout.

    Example:
        >>> metrics = score_rollouts(rollouts, teacher, top_k=0)   # fragment: `rollouts` of a training step, a `teacher`  # doctest: +SKIP
        >>> rollouts[0].teacher[0].token_logprobs[:2]              # fragment  # doctest: +SKIP
        [-0.12, -2.3]
    """
    started = time.perf_counter()
    sequences = [seq for rollout in rollouts for seq in rollout.sequences]
    scores = teacher.score(sequences, top_k) if sequences else []
    if len(scores) != len(sequences):
        raise ValueError(
            f"the teacher returned {len(scores)} scores for {len(sequences)} sequences"
        )
    checked: list[list[TeacherScores]] = []
    position = 0
    for index, rollout in enumerate(rollouts):
        own = scores[position : position + len(rollout.sequences)]
        position += len(rollout.sequences)
        for seq, score in zip(rollout.sequences, own, strict=True):
            try:
                score.check(
                    num_trained=seq.num_trainable_tokens, top_k=top_k, vocab_size=vocab_size
                )
            except ValueError as exc:
                raise ValueError(f"teacher scores of rollout {index}: {exc}") from None
        checked.append(own)
    for rollout, own in zip(rollouts, checked, strict=True):
        rollout.teacher = own
    return {
        "distill/teacher_seconds": time.perf_counter() - started,
        "distill/scored_tokens": float(sum(seq.num_trainable_tokens for seq in sequences)),
    }
