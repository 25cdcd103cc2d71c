"""What ``gather_trajectory_groups`` and the sampling loop under it share: the type of an
``after_each`` hook and the error raised past ``max_exceptions``.

Here, below both, so that ``gather.py`` imports ``sampling/`` and never the other way round.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from art_core.trajectories import TrajectoryGroup

AfterEach = Callable[[TrajectoryGroup], Awaitable[TrajectoryGroup | None] | TrajectoryGroup | None]


class TooManyExceptions(RuntimeError):
    """More rollouts raised than ``max_exceptions`` allows."""
