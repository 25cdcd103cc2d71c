"""How much CPU this process may use, and how much of it other processes leave free (no torch
import).

Two facts decide whether a competing process slows us in proportion or catastrophically:

- **Threads follow the cores we may use**: the CPU affinity mask and a cgroup quota (a
  container limited to 2 CPUs on a 64-core host sees 64 cores). More threads than that only
  wait for each other.
- **Threads follow the cores other processes leave free.** OpenMP threads meet at a barrier
  after every parallel region; when another process takes one of our cores, every region
  waits for a thread the OS is not running. Measured here (2 cores, one GRPO step of
  smollm2-135m, ``benchmarks/contention.py``), beside one CPU-bound process: libgomp's
  default (spinning waits) 3.6-16x slower; ``OMP_WAIT_POLICY=PASSIVE`` in proportion but
  ~2x slower alone (waking a sleeping thread costs, most in a VM whose idle vCPU halts); the
  default wait with one thread fewer while the other process runs (``CoreUse``, read from
  ``/proc/stat`` every 0.5 s; ``art_core.device.follow_free_cores``): as fast as the default
  alone, 1.6x slower beside the competitor. ``import art_core`` leaves the wait policy to
  the user; ``ART_CORE_FOLLOW_FREE_CORES=0`` keeps the thread count fixed.
"""

from __future__ import annotations

import logging
import math
import os
import platform
import threading
import time
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)


# The extensions that change which dtype and kernels a CPU run uses.
CPU_EXTENSIONS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name and the matrix extensions it has, e.g.
    ``AMD EPYC 7B13 (avx2)``: what a benchmark's first line and the test calibration's line
    name (figures depend on the extensions: they decide whether bf16 pays).

    Example:
        >>> cpu_model(Path("/no/such/file")).endswith("(no AVX2)")
        True
    """
    name, flags = platform.processor() or platform.machine() or "unknown CPU", set()
    try:
        lines = cpuinfo.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            name = " ".join(value.split())
        elif key.strip() == "flags":
            flags = set(value.split())
            break
    found = [f for f in CPU_EXTENSIONS if f in flags]
    return f"{name} ({', '.join(found) if found else 'no AVX2'})"


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


@dataclass(frozen=True)
class CoreSplit:
    """How sampling and training share this process's ``cores`` when they run side by side:
    the CPU threads each side gets.

    Example:
        >>> CoreSplit(cores=8, sampler_threads=4, trainer_threads=4).trainer_threads
        4
    """

    cores: int
    sampler_threads: int
    trainer_threads: int


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


ADAPT_ENV = "ART_CORE_FOLLOW_FREE_CORES"


class CoreUse:
    """How many of the cores this process may use other processes keep busy.

    Read from ``/proc/stat`` (the busy time of the CPUs in this process's affinity mask)
    minus this process's own CPU time, over the time since the previous reading; readings
    closer than ``interval_s`` return the previous answer, so asking every decode step
    costs a clock read. ``None`` where it cannot be known (not Linux, or a cgroup quota
    decides the budget: ``/proc/stat`` then describes the host, not this container).

    Example:
        >>> use = CoreUse()
        >>> use.others_busy() is None or use.others_busy() >= 0
        True
    """

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._last: tuple[float, float, float] | None = None  # (wall, cpus busy, own cpu)
        self._busy: float | None = None
        self._budget: tuple[float, int] | None = None  # (when read, cpu_budget())
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        try:
            self._cpus = {f"cpu{n}" for n in os.sched_getaffinity(0)}
        except (AttributeError, OSError):
            self._cpus = set()
        self._usable = bool(self._cpus) and _cgroup_cpu_limit() is None

    def _read(self) -> tuple[float, float, float] | None:
        try:
            lines = Path("/proc/stat").read_text().splitlines()
        except OSError:
            return None
        busy = 0.0
        for line in lines:
            name, _, rest = line.partition(" ")
            if name not in self._cpus:
                continue
            # user nice system idle iowait irq softirq steal (guest time is inside user)
            fields = [int(x) for x in rest.split()[:8]]
            busy += sum(fields) - fields[3] - fields[4]
        own = os.times()
        return time.monotonic(), busy / self._tick, own.user + own.system

    def budget(self) -> int:
        """``cpu_budget()``, read again at most every ``interval_s``: it reads the affinity
        mask and the cgroup's files, too slow for every decode step."""
        now = time.monotonic()
        with self._lock:
            if self._budget is None or now - self._budget[0] >= self.interval_s:
                self._budget = (now, cpu_budget())
            return self._budget[1]

    def others_busy(self) -> float | None:
        """Cores other processes kept busy since the previous reading (0.0 = all ours)."""
        if not self._usable:
            return None
        now = time.monotonic()
        with self._lock:
            if self._last is not None and now - self._last[0] < self.interval_s:
                return self._busy
            reading = self._read()
            if reading is None:
                self._usable = False
                return None
            if self._last is not None:
                wall = reading[0] - self._last[0]
                others = (reading[1] - self._last[1]) - (reading[2] - self._last[2])
                self._busy = max(0.0, others / wall)
            self._last = reading
            return self._busy


CORE_USE = CoreUse()  # one per process: readings are process-wide facts, shared by threads


def free_cores(budget: int) -> int:
    """The cores of ``budget`` that other processes leave free right now (at least 1); the
    whole budget when unknown or when following free cores is turned off
    (``ART_CORE_FOLLOW_FREE_CORES=0``).

    Example:
        >>> 1 <= free_cores(2) <= 2
        True
    """
    if os.environ.get(ADAPT_ENV, "1") == "0":
        return budget
    busy = CORE_USE.others_busy()
    if busy is None:
        return budget
    # A core counts as taken when another process used more than half of it.
    return max(1, min(budget, budget - math.floor(busy + 0.5)))
