"""How much memory this process may use, and how much it used (no torch import).

The trainer sizes its micro-batches to a **memory budget**, the peak resident memory the
process may reach, so that a step's memory follows the machine and not the batch:

- ``ART_CORE_MEMORY_BUDGET`` (bytes, ``"6GiB"``, ``"6.5GB"``, ``"40%"`` of the memory below,
  or ``"off"``) sets it for the process; ``TrainConfig.memory_budget`` overrides it per step;
- by default it is ``DEFAULT_FRACTION`` of what the process may use, read **once**, when this
  module is first imported (process start, for anything that imports ``art_core``): the
  cgroup memory limit (v2 ``memory.max``, v1 ``memory.limit_in_bytes``) or
  ``MemAvailable``, whichever is lower, plus what the process already held then. Read later,
  parallel processes (pytest workers, data-parallel ranks) would each see the memory the
  others have already taken as free and assume it too; read at start, none counts memory
  another held before it, and the fraction leaves room for the peers that start beside it.

``PeakMemory`` measures a span's peak resident memory (a train step's), resetting the
kernel's high-water mark (``/proc/self/clear_refs``) where it can and sampling
``/proc/self/statm`` where it cannot; ``release_freed_memory`` hands the heap a step freed
back to the system when the process is past half its budget.

Example:
    >>> parse_bytes("6GiB")
    6442450944
    >>> MemoryBudget.parse("512MiB", source="example").gib
    0.5
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import math
import os
import re
import resource
import sys
import threading
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

ENV = "ART_CORE_MEMORY_BUDGET"
# The share of what the process may use that the default budget takes: the rest is for
# what runs beside it (an engine in another process, the OS's page cache, a peer worker).
DEFAULT_FRACTION = 0.5
# A budget below this cannot hold any model this library trains: a typo, not a setting.
MIN_BUDGET = 64 * 2**20
# 4 EiB: more than any machine, and a bound that keeps sizes exact integers.
MAX_BYTES = 2**62
# cgroup v1 reports "no limit" as a number near 2**63.
_NO_LIMIT = 2**60

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "ki": 2**10,
    "kib": 2**10,
    "mi": 2**20,
    "mib": 2**20,
    "gi": 2**30,
    "gib": 2**30,
    "ti": 2**40,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def parse_bytes(value: int | float | str) -> int:
    """A size in bytes from an int or a string: ``"6GiB"``, ``"6 GB"``, ``"512Mi"``, ``"1e9"``.

    IEC suffixes (``Ki``, ``Mi``, ``Gi``, ``Ti``, with or without ``B``) are powers of 1024;
    SI ones (``K``, ``M``, ``G``, ``T``, ``KB``...) powers of 1000, as Kubernetes reads
    them. Case does not matter. Anything else is a ``ValueError`` naming what was given.

    Example:
        >>> parse_bytes("1.5GiB"), parse_bytes("2G"), parse_bytes(4096)
        (1610612736, 2000000000, 4096)
        >>> parse_bytes("six gigs")
        Traceback (most recent call last):
        ...
        ValueError: not a size in bytes: 'six gigs' (use e.g. 6442450944, "6GiB", "6GB" or "512MiB")
    """
    if isinstance(value, bool):
        raise ValueError(f"not a size in bytes: {_shown(value)}")
    if isinstance(value, int):
        if not 0 <= value <= MAX_BYTES:
            raise ValueError(f"not a size in bytes: {_shown(value)} (0 to {MAX_BYTES})")
        return value
    if isinstance(value, float):
        number, unit = value, ""
    else:
        text = str(value).strip()
        match = _SIZE.match(text)
        try:  # scientific notation, "1e9"
            number, unit = (float(text), "") if match is None else (float(match[1]), match[2])
        except ValueError:
            number, unit = math.nan, "?"
        unit = unit.lower()
    if unit not in _UNITS or not math.isfinite(number) or number < 0:
        raise ValueError(
            f'not a size in bytes: {_shown(value)} (use e.g. 6442450944, "6GiB", "6GB" or "512MiB")'
        )
    size = number * _UNITS[unit]
    if size > MAX_BYTES:
        raise ValueError(f"not a size in bytes: {_shown(value)} (0 to {MAX_BYTES})")
    return int(size)


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return value if 0 < value < _NO_LIMIT else None


def cgroup_memory_limit() -> int | None:
    """The memory limit of this process's cgroup (v2 ``memory.max`` or v1
    ``memory.limit_in_bytes``, of its own group or the namespace's root), or None.

    Example:
        >>> limit = cgroup_memory_limit()
        >>> limit is None or limit > 0
        True
    """
    root = Path("/sys/fs/cgroup")
    candidates: list[Path] = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, group = line.split(":", 2)
            group = group.lstrip("/")
            if controllers == "":  # v2
                candidates.append(root / group / "memory.max")
            elif "memory" in controllers.split(","):  # v1
                candidates.append(root / "memory" / group / "memory.limit_in_bytes")
    candidates += [root / "memory.max", root / "memory" / "memory.limit_in_bytes"]
    limits = [limit for limit in map(_read_int, candidates) if limit is not None]
    return min(limits) if limits else None


def _proc_kib(path: str, key: str) -> int | None:
    """The ``key: N kB`` line of a ``/proc`` file in bytes (None where there is none)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path(path).read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
    return None


