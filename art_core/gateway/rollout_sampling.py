"""Sampling settings scoped to one rollout: a seed, a temperature, a top_p for all its calls.

Command-line agents (Codex CLI, Claude Code, opencode) send sampling settings of their own,
or none: no seed, and a temperature nobody training them chose. A rollout's settings, set
through ``PUT /rollouts/{rollout_id}/sampling`` (``art.capture(model, sampling=...)`` does
it), apply to every call of that rollout, in every wire API:

- ``temperature`` and ``top_p`` replace what the request asked (the request's own values
  stay in its recorded ``request_params``);
- ``seed``: a call without a seed of its own is sampled with one derived from the rollout's
  seed and the call's index in the rollout (``call_seed``): each call of a run draws
  differently, and the same rollout seed replays the same run; a call with its own seed
  keeps it.

What was applied is recorded with each call as ``request_params["rollout_sampling"]``.

The gateway holds the settings in a ``RolloutSamplingStore``: bounded in count (the least
recently used go first) and dropped when the rollout's calls are released. Rollout ids are
not checked against calls: settings may be set before the rollout's first call.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from art_core.gateway.schemas import MAX_SEED, MIN_SEED

if TYPE_CHECKING:
    from art_core.engines.base import SamplingParams

logger = logging.getLogger(__name__)

# Rollouts whose settings a gateway keeps unless told otherwise (a few hundred bytes each).
DEFAULT_MAX_ROLLOUTS = 65536


class RolloutSampling(BaseModel):
    """Sampling settings for every call of one rollout; None leaves the request's own.

    ``seed`` is within a chat request's range (signed 64-bit), ``temperature`` 0-2 (0:
    greedy), ``top_p`` in (0, 1]. Strict: a boolean or a string is not a number, and an
    unknown field is refused (a misspelt ``temprature`` must not pass silently).

    Example:
        >>> RolloutSampling(seed=7, temperature=1.2)
        RolloutSampling(seed=7, temperature=1.2, top_p=None)
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)

    seed: int | None = Field(default=None, ge=MIN_SEED, le=MAX_SEED)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)

    @property
    def is_empty(self) -> bool:
        """Whether it changes nothing (every setting None)."""
        return self.seed is None and self.temperature is None and self.top_p is None

    def call_seed(self, index: int) -> int | None:
        """The seed of call ``index`` of the rollout when the call has none of its own (None
        without a rollout seed): a hash of the rollout seed and the index, so every call of a
        run draws from its own stream and the same rollout seed gives the same seeds again.

        Hashed rather than ``seed * K + index``: engines seed choice ``i`` of a call with
        ``seed + i``, so consecutive seeds would make choice 1 of one call draw what choice
        0 of the next one draws. 62 bits: ``seed + i`` stays a signed 64-bit integer.

        Example:
            >>> sampling = RolloutSampling(seed=7)
            >>> sampling.call_seed(0) == RolloutSampling(seed=7).call_seed(0)
            True
            >>> sampling.call_seed(0) != sampling.call_seed(1)
            True
            >>> 0 <= sampling.call_seed(5) < 2**62
            True
        """
        if self.seed is None:
            return None
        digest = hashlib.blake2b(f"{self.seed}:{index}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") >> 2

    def for_run(self, *keys: int) -> RolloutSampling:
        """These settings for one run among many given them: the seed (when there is one)
        mixed with ``keys`` (a group's index, a run's index...), so that the runs differ,
        and the same keys give the same seed again.

        Example:
            >>> base = RolloutSampling(seed=7, temperature=1.0)
            >>> [base.for_run(i).seed for i in range(3)]
            [7000021, 7000022, 7000023]
            >>> RolloutSampling(temperature=1.0).for_run(1).seed is None
            True
        """
        if self.seed is None:
            return self
        seed = self.seed
        for key in keys:
            seed = (seed * 1_000_003 + key) % RUN_SEED_RANGE
        return self.model_copy(update={"seed": seed})


# Seeds ``for_run`` gives: non-negative, 62 bits (a call's ``seed + i`` stays in 64).
RUN_SEED_RANGE = 2**62


def apply_rollout_sampling(
    sampling: RolloutSampling | None,
    params: SamplingParams,
    request_params: dict[str, Any],
    index: int,
) -> None:
    """Apply a rollout's settings to one call's ``params`` (in place), and record what was
    applied as ``request_params["rollout_sampling"]`` (the request's own values stay where
    they are): ``temperature`` / ``top_p`` as applied, ``seed`` only when derived (a call's
    own seed is kept), ``rollout_seed`` whenever the rollout has one.

    Example:
        >>> from art_core.engines.base import SamplingParams
        >>> params, recorded = SamplingParams(temperature=1.5), {"temperature": 1.5}
        >>> apply_rollout_sampling(RolloutSampling(temperature=0.0), params, recorded, 0)
        >>> params.temperature, recorded
        (0.0, {'temperature': 1.5, 'rollout_sampling': {'temperature': 0.0}})
    """
    if sampling is None or sampling.is_empty:
        return
    applied: dict[str, Any] = {}
    if sampling.temperature is not None:
        params.temperature = applied["temperature"] = sampling.temperature
    if sampling.top_p is not None:
        params.top_p = applied["top_p"] = sampling.top_p
    if sampling.seed is not None:
        applied["rollout_seed"] = sampling.seed
        if params.seed is None:
            params.seed = applied["seed"] = sampling.call_seed(index)
    request_params["rollout_sampling"] = applied


class RolloutSamplingStore:
    """The rollouts' settings a gateway applies, at most ``capacity`` of them: past it the
    least recently used are forgotten (with a warning: their calls sample as they ask).
    Thread-safe: set and read on the gateway's loop, dropped from whichever thread releases
    a rollout.

    Example:
        >>> store = RolloutSamplingStore(capacity=1)
        >>> store.set("r1", RolloutSampling(seed=1)); store.set("r2", RolloutSampling(seed=2))
        >>> store.get("r1") is None, store.get("r2")
        (True, RolloutSampling(seed=2, temperature=None, top_p=None))
    """

    def __init__(self, capacity: int = DEFAULT_MAX_ROLLOUTS) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._settings: OrderedDict[str, RolloutSampling] = OrderedDict()
        self._lock = threading.Lock()

    def set(self, rollout_id: str, sampling: RolloutSampling) -> None:
        """Set (or replace) a rollout's settings; empty ones remove them."""
        with self._lock:
            if sampling.is_empty:
                self._settings.pop(rollout_id, None)
                return
            self._settings[rollout_id] = sampling
            self._settings.move_to_end(rollout_id)
            while len(self._settings) > self.capacity:
                gone, _ = self._settings.popitem(last=False)
                logger.warning(
                    "more than %d rollouts have sampling settings: those of %s are forgotten "
                    "(its calls sample as they ask)",
                    self.capacity,
                    gone,
                )

    def get(self, rollout_id: str | None) -> RolloutSampling | None:
        """A rollout's settings (None: none, or a call outside any rollout)."""
        if rollout_id is None:
            return None
        with self._lock:
            sampling = self._settings.get(rollout_id)
            if sampling is not None:
                self._settings.move_to_end(rollout_id)  # a rollout still calling stays
            return sampling

    def discard(self, rollout_id: str) -> None:
        """Forget a rollout's settings (its calls were released)."""
        with self._lock:
            self._settings.pop(rollout_id, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._settings)
