"""``ScenarioSampler``: groups of rollouts from scenarios, for rewards that are rarely earned.

It owns what a training loop needs when most groups come back all-equal: which scenario to
run next (a seeded shuffle, or a curriculum that prefers scenarios solved about half the
time), how many rollouts a scenario gets (more when its group was all-equal), which groups
to keep (those with a signal, until enough), and the per-scenario history behind it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Generic, Literal, TypeVar

from art_core.epochs import epoch_order
from art_core.sampling.groups import AfterEach
from art_core.sampling.history import ScenarioHistory
from art_core.sampling.loop import OVER_BUDGET, GroupJob, gather_groups_with_signal
from art_core.sampling.report import SamplingReport
from art_core.trajectories import Trajectory, TrajectoryGroup

Scenario = TypeVar("Scenario")


class ScenarioSampler(Generic[Scenario]):
    """Sample trajectory groups from ``scenarios`` with ``rollout(scenario)``.

    - ``dynamic_sampling`` (default on): ``gather(n, max_rollouts=...)`` keeps starting groups
      until ``n`` have unequal rewards; all-equal groups are discarded and counted.
    - ``max_group_size`` (adaptive group size): a group that came back all-equal gets
      ``group_size`` more rollouts at a time, up to this many, before it is given up on.
    - ``curriculum``: scenarios are drawn (seeded, without replacement within a call) with
      weight ``1 - p**G - (1 - p)**G``, the chance a group of ``G`` has signal at recent
      success rate ``p`` (see ``ScenarioHistory``); off: a seeded shuffle, epoch by epoch.

    Every call records each scenario's outcomes (reward >= ``success_threshold`` is solved)
    in ``history`` and reports in ``last_report``; the groups it returns carry the report in
    their ``metrics``, so ``model.train`` writes it to ``history.jsonl``. A scenario runs at
    most once per call. ``key(scenario)`` names a scenario in the history (default: its
    index); pass ``history`` back in to resume, and ``position`` (the number of scenarios
    started so far, e.g. ``step * groups_per_step``) to resume the shuffle where it was.

    Example:
        >>> sampler = ScenarioSampler(scenarios, lambda s: rollout(model, s), group_size=8,
        ...                           max_group_size=32, curriculum=True)  # needs a registered model: `model`, `rollout`, `scenarios`  # doctest: +SKIP
        >>> for step in range(10):  # needs a registered model  # doctest: +SKIP
        ...     groups = await sampler.gather(4, max_rollouts=256)
        ...     await model.train(groups)
    """

    def __init__(
        self,
        scenarios: Sequence[Scenario],
        rollout: Callable[[Scenario], Awaitable[Trajectory]],
        *,
        group_size: int = 8,
        max_group_size: int | None = None,
        dynamic_sampling: bool = True,
        curriculum: bool = False,
        success_threshold: float = 1.0,
        window: int = 32,
        key: Callable[[Scenario], str] | None = None,
        history: ScenarioHistory | None = None,
        seed: int = 0,
        position: int = 0,
    ) -> None:
        if isinstance(scenarios, str | bytes) or not isinstance(scenarios, Sequence):
            raise TypeError(
                f"scenarios must be a sequence (e.g. a list), got {type(scenarios).__name__}"
            )
        if not scenarios:
            raise ValueError("no scenarios to sample from")
        if not callable(rollout):
            raise TypeError("rollout must be a function: rollout(scenario) -> awaitable Trajectory")
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2:
            raise ValueError(f"group_size must be an int >= 2 (GRPO compares), got {group_size!r}")
        if max_group_size is not None and (
            isinstance(max_group_size, bool)
            or not isinstance(max_group_size, int)
            or max_group_size < group_size
        ):
            raise ValueError(
                f"max_group_size must be an int >= group_size ({group_size}), got {max_group_size!r}"
            )
        self.scenarios = list(scenarios)
        self.rollout = rollout
        self.group_size = group_size
        self.max_group_size = max_group_size
        self.dynamic_sampling = dynamic_sampling
        self.curriculum = curriculum
        self.history = history or ScenarioHistory(
            window=window, success_threshold=success_threshold
        )
        self.keys = [self._key(key, index, s) for index, s in enumerate(self.scenarios)]
        if len(set(self.keys)) != len(self.keys):
            duplicate = next(k for k in self.keys if self.keys.count(k) > 1)
            raise ValueError(f"two scenarios have the key {duplicate!r}: keys must be unique")
        self.seed = seed
        self.last_report: SamplingReport | None = None
        if isinstance(position, bool) or not isinstance(position, int) or position < 0:
            raise ValueError(f"position must be an int >= 0, got {position!r}")
        # Where this sampler is in the endless sequence of seeded shuffles (no curriculum).
        self.position = position
        self._calls = 0

    @staticmethod
    def _key(key: Callable[[Scenario], str] | None, index: int, scenario: Scenario) -> str:
        if key is None:
            return str(index)
        value = key(scenario)
        if not isinstance(value, str) or not value:
            raise ValueError(f"key(scenario) must return a non-empty str, got {value!r}")
        return value

    async def gather(
        self,
        num_groups: int,
        *,
        max_rollouts: int,
        after_each: AfterEach | None = None,
        max_exceptions: int | float = 0,
        max_concurrent_groups: int | None = None,
        pbar_desc: str | None = "gather",
    ) -> list[TrajectoryGroup]:
        """The groups of one training step: ``num_groups`` with a signal when dynamic sampling
        finds them within ``max_rollouts`` rollouts (fewer otherwise; when none had a signal,
        up to ``num_groups`` all-equal ones so the step is still recorded).

        ``after_each`` (e.g. RULER) scores each group before its signal is checked;
        ``max_exceptions`` bounds failed rollouts (a count, or a fraction when < 1).
        """
        if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 1:
            raise ValueError(f"num_groups must be an int >= 1, got {num_groups!r}")
        if isinstance(max_rollouts, bool) or not isinstance(max_rollouts, int):
            raise ValueError(f"max_rollouts must be an int, got {max_rollouts!r}")
        if max_rollouts < self.group_size:
            raise ValueError(
                f"max_rollouts ({max_rollouts}) must be >= group_size ({self.group_size}): "
                "not even one group would fit"
            )
        order = self._order()
        used: set[int] = set()

        def next_job(rollouts_left: int) -> GroupJob | Literal["over_budget"] | None:
            if rollouts_left < self.group_size:
                return OVER_BUDGET
            for index in order:
                if index in used:
                    continue
                used.add(index)
                return self._job(index)
            return None

        def on_group(job: GroupJob, group: TrajectoryGroup) -> None:
            assert job.key is not None
            self.history.record(job.key, (t.reward for t in group.trajectories))

        groups, report = await gather_groups_with_signal(
            next_job,
            groups_with_signal=num_groups,
            max_rollouts=max_rollouts,
            max_group_size=self.max_group_size,
            growth=self.group_size,
            keep_all_equal=not self.dynamic_sampling,
            after_each=after_each,
            max_exceptions=max_exceptions,
            max_concurrent_groups=max_concurrent_groups,
            pbar_desc=pbar_desc,
            on_group=on_group,
        )
        self._calls += 1
        report.scenarios = self.history.distribution(self.keys)
        for group in groups:
            group.metrics.update(report.metrics())
        self.last_report = report
        if pbar_desc is not None:
            from tqdm.auto import tqdm

            tqdm.write(f"{pbar_desc}: {report.summary()}")
        return groups

    def _job(self, index: int) -> GroupJob:
        scenario = self.scenarios[index]

        def more(count: int) -> list[Awaitable[Trajectory] | BaseException]:
            runs: list[Awaitable[Trajectory] | BaseException] = []
            for _ in range(count):
                try:
                    runs.append(self.rollout(scenario))
                except Exception as exc:  # a rollout that fails to start failed as a rollout
                    runs.append(exc)
            return runs

        group = TrajectoryGroup(more(self.group_size), metadata={"scenario_key": self.keys[index]})
        return GroupJob(group, more=more if self.max_group_size else None, key=self.keys[index])

    def _order(self) -> Iterator[int]:
        """Scenario indices in the order this call tries them."""
        count = len(self.scenarios)
        if self.curriculum:
            rng = random.Random(self.seed * 1_000_003 + self._calls)
            weights = self.history.weights(self.keys, self.group_size)
            # Weighted sampling without replacement (Efraimidis-Spirakis), in log space.
            keys = [math.log(1.0 - rng.random()) / w for w in weights]
            return iter(sorted(range(count), key=lambda i: keys[i], reverse=True))

        def shuffled() -> Iterator[int]:
            permutation: list[int] = []
            shuffled_epoch = -1
            while True:
                epoch, offset = divmod(self.position, count)
                if epoch != shuffled_epoch:
                    permutation = epoch_order(count, self.seed, epoch)
                    shuffled_epoch = epoch
                self.position += 1
                yield permutation[offset]

        return _at_most(shuffled(), 2 * count)


def _at_most(items: Iterator[int], limit: int) -> Iterator[int]:
    """The first ``limit`` items (a call spans at most two epochs of the shuffle)."""
    for _, item in zip(range(limit), items, strict=False):
        yield item
