"""Why a run cannot learn, read from its own records, and which setting would change it.

``diagnose(groups)`` runs every rule of ``art_core.diagnoses.rules`` over the groups of one
step (their recorded calls, rewards, metadata and metrics) and returns the diagnoses that
fired. ``LocalBackend.train`` calls it on every step: the diagnoses come back in
``TrainResult.diagnoses``, go to ``history.jsonl`` (a ``"split": "diagnoses"`` record) and
the viewer, and are logged when the step trained nothing. ``RunDiagnoses`` gathers them over
a run for its final table, and adds the run-level one: rewards flat over the steps.

Example:
    >>> import art_core as art
    >>> groups = [art.TrajectoryGroup([art.Trajectory(reward=0.0) for _ in range(4)])]
    >>> [d.code for d in diagnose(groups)]
    ['constant_reward']
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from art_core.diagnoses.diagnosis import Diagnosis
from art_core.diagnoses.facts import RolloutFacts, rollout_facts
from art_core.diagnoses.rules import RULES, StepFacts
from art_core.diagnoses.run import RunDiagnoses
from art_core.trajectories import TrajectoryGroup

__all__ = ["Diagnosis", "RolloutFacts", "RunDiagnoses", "StepFacts", "diagnose", "step_facts"]


def _count(metrics: dict[str, Any], name: str) -> int:
    value = metrics.get(name)
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def step_facts(groups: Sequence[TrajectoryGroup], *, answer_tool: str | None = None) -> StepFacts:
    """The facts of one step's groups. Groups from dynamic sampling carry the count of the
    all-equal groups it discarded (``sampling_groups_all_equal`` in their metrics)."""
    discarded = max((_count(g.metrics, "sampling_groups_all_equal") for g in groups), default=0)
    facts = StepFacts(
        [[rollout_facts(t, answer_tool=answer_tool) for t in g.trajectories] for g in groups]
    )
    # The sampler's count includes the all-equal groups it returned when none had a signal.
    facts.discarded_all_equal = max(0, discarded - facts.groups_all_equal)
    return facts


def diagnose(
    groups: Iterable[TrajectoryGroup], *, answer_tool: str | None = None
) -> list[Diagnosis]:
    """Every rule that fires on one step's ``groups``, most specific first.

    ``answer_tool`` names the tool whose call gives the task's answer when the rollouts do
    not say it themselves (``trajectory.metadata["answer_tool"]``, set by art_mcp).
    """
    facts = step_facts(list(groups), answer_tool=answer_tool)
    if not facts.rollouts:
        return []
    return [d for d in (rule(facts) for rule in RULES) if d is not None]