def mem_available() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes (None where there is none)."""
    return _proc_kib("/proc/meminfo", "MemAvailable")


def resident_bytes() -> int:
    """This process's resident memory now (``/proc/self/statm``; elsewhere its peak so far).

    Example:
        >>> resident_bytes() > 0
        True
    """
    with contextlib.suppress(OSError, ValueError, IndexError):
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    return _lifetime_peak()


def _lifetime_peak() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def _gib(value: float) -> str:
    return f"{value / 2**30:.2f} GiB"


@dataclass(frozen=True)
class MemoryBudget:
    """A memory budget in bytes (``None``: off, micro-batches by ``max_tokens_per_batch``
    alone) and where it came from, for messages.

    Example:
        >>> MemoryBudget.parse("off", source="TrainConfig.memory_budget").bytes is None
        True
        >>> MemoryBudget.parse("50%", source="x", machine=8 * 2**30).bytes == 4 * 2**30
        True
    """

    bytes: int | None
    source: str

    @property
    def gib(self) -> float:
        return math.nan if self.bytes is None else self.bytes / 2**30

    def describe(self) -> str:
        if self.bytes is None:
            return f"off ({self.source})"
        return f"{_gib(self.bytes)} ({self.source})"

    @classmethod
    def parse(
        cls, value: int | float | str, *, source: str, machine: int | None = None
    ) -> MemoryBudget:
        """``value`` as a budget: bytes, a size string, ``"N%"`` of ``machine`` (default:
        what the process could use at start) or ``"off"``; a ``ValueError`` naming
        ``source`` for anything else."""
        if isinstance(value, str) and value.strip().lower() in ("off", "none", "unlimited"):
            return cls(None, source)
        try:
            if isinstance(value, str) and value.strip().endswith("%"):
                share = float(value.strip()[:-1])
                if not (math.isfinite(share) and 0 < share <= 100):
                    raise ValueError(value)
                base = machine if machine is not None else STARTUP.usable
                if base is None:
                    raise ValueError(f"{value!r}: this system reports no memory to take a share of")
                size = int(base * share / 100)
            else:
                size = parse_bytes(value)
        except ValueError as exc:
            raise ValueError(
                f"{source}: {value!r} is not a memory budget: give bytes (6442450944), a size "
                '("6GiB", "6GB", "512MiB"), a share of the memory this process may use '
                '("40%") or "off"' + (f" ({exc})" if "%" in str(value) else "")
            ) from None
        if size < MIN_BUDGET:
            raise ValueError(
                f"{source}: a memory budget of {value!r} ({size} bytes) is below the "
                f"{MIN_BUDGET // 2**20} MiB any training step needs"
            )
        return cls(size, f"{source}={value}")


@dataclass(frozen=True)
class _Startup:
    """What the process could use when this module was imported."""

    limit: int | None  # the cgroup limit
    available: int | None  # MemAvailable
    resident: int  # what the process itself held then

    @property
    def usable(self) -> int | None:
        known = [v for v in (self.limit, self.available) if v is not None]
        if not known:
            return None
        # MemAvailable does not count what this process holds; a cgroup limit does.
        usable = min(known)
        return usable if usable == self.limit else usable + self.resident

    def default_budget(self) -> MemoryBudget:
        usable = self.usable
        if usable is None:
            return MemoryBudget(None, "no cgroup limit or MemAvailable to derive one from")
        what = "the cgroup memory limit" if usable == self.limit else "MemAvailable"
        return MemoryBudget(
            max(MIN_BUDGET, int(usable * DEFAULT_FRACTION)),
            f"{DEFAULT_FRACTION:.0%} of {what} at process start, {_gib(usable)}",
        )


STARTUP = _Startup(cgroup_memory_limit(), mem_available(), resident_bytes())


def process_memory_budget() -> MemoryBudget:
    """This process's memory budget: ``$ART_CORE_MEMORY_BUDGET`` when set (a ``ValueError``
    when it is not a budget), else ``DEFAULT_FRACTION`` of what the process could use at
    start (see the module).

    Example:
        >>> process_memory_budget().bytes is None or process_memory_budget().bytes >= MIN_BUDGET
        True
    """
    value = os.environ.get(ENV)
    if value is not None and value.strip():
        return MemoryBudget.parse(value, source=ENV)
    return STARTUP.default_budget()


def resolve_memory_budget(value: int | str | None) -> MemoryBudget:
    """A step's budget: ``value`` (``TrainConfig.memory_budget``) when set, else the
    process's (``process_memory_budget``).

    Example:
        >>> resolve_memory_budget("6GiB").bytes
        6442450944
    """
    if value is None:
        return process_memory_budget()
    return MemoryBudget.parse(value, source="memory_budget")


_CLEAR_REFS = Path("/proc/self/clear_refs")


def _high_water_mark() -> int | None:
    return _proc_kib("/proc/self/status", "VmHWM")


class PeakMemory:
    """The peak resident memory of this process between ``start()`` and ``peak()``.

    On Linux the kernel's high-water mark (``VmHWM``) is reset at ``start`` (writing 5 to
    ``/proc/self/clear_refs``) and read at ``peak``: exact, and free. Where that cannot be
    written a thread samples ``/proc/self/statm`` every ``interval_s`` (a spike shorter than
    that can be missed); without ``/proc`` it is the process's lifetime peak (an upper bound).
    The mark is the process's: two spans measured at once (two models training in one
    process's threads) reset it for each other, and each then reports from the later start.

    Example:
        >>> meter = PeakMemory().start()
        >>> block = bytearray(32 * 2**20)
        >>> meter.stop() >= 32 * 2**20
        True
    """

    def __init__(self, interval_s: float = 0.01) -> None:
        self.interval_s = interval_s
        self.method = "none"
        self._peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> PeakMemory:
        self._peak = resident_bytes()
        try:
            _CLEAR_REFS.write_text("5")
            if _high_water_mark() is None:
                raise OSError("no VmHWM")
            self.method = "VmHWM"
        except OSError:
            if Path("/proc/self/statm").is_file():
                self.method = "sampled"
                self._stop.clear()
                self._thread = threading.Thread(
                    target=self._sample, name="art-core-peak-memory", daemon=True
                )
                self._thread.start()
            else:
                self.method = "lifetime"
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._peak = max(self._peak, resident_bytes())

    def peak(self) -> int:
        """The peak so far (bytes), the resident memory now included."""
        now = resident_bytes()
        if self.method == "VmHWM":
            return max(now, _high_water_mark() or now)
        if self.method == "lifetime":
            return max(now, _lifetime_peak())
        self._peak = max(self._peak, now)
        return self._peak

    def stop(self) -> int:
        """Stop sampling; return the peak."""
        peak = self.peak()
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        return peak


# What a step freed goes back to the system only while the process holds over this share of
# its memory budget: a full garbage collection walks every object the imports made (torch,
# transformers: ~0.2 s on two cores) and glibc's ``malloc_trim`` every free chunk, together
# a third of a smollm2-135m step; they pay only when the memory is wanted, by the engine,
# the next step or another process. Below it, Python's own collector frees cycles as usual.
TRIM_SHARE = 0.5


def release_freed_memory(budget: int | None = None) -> bool:
    """When the process holds over ``TRIM_SHARE`` of ``budget`` bytes (None:
    ``process_memory_budget()``; no budget at all: always), collect garbage and give the
    heap's freed pages back to the system (glibc ``malloc_trim``): what a train step freed
    stays resident otherwise. Whether it did.

    Example:
        >>> release_freed_memory(budget=2**50)  # far from any budget: nothing to do
        False
    """
    limit = budget if budget is not None else process_memory_budget().bytes
    if limit is not None and resident_bytes() < TRIM_SHARE * limit:
        return False
    gc.collect()
    return_freed_pages()
    return True


def return_freed_pages() -> None:
    """Give the heap's free pages back to the system (glibc ``malloc_trim``; elsewhere
    nothing): memory Python and torch freed stays resident otherwise, and counts against
    every budget read from the process's resident size.

    Example:
        >>> return_freed_pages()
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)


