"""Supervised warm start: SFT data, its rendering, rejection sampling and teacher runs.

``model.train_sft(data, config=art.SFTConfig(...))`` trains the model's adapter on
demonstrations before (or between) GRPO steps. This package turns what users have into
what the trainer needs: ``data`` (paths, trajectories, groups, chat records; labelled and
checked), ``render`` (token-exact sequences for recorded calls, the chat template for the
rest), ``best_trajectories`` (rejection sampling) and ``teacher`` (running a rollout
function with a teacher model behind a recording proxy).

Example:
    >>> import art_core as art
    >>> await model.train_sft("demos.jsonl", config=art.SFTConfig(epochs=3))  # needs a registered model: `model`, and `demos.jsonl`  # doctest: +SKIP
    >>> await model.train_sft(art.best_trajectories(groups, min_reward=1.0))  # needs a registered model: `groups` made with it  # doctest: +SKIP
"""

from art_core.sft.data import (
    Demonstration,
    SFTData,
    best_trajectories,
    chat_record_to_trajectory,
    check_demonstration,
    demonstrations,
    load_chat_jsonl,
)

__all__ = [
    "Demonstration",
    "SFTData",
    "best_trajectories",
    "chat_record_to_trajectory",
    "check_demonstration",
    "demonstrations",
    "load_chat_jsonl",
]
