"""reasoning-gym datasets as ``art_mcp`` scenarios, scored by the dataset's own
``score_answer``.

Each row of a reasoning-gym dataset (``reasoning_gym.create_dataset(name, size=..., seed=...)``:
procedurally generated, seeded, offline) becomes an ``art_mcp.Scenario`` whose task is the
row's question and whose metadata remembers the row's index. The reward the scenarios are
trained on is the dataset's ``score_answer(final_answer, entry)`` on the run's final answer
(``complete_task``'s argument): reasoning-gym's own check, with whatever partial credit that
generator defines (the default gives ``len(answer) / len(reply)`` when the reply contains the
answer).

Example:
    >>> import reasoning_gym
    >>> dataset = reasoning_gym.create_dataset("basic_arithmetic", size=2, seed=1)
    >>> [s.answer for s in scenarios_from_dataset(dataset)]
    ['-4', '3']
    >>> reward = score_answer_reward(dataset)
    >>> task = scenarios_from_dataset(dataset)[0]
    >>> reward(task, art.Trajectory(metadata={"final_answer": "-4"}))
    1.0
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from art_mcp import Scenario

import art_core as art

INDEX_KEY = "reasoning_gym_index"
DATASET_KEY = "reasoning_gym_dataset"


class Dataset(Protocol):
    """What a reasoning-gym dataset offers (``reasoning_gym.dataset.ProceduralDataset``)."""

    def __len__(self) -> int: ...

    def __getitem__(self, idx: int) -> dict[str, Any]: ...

    def score_answer(self, answer: str | None, entry: dict[str, Any]) -> float: ...


def _name(dataset: Dataset, entry: dict[str, Any]) -> str:
    """The generator's name as reasoning-gym gives it (``source_dataset``), else the class's."""
    metadata = entry.get("metadata")
    source = metadata.get("source_dataset") if isinstance(metadata, dict) else None
    return str(source or type(dataset).__name__)


def _entry(dataset: Dataset, index: int) -> dict[str, Any]:
    entry = dataset[index]
    if not isinstance(entry, dict):
        raise ValueError(f"row {index} of the dataset is not a dict: {entry!r:.200}")
    question, answer = entry.get("question"), entry.get("answer")
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"row {index} of the dataset has no question: {entry!r:.200}")
    if answer is not None and not isinstance(answer, str):
        raise ValueError(f"row {index}'s answer is not text: {answer!r:.200}")
    return entry


def scenarios_from_dataset(
    dataset: Dataset,
    indices: Sequence[int] | None = None,
    *,
    difficulty: int = 2,
    instructions: str = "",
) -> list[Scenario]:
    """One scenario per dataset row (all rows, or those of ``indices``): the question as the
    task (after ``instructions``, e.g. how to answer), the oracle answer as ``answer``.

    Example:
        >>> import reasoning_gym
        >>> dataset = reasoning_gym.create_dataset("basic_arithmetic", size=3, seed=1)
        >>> [s.metadata[INDEX_KEY] for s in scenarios_from_dataset(dataset, [2, 0])]
        [2, 0]
    """
    chosen = range(len(dataset)) if indices is None else indices
    out: list[Scenario] = []
    for index in chosen:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(dataset):
            raise ValueError(f"index {index!r} is not a row of the dataset (0..{len(dataset) - 1})")
        entry = _entry(dataset, index)
        task = f"{instructions.strip()} {entry['question']}".strip()
        out.append(
            Scenario(
                task=task,
                answer=entry.get("answer"),
                difficulty=difficulty,
                metadata={INDEX_KEY: index, DATASET_KEY: _name(dataset, entry)},
            )
        )
    return out


def score_answer_reward(dataset: Dataset) -> Callable[[Scenario, art.Trajectory], float]:
    """An ``art_mcp`` reward: the dataset's own ``score_answer`` on the run's final answer
    (``None`` when the run gave none, which reasoning-gym scores 0). The scenario must come
    from ``scenarios_from_dataset`` on the same dataset (checked: same question).

    Example:
        >>> import reasoning_gym
        >>> dataset = reasoning_gym.create_dataset("basic_arithmetic", size=1, seed=1)
        >>> task = scenarios_from_dataset(dataset)[0]
        >>> score_answer_reward(dataset)(task, art.Trajectory(metadata={"final_answer": None}))
        0.0
    """

    def reward(scenario: Scenario, trajectory: art.Trajectory) -> float:
        index = scenario.metadata.get(INDEX_KEY)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(dataset):
            raise ValueError(
                f"scenario {scenario.id} has no valid {INDEX_KEY!r}: make it with "
                "scenarios_from_dataset on this dataset"
            )
        entry = _entry(dataset, index)
        # (compared word by word: a scenario's task is stored stripped)
        if not " ".join(scenario.task.split()).endswith(" ".join(entry["question"].split())):
            raise ValueError(
                f"scenario {scenario.id} is not row {index} of this dataset "
                f"({scenario.task!r:.120} vs {entry['question']!r:.120})"
            )
        final = trajectory.metadata.get("final_answer")
        score = dataset.score_answer(final if isinstance(final, str) else None, entry)
        if not isinstance(score, int | float) or isinstance(score, bool) or not 0 <= score <= 1:
            raise ValueError(f"score_answer returned {score!r}, not a number in [0, 1]")
        return float(score)

    return reward
