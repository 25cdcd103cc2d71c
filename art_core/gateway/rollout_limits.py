"""A bound on the calls of one rollout: past it the gateway refuses, and says so.

An agent with no turn bound of its own (Codex CLI) calls the model until it decides it is
done, which a small model rarely does. ``PUT /rollouts/{rollout_id}/limits`` with
``{"max_calls": N}`` (``art.capture(model, max_calls=N)`` does it) makes the gateway answer
the rollout's first N calls and refuse every later one with a 403 (``type``
``"rollout_limit_error"``), before anything is sampled or recorded: a call past the bound
costs no compute, and the run's trajectory holds exactly N calls. ``GET`` on the same path
answers the bound and how many calls were refused, so whoever runs the agent can stop it
the moment it asks for more (``art_cli_agents``' ``Limits.max_calls``), rather than guess
how long it needs to act on its last answer.

The gateway holds the bounds in a ``RolloutLimitsStore``: bounded in count (the least
recently used go first) and dropped when the rollout's calls are released, as the rollout's
sampling settings are (``rollout_sampling``).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from art_core.gateway.errors import APIError

logger = logging.getLogger(__name__)

# Rollouts whose bounds a gateway keeps (a few hundred bytes each): as many as the sampling
# settings it keeps.
DEFAULT_MAX_ROLLOUTS = 65536
# The error type of a call refused for its rollout's bound (in every wire API's error body).
LIMIT_ERROR_TYPE = "rollout_limit_error"


class RolloutLimits(BaseModel):
    """Bounds on one rollout's calls; None leaves it unbounded.

    ``max_calls``: how many calls of the rollout the gateway answers (1 or more). Strict: a
    boolean or a string is not a number, and an unknown field is refused.

    Example:
        >>> RolloutLimits(max_calls=2)
        RolloutLimits(max_calls=2)
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    max_calls: int | None = Field(default=None, ge=1, le=2**31 - 1)


@dataclass
class _Bound:
    max_calls: int
    admitted: int = 0
    refused: int = 0


class RolloutLimitsStore:
    """The rollouts' bounds a gateway enforces and what each admitted and refused, at most
    ``capacity`` rollouts: past it the least recently used are forgotten (with a warning:
    their calls are no longer bounded). Thread-safe.

    Example:
        >>> store = RolloutLimitsStore()
        >>> store.set("r1", RolloutLimits(max_calls=1))
        >>> store.admit("r1")
        >>> try:
        ...     store.admit("r1")
        ... except APIError as refused:
        ...     print(refused.status, refused.type)
        403 rollout_limit_error
        >>> store.state("r1")
        {'max_calls': 1, 'calls_admitted': 1, 'calls_refused': 1}
    """

    def __init__(self, capacity: int = DEFAULT_MAX_ROLLOUTS) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._bounds: OrderedDict[str, _Bound] = OrderedDict()
        self._lock = threading.Lock()

    def set(self, rollout_id: str, limits: RolloutLimits) -> None:
        """Set (or replace) a rollout's bound, keeping what it already admitted; a bound of
        None removes it."""
        with self._lock:
            if limits.max_calls is None:
                self._bounds.pop(rollout_id, None)
                return
            bound = self._bounds.get(rollout_id)
            if bound is None:
                self._bounds[rollout_id] = _Bound(limits.max_calls)
            else:
                bound.max_calls = limits.max_calls
            self._bounds.move_to_end(rollout_id)
            while len(self._bounds) > self.capacity:
                gone, _ = self._bounds.popitem(last=False)
                logger.warning(
                    "more than %d rollouts have call limits: that of %s is forgotten (its "
                    "calls are no longer bounded)",
                    self.capacity,
                    gone,
                )

    def admit(self, rollout_id: str | None, calls: int = 1) -> None:
        """Count ``calls`` new calls of the rollout, or refuse them all (``APIError`` 403,
        counted as refused) when they would pass its bound. Calls outside a rollout, or of
        a rollout without a bound, are always admitted."""
        if rollout_id is None:
            return
        with self._lock:
            bound = self._bounds.get(rollout_id)
            if bound is None:
                return
            self._bounds.move_to_end(rollout_id)
            if bound.admitted + calls > bound.max_calls:
                bound.refused += calls
                admitted = bound.admitted
            else:
                bound.admitted += calls
                return
        raise APIError(
            403,
            f"rollout {rollout_id!r} has had its {admitted} of {bound.max_calls} allowed "
            "calls (max_calls): this run is over",
            type=LIMIT_ERROR_TYPE,
            code="max_calls_reached",
        )

    def state(self, rollout_id: str) -> dict[str, int | None]:
        """The rollout's bound and its counts (``max_calls`` None: unbounded, nothing
        counted)."""
        with self._lock:
            bound = self._bounds.get(rollout_id)
            if bound is None:
                return {"max_calls": None, "calls_admitted": 0, "calls_refused": 0}
            return {
                "max_calls": bound.max_calls,
                "calls_admitted": bound.admitted,
                "calls_refused": bound.refused,
            }

    def discard(self, rollout_id: str) -> None:
        """Forget a rollout's bound (its calls were released)."""
        with self._lock:
            self._bounds.pop(rollout_id, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._bounds)
