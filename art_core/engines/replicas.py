"""Where the replicas of a model run: one engine worker per device, or per CPU share.

``plan_replicas`` decides it (CPU: the cores this process may use split into equal,
disjoint shares, one per replica, each worker pinned to its share; CUDA: one GPU per
replica), ``build_replicas`` makes the engines: worker processes here, or Ray actors placed
by Ray (``ray_replicas.py``). A ``ReplicaRouter`` serves them as one engine.
"""

from __future__ import annotations

import os
from pathlib import Path

from art_core.cpu import cpu_budget
from art_core.engines.base import Engine
from art_core.engines.ray_replicas import RayPlacement, RayWorkerEngine, bundle_of
from art_core.engines.replica_spec import ReplicaSpec
from art_core.engines.tokenizer import ChatTokenizer
from art_core.engines.worker_engine import WorkerEngine

__all__ = ["ReplicaSpec", "build_replicas", "plan_replicas"]


def _allowed_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def plan_replicas(
    replicas: int,
    *,
    threads_per_replica: int | None = None,
    devices: list[str] | None = None,
) -> list[ReplicaSpec]:
    """The placement of ``replicas`` engine workers on this machine.

    Devices, when given, are used in turn (``["cuda:0", "cuda:1"]``). On CPU each replica
    gets ``threads_per_replica`` threads (default: an equal share of the cores this process
    may use) and, when the shares fit, its own cores: replicas never compete for a core.

    Example:
        >>> [s.threads for s in plan_replicas(2, threads_per_replica=1)]
        [1, 1]
    """
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    if devices is not None and not devices:
        raise ValueError("devices must name at least one device")
    if threads_per_replica is not None and threads_per_replica < 1:
        raise ValueError(f"threads_per_replica must be >= 1, got {threads_per_replica}")
    on_gpu = devices is not None and all(d.startswith("cuda") for d in devices)
    threads = threads_per_replica or max(1, cpu_budget() // replicas)
    allowed = _allowed_cpus()
    fits = replicas * threads <= len(allowed) and not on_gpu
    specs = []
    for index in range(replicas):
        cpus = tuple(allowed[index * threads : (index + 1) * threads]) if fits else None
        device = devices[index % len(devices)] if devices else None
        specs.append(ReplicaSpec(index, device, None if on_gpu else threads, cpus))
    return specs


def build_replicas(
    specs: list[ReplicaSpec],
    model_path: Path,
    *,
    log_dir: Path,
    chat: ChatTokenizer,
    dtype: str | None = None,
    max_batch_size: int = 32,
    ray_address: str | None = None,
    prefix_cache_bytes: int | None = None,
    compile_decode: bool = False,
) -> list[Engine]:
    """The engines of ``specs``: worker processes, or Ray actors with ``ray_address``
    (``"auto"``: the running cluster, or a new local one)."""
    if ray_address is not None:
        placement = RayPlacement(ray_address, [bundle_of(spec) for spec in specs], "PACK")
        return [
            RayWorkerEngine(
                model_path,
                spec=spec,
                placement=placement,
                chat=chat,
                dtype=dtype,
                max_batch_size=max_batch_size,
                prefix_cache_bytes=prefix_cache_bytes,
                compile_decode=compile_decode,
            )
            for spec in specs
        ]

    return [
        WorkerEngine(
            model_path,
            log_dir=log_dir,
            index=spec.index,
            device=spec.device,
            dtype=dtype,
            threads=spec.threads,
            cpus=list(spec.cpus) if spec.cpus else None,
            max_batch_size=max_batch_size,
            chat=chat,
            prefix_cache_bytes=prefix_cache_bytes,
            compile_decode=compile_decode,
        )
        for spec in specs
    ]
