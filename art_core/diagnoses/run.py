"""``RunDiagnoses``: the diagnoses of every step of a run, for its final table, and the
run-level rule: rewards flat over the steps."""

from __future__ import annotations

from dataclasses import dataclass, field

from art_core.diagnoses.diagnosis import Diagnosis

# Rewards are flat when, over at least FLAT_MIN_STEPS steps, the step means stay within
# FLAT_RANGE of each other, or no step trained at all.
FLAT_MIN_STEPS = 3
FLAT_RANGE = 0.02


@dataclass
class RunDiagnoses:
    """What fired at each step, and the mean reward and whether it trained.

    Example:
        >>> run = RunDiagnoses()
        >>> for step in range(3):
        ...     run.add(step, reward=0.25, trained=False, diagnoses=[])
        >>> [d.code for d in run.run_level()]
        ['flat_rewards']
    """

    steps: list[tuple[int, float, bool, list[Diagnosis]]] = field(default_factory=list)

    def add(self, step: int, *, reward: float, trained: bool, diagnoses: list[Diagnosis]) -> None:
        self.steps.append((step, reward, trained, list(diagnoses)))

    def run_level(self) -> list[Diagnosis]:
        """``flat_rewards`` when the step rewards stayed flat (see the thresholds)."""
        if len(self.steps) < FLAT_MIN_STEPS:
            return []
        rewards = [reward for _, reward, _, _ in self.steps]
        spread = max(rewards) - min(rewards)
        trained = sum(1 for _, _, t, _ in self.steps if t)
        if trained and spread > FLAT_RANGE:
            return []
        causes = [code for code, _ in self.counts()]
        because = f"; fired most: {', '.join(causes[:2])}" if causes else ""
        what = (
            "no step trained"
            if not trained
            else f"the step rewards stayed within {spread:.3f} of each other"
        )
        return [
            Diagnosis(
                code="flat_rewards",
                finding=f"over {len(self.steps)} steps {what} (mean {rewards[-1]:.3f} at the last){because}",
                setting=(
                    "change what the step diagnoses name first; without one, more rollouts per "
                    "group or a warm start (art_mcp: --warm-start)"
                ),
                share=spread,
                threshold=FLAT_RANGE,
                unit="reward spread",
            )
        ]

    def counts(self) -> list[tuple[str, int]]:
        """How many steps each diagnosis fired at, most first."""
        counts: dict[str, int] = {}
        for _, _, _, diagnoses in self.steps:
            for diagnosis in diagnoses:
                counts[diagnosis.code] = counts.get(diagnosis.code, 0) + 1
        return sorted(counts.items(), key=lambda item: (-item[1], item[0]))

    def table(self) -> str:
        """Each diagnosis with the steps it fired at and its setting; '' when none fired.

        Example:
            >>> run = RunDiagnoses()
            >>> run.add(0, reward=0.5, trained=True, diagnoses=[])
            >>> run.table()
            ''
        """
        latest: dict[str, Diagnosis] = {}
        for _, _, _, diagnoses in self.steps:
            for diagnosis in diagnoses:
                latest[diagnosis.code] = diagnosis
        rows = [
            f"  {code} (at {n} of {len(self.steps)} steps): {latest[code].finding}\n"
            f"    -> {latest[code].setting}"
            for code, n in self.counts()
        ]
        rows += [f"  {d.code}: {d.finding}\n    -> {d.setting}" for d in self.run_level()]
        return "why it learned little (diagnoses)\n" + "\n".join(rows) if rows else ""
