"""``SamplingReport``: what one dynamic-sampling call kept, discarded and spent."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from art_core.sampling.history import ScenarioDistribution

StopReason = Literal["enough_groups", "max_rollouts", "no_more_groups"]


class SamplingReport(BaseModel):
    """Counts of one sampling call: groups with a learning signal (unequal rewards), groups
    whose rewards were all equal (discarded by dynamic sampling, also after growing), groups
    dropped by ``after_each``, rollouts spent, and why it stopped.

    ``metrics()`` is what reaches ``history.jsonl``: the groups a call returns carry it in
    their ``metrics``, and ``model.train`` records group metrics as ``train/{name}``.

    Example:
        >>> report = SamplingReport(groups_wanted=2, groups_with_signal=2, groups_all_equal=5,
        ...                         rollouts=56, stop_reason="enough_groups")
        >>> report.summary()
        'kept 2/2 groups with signal, discarded 5 all-equal, 56 rollouts'
    """

    model_config = ConfigDict(extra="forbid")

    groups_wanted: int
    discards_all_equal: bool = True
    groups_with_signal: int = 0
    groups_all_equal: int = 0
    groups_dropped: int = 0
    groups_grown: int = 0
    rollouts: int = 0
    rollouts_all_equal: int = 0
    rollouts_added: int = 0
    exceptions: int = 0
    reward: float | None = None
    stop_reason: StopReason = "enough_groups"
    scenarios: ScenarioDistribution | None = None

    @property
    def groups_started(self) -> int:
        return self.groups_with_signal + self.groups_all_equal + self.groups_dropped

    def metrics(self) -> dict[str, float]:
        """Flat numbers for the history: ``sampling_*`` counts and ``scenarios_*`` shares."""
        metrics = {
            "sampling_groups_with_signal": float(self.groups_with_signal),
            "sampling_groups_all_equal": float(self.groups_all_equal),
            "sampling_groups_dropped": float(self.groups_dropped),
            "sampling_groups_grown": float(self.groups_grown),
            "sampling_rollouts": float(self.rollouts),
            "sampling_rollouts_all_equal": float(self.rollouts_all_equal),
            "sampling_rollouts_added": float(self.rollouts_added),
        }
        if self.reward is not None:
            # The policy's mean reward over every rollout of the call, discarded ones too:
            # train/reward (the kept groups only) is biased by the filter.
            metrics["sampling_reward"] = self.reward
        if self.scenarios is not None:
            metrics.update(self.scenarios.metrics())
        return metrics

    def summary(self) -> str:
        """One line for progress output."""
        if self.discards_all_equal:
            line = (
                f"kept {self.groups_with_signal}/{self.groups_wanted} groups with signal, "
                f"discarded {self.groups_all_equal} all-equal, {self.rollouts} rollouts"
            )
        else:
            line = (
                f"{self.groups_with_signal} groups with signal, {self.groups_all_equal} "
                f"all-equal (nothing to learn), {self.rollouts} rollouts"
            )
        if self.groups_grown:
            line += f" ({self.rollouts_added} added to {self.groups_grown} all-equal groups)"
        if self.groups_dropped:
            line += f", {self.groups_dropped} dropped by after_each"
        if self.exceptions:
            line += f", {self.exceptions} failed"
        if self.stop_reason != "enough_groups":
            line += f"; stopped: {self.stop_reason.replace('_', ' ')}"
        if self.scenarios is not None and self.scenarios.tried:
            line += f"; {self.scenarios.never_solved_share:.0%} of tried scenarios never solved"
        return line
