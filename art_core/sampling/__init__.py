"""Rollout sampling for rewards that are rarely earned: no step spent on groups without signal.

(Which scenarios to run and how many rollouts each gets; token sampling is the engines'.)

- ``ScenarioSampler``: dynamic sampling (keep starting groups until enough have unequal
  rewards, within a rollout budget), adaptive group size (grow an all-equal group before
  giving up on it) and a curriculum (prefer scenarios solved about half the time).
- ``ScenarioHistory``: per-scenario recent success; solved always / never / learning.
- ``SamplingReport``: what a call kept, discarded and spent; its ``metrics()`` reach
  ``history.jsonl`` through the groups' metrics.
- ``gather_groups_with_signal``: the loop under both ``ScenarioSampler`` and
  ``gather_trajectory_groups(..., groups_with_signal=N, max_rollouts=M)``.

Example:
    >>> import art_core as art
    >>> sampler = art.ScenarioSampler(scenarios, lambda s: rollout(model, s),
    ...                               max_group_size=32, curriculum=True)  # needs a registered model: `model`, `rollout`, `scenarios`  # doctest: +SKIP
    >>> groups = await sampler.gather(4, max_rollouts=256)  # needs a registered model  # doctest: +SKIP
"""

from art_core.sampling.history import ScenarioDistribution, ScenarioHistory, ScenarioOutcomes
from art_core.sampling.loop import GroupJob, gather_groups_with_signal
from art_core.sampling.report import SamplingReport
from art_core.sampling.sampler import ScenarioSampler

__all__ = [
    "GroupJob",
    "SamplingReport",
    "ScenarioDistribution",
    "ScenarioHistory",
    "ScenarioOutcomes",
    "ScenarioSampler",
    "gather_groups_with_signal",
]