# Python's full garbage collections walk every container object alive: ~400k made by the
# imports (torch, transformers) and the loaded models, ~0.2 s on two cores with the
# interpreter lock held. While serving, one came every few seconds (32 concurrent requests
# of 64 tokens on tiny-random: 4 in 13 s, 182-235 ms each), stalling the engine and the
# gateway together. What is alive once a model is loaded is frozen (``gc.freeze``: left
# out of later collections), as vLLM and SGLang do after their start; ``0`` turns it off.
FREEZE_ENV = "ART_CORE_GC_FREEZE"


def freeze_heap() -> bool:
    """Collect garbage, then leave every object alive now (the imports, the loaded weights
    and modules) out of later full collections; whether it did (``$ART_CORE_GC_FREEZE=0``:
    never). Objects frozen are still freed when their last reference goes; only cycles among
    them wait for ``collect_frozen``.

    Example:
        >>> freeze_heap() in (True, False)
        True
    """
    if os.environ.get(FREEZE_ENV, "1").strip() == "0":
        return False
    gc.collect()
    gc.freeze()
    return True


def collect_frozen() -> None:
    """A full collection that sees the frozen objects too, then what is still alive frozen
    again: for when something frozen was let go (a model closed, a trainer unloaded), whose
    reference cycles would otherwise stay.

    Example:
        >>> collect_frozen()
    """
    gc.unfreeze()
    if not freeze_heap():
        gc.collect()


