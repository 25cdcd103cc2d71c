"""One engine replica's placement, as ``replicas.plan_replicas`` decides it and both kinds
of worker (processes here, Ray actors) take it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReplicaSpec:
    """One replica: its index, device (None: auto), torch threads and the CPUs it is pinned
    to (None: not pinned).

    Example:
        >>> ReplicaSpec(0, None, 2, (0, 1)).threads
        2
    """

    index: int
    device: str | None
    threads: int | None
    cpus: tuple[int, ...] | None
