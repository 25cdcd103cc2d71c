"""The calls the core makes into tracing: one line each at the place the event happens.

Every hook starts with ``state.active()`` (an attribute read once the environment has been
checked) and returns at once when tracing is off, so the core pays nothing for them.

When a rollout's trajectory is final:
- outside ``gather``: when ``Run.trajectory()`` builds it;
- inside ``gather``: when its group is done and ``after_each`` (e.g. RULER) has run, so the
  trace carries the final reward and judge score;
- at ``train``: any trajectory not exported yet; rewards that changed since export (RULER
  scored outside ``gather``) are sent as score updates.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol

from art_core.tracing import state

if TYPE_CHECKING:
    from art_core.trajectories import LLMCall, Trajectory, TrajectoryGroup


class CapturedRun(Protocol):
    """What tracing reads of a rollout opened by ``capture`` (``art_core.capture.Run``)."""

    @property
    def rollout_id(self) -> str: ...
    @property
    def model(self) -> Any: ...
    @property
    def start_time(self) -> float: ...
    @property
    def end_time(self) -> float | None: ...
    @property
    def final_calls(self) -> list[LLMCall] | None: ...


# True inside the tasks gather runs a group in: their trajectories wait for after_each.
_in_gather: ContextVar[bool] = ContextVar("art_tracing_in_gather", default=False)


def run_started(run: CapturedRun) -> None:
    """``capture`` opened a rollout (the caller's current span/call becomes its parent)."""
    pipeline = state.active()
    if pipeline is not None:
        pipeline.run_started(run.rollout_id, run.model)


def run_failed(run: CapturedRun, exc: BaseException) -> None:
    """The code inside ``capture`` raised: trace the calls it made and the error."""
    pipeline = state.active()
    if pipeline is not None:
        calls = run.final_calls or []
        pipeline.rollout_failed(
            run.rollout_id, calls, exc, run.start_time, run.end_time or time.time()
        )


def trajectory_built(run: CapturedRun, trajectory: Trajectory) -> None:
    """``Run.trajectory()`` built a trajectory (final unless ``gather`` scores it later)."""
    pipeline = state.active()
    if pipeline is not None and not _in_gather.get():
        pipeline.rollout_finished(trajectory, run.model)


def gathering() -> None:
    """``gather`` is about to run a group in this task."""
    if state.active() is not None:
        _in_gather.set(True)


def group_finished(finished: TrajectoryGroup, result: TrajectoryGroup | None) -> None:
    """``gather`` finished a group and ran ``after_each`` on it (``result`` None: dropped)."""
    pipeline = state.active()
    if pipeline is None:
        return
    final = list(result.trajectories) if result is not None else []
    ids = {t.id for t in final}
    for trajectory in [*final, *(t for t in finished.trajectories if t.id not in ids)]:
        pipeline.rollout_finished(trajectory)


def train_step_finished(
    model: Any, groups: list[TrajectoryGroup], config: Any, result: Any, started: float
) -> None:
    """A ``train`` call finished: trace it, linked to its rollouts."""
    pipeline = state.active()
    if pipeline is None:
        return
    ids = []
    for group in groups:
        for trajectory in group.trajectories:
            pipeline.rollout_finished(trajectory, model)
            ids.append(trajectory.id)
    dump = getattr(config, "model_dump", None)
    pipeline.train_step(
        model,
        ids,
        result.step,
        result.metrics,
        started,
        time.time(),
        result.checkpoint_path,
        dump(mode="json") if callable(dump) else None,
    )