class _Sentinel:
    """Stands for what cannot be weakly referenced, in ``weak_references``."""


_ALWAYS_ALIVE = _Sentinel()


def weak_references(*holders: Any) -> list[weakref.ref[Any]]:
    """Weak references to ``holders`` (``None`` skipped) and, for each with ``parameters()``
    (a torch module), to every parameter: what ``collect_frozen_unless_freed`` checks once
    they are let go (a model object freed while reference cycles keep its weights is not
    freed memory).

    Example:
        >>> class Engine: pass
        >>> refs = weak_references(Engine(), None)
        >>> len(refs), refs[0]() is None  # the engine had no other reference
        (1, True)
    """
    refs: list[weakref.ref[Any]] = []
    for holder in holders:
        if holder is None:
            continue
        try:
            refs.append(weakref.ref(holder))
        except TypeError:  # no weak reference to it: it counts as alive (a collection runs)
            refs.append(weakref.ref(_ALWAYS_ALIVE))
        parameters = getattr(holder, "parameters", None)
        if callable(parameters):
            refs.extend(weakref.ref(p) for p in parameters())
    return refs


def collect_frozen_unless_freed(refs: Iterable[weakref.ref[Any]]) -> bool:
    """``collect_frozen()`` only when something ``refs`` point to (taken before it was let
    go: ``weak_references``) is still alive; whether it collected.

    A full collection walks every object, the frozen ones too: ~0.2 s with torch and
    transformers imported, more in a larger process (a test session's 1-2 million objects),
    each time a backend closed. What reference counting alone freed needs none: a closed
    engine's model goes with its last reference once its modules hold no cycle
    (``drop_serving_forwards``). What a cycle still holds (a caller's own, compiled graphs)
    is collected as before.

    Example:
        >>> class Model: pass
        >>> model = Model(); refs = weak_references(model); del model
        >>> collect_frozen_unless_freed(refs)  # freed already: no collection
        False
    """
    if all(ref() is None for ref in refs):
        return False
    collect_frozen()
    return True
