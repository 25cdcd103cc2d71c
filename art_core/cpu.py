"""How much CPU this process may use, and how its OpenMP threads wait (no torch import).

Two facts decide whether a competing process slows us in proportion or catastrophically:

- **Threads follow the cores we may use**: the CPU affinity mask and a cgroup quota (a
  container limited to 2 CPUs on a 64-core host sees 64 cores). More threads than that only
  wait for each other.
- **OpenMP threads wait passively.** libgomp's default is to spin for a while at every
  barrier; when another process takes one of our cores, the remaining thread spins on a
  barrier that waits for a thread that is not running, for every parallel region of every
  op. Measured here (2 cores, 30 chained 576x576 matmuls per step, a loaded machine): 86 ms
  per step with the default, 7.2 ms with ``OMP_WAIT_POLICY=PASSIVE``, 6.8 ms with one
  thread. libgomp reads the policy once, when torch loads it, so it must be in the
  environment before torch is imported: ``import art_core`` sets it (unless the user chose
  one), and every process we start inherits it.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from pathlib import Path

logger = logging.getLogger(__name__)
WAIT_POLICY_ENV = "OMP_WAIT_POLICY"


def prefer_passive_openmp() -> bool:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` unless the user set a policy; True if it will apply
    (torch not imported yet, or imported after the same setting)."""
    if WAIT_POLICY_ENV in os.environ:
        return os.environ[WAIT_POLICY_ENV].upper() == "PASSIVE"
    if "torch" in sys.modules:
        logger.info(
            "torch was imported before art_core: its OpenMP threads spin while waiting, and a "
            "competing process can slow steps many times over; export %s=PASSIVE to avoid it",
            WAIT_POLICY_ENV,
        )
        return False
    os.environ[WAIT_POLICY_ENV] = "PASSIVE"
    return True


def _cgroup_cpu_limit() -> float | None:
    """CPUs allowed by a cgroup quota (v2 ``cpu.max`` or v1 ``cfs_quota_us``), or None."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            return int(quota) / int(period)
        return None
    except (OSError, ValueError):
        pass
    try:
        quota_us = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period_us = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        return quota_us / period_us if quota_us > 0 and period_us > 0 else None
    except (OSError, ValueError):
        return None


def cpu_budget() -> int:
    """The cores this process may use: its affinity mask, capped by a cgroup CPU quota.

    Example:
        >>> cpu_budget() >= 1
        True
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    limit = _cgroup_cpu_limit()
    if limit is not None:
        cores = min(cores, max(1, math.ceil(limit)))
    return max(1, cores)
