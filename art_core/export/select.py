"""Which checkpoint an export takes: a named step, the best by a history metric, or the latest.

Step numbering follows the trainer (``art_core.training.trainer``): the rollouts of step ``s``
were sampled from checkpoint ``s`` and their history record is stored under step ``s``, so a
metric recorded at step ``s`` (``train/reward``, a ``val/reward`` logged while checkpoint ``s``
was served) measures checkpoint ``s``. Only steps with a complete checkpoint can be chosen;
step 0 is the base model, which has no adapter to export.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from art_core.model_folder import ModelFolder

# Keys of a history record that describe it rather than measure the checkpoint.
RECORD_KEYS = ("step", "split", "time", "checkpoint_step")


@dataclass(frozen=True)
class Choice:
    """The chosen checkpoint and why: ``how`` is "step", "best" or "latest"; for "best",
    the metric, its value at ``step`` and the direction compared."""

    step: int
    how: str
    metric: str | None = None
    value: float | None = None
    higher_is_better: bool | None = None

    def as_json(self) -> dict[str, Any]:
        record: dict[str, Any] = {"how": self.how}
        if self.how == "best":
            record.update(
                metric=self.metric, value=self.value, higher_is_better=self.higher_is_better
            )
        return record


def _steps_text(steps: list[int]) -> str:
    return ", ".join(str(s) for s in steps) if steps else "none"


def check_step(step: object) -> int:
    """``step`` as a checkpoint step (an int >= 1), else ``ValueError``."""
    if isinstance(step, bool) or not isinstance(step, int):
        raise ValueError(f"step must be an int >= 1, got {step!r}")
    if step < 1:
        raise ValueError(
            f"step must be >= 1, got {step} (step 0 is the base model: there is no adapter "
            "to export)"
        )
    return step


def metric_values(history: list[dict[str, Any]], metric: str, steps: list[int]) -> dict[int, float]:
    """``metric`` by step, for ``steps`` (the last record of a step with the metric wins).

    Example:
        >>> metric_values([{"step": 1, "r": 0.2}, {"step": 1, "r": 0.4}, {"step": 3, "r": 1}],
        ...               "r", [1, 2])
        {1: 0.4}
    """
    values: dict[int, float] = {}
    for record in history:
        step, value = record.get("step"), record.get(metric)
        if (
            isinstance(step, int)
            and step in steps
            and isinstance(value, int | float)
            and not isinstance(value, bool)
        ):
            values[step] = float(value)
    return values


def choose_checkpoint(
    folder: ModelFolder,
    *,
    step: int | None = None,
    best: str | None = None,
    higher_is_better: bool | None = None,
) -> Choice:
    """The checkpoint to export from ``folder``.

    ``step``: that step, which must have a complete checkpoint. ``best``: the checkpointed
    step with the best value of that history metric (higher is better unless the name
    contains "loss", or as ``higher_is_better`` says; ties go to the later step, as
    ``Trainer.delete_checkpoints`` keeps). Neither: the latest complete checkpoint.

    Raises ``ValueError`` (both given, a bad step, a metric not in the history or only at
    steps without a checkpoint) or ``FileNotFoundError`` (no such checkpoint, none at all),
    each naming the steps there are.

    Example:
        >>> choose_checkpoint(folder, best="val/reward")  # needs files: a model folder with checkpoints and history  # doctest: +SKIP
        Choice(step=2, how='best', metric='val/reward', value=0.75, higher_is_better=True)
    """
    if step is not None and best is not None:
        raise ValueError("give step or best, not both")
    if step is not None:
        check_step(step)
    if best is not None and (not isinstance(best, str) or not best.strip()):
        raise ValueError(f"best must name a history metric (e.g. 'val/reward'), got {best!r}")
    if higher_is_better is not None and best is None:
        raise ValueError("higher_is_better only applies with best=METRIC")
    steps = folder.checkpoint_steps()
    if not steps:
        raise FileNotFoundError(
            f"{folder.root} has no complete checkpoint to export (train at least one step "
            f"first; looked in {folder.checkpoints})"
        )
    if step is not None:
        if step not in steps:
            raise FileNotFoundError(
                f"{folder.root} has no complete checkpoint for step {step}; "
                f"checkpointed steps: {_steps_text(steps)}"
            )
        return Choice(step, "step")
    if best is None:
        return Choice(steps[-1], "latest")
    history = folder.read_history()
    if not any(isinstance(r.get(best), int | float) for r in history):
        known = sorted(
            {
                key
                for record in history
                for key, value in record.items()
                if key not in RECORD_KEYS and isinstance(value, int | float)
            }
        )
        raise ValueError(
            f"metric {best!r} is not in {folder.history}; metrics there: "
            f"{', '.join(known) if known else 'none'}"
        )
    values = metric_values(history, best, steps)
    if not values:
        recorded = sorted(
            {r["step"] for r in history if isinstance(r.get("step"), int) and best in r}
        )
        raise ValueError(
            f"metric {best!r} was recorded at steps {_steps_text(recorded)}, none of which "
            f"has a complete checkpoint (checkpointed steps: {_steps_text(steps)})"
        )
    if higher_is_better is None:
        higher_is_better = "loss" not in best
    sign = 1.0 if higher_is_better else -1.0
    chosen = max(values, key=lambda s: (sign * values[s], s))
    return Choice(chosen, "best", best, values[chosen], higher_is_better)


def history_at(folder: ModelFolder, step: int) -> list[dict[str, Any]]:
    """The history records stored under ``step`` (every split), in file order."""
    return [r for r in folder.read_history() if r.get("step") == step]


def metrics_of(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The metrics of ``records`` in one mapping (a later record's value wins): the named
    ``split/metric`` values, not what else a record holds (an eval's labels, a step's
    diagnoses).

    Example:
        >>> metrics_of([{"step": 1, "split": "train", "train/reward": 0.5, "time": 1.0},
        ...             {"step": 1, "split": "diagnoses", "diagnoses": [{"code": "truncated"}]}])
        {'train/reward': 0.5}
    """
    merged: dict[str, Any] = {}
    for record in records:
        for key, value in record.items():
            if key not in RECORD_KEYS and "/" in key:
                merged[key] = value
    return merged
