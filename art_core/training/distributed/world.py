"""``TrainingWorld``: how many training ranks, on which devices, launched how.

A world is a resource decision of the backend (``LocalBackend(training_world=...)``), not a
hyperparameter of one step: its rank processes load the model once and are kept across
steps, so it is fixed for the life of the backend.
"""

from __future__ import annotations

import os
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator


class TrainingWorld(BaseModel):
    """The data-parallel world that runs training steps (``torch.distributed``).

    Every rank holds the base model and the LoRA adapter; each step's micro-batches are
    split across the ranks by token count, the LoRA gradients are summed over the ranks
    (NCCL on CUDA, gloo on CPU) and every rank applies the same update, so N ranks train
    exactly like one on the same batch. ``shard_base_model`` shards the frozen base weights
    across the ranks with FSDP2 for models that do not fit one device.

    Example:
        >>> world = TrainingWorld(ranks=2, devices=("cpu", "cpu"), threads_per_rank=1)
        >>> world.rank_devices(), world.collective_backend()
        (['cpu', 'cpu'], 'gloo')
        >>> TrainingWorld(ranks=2, devices=("cpu",))
        Traceback (most recent call last):
        ...
        pydantic_core._pydantic_core.ValidationError: 1 validation error for TrainingWorld
        ...
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    ranks: int = Field(default=1, ge=1, le=1024, description="Number of training processes.")
    devices: tuple[str, ...] | None = Field(
        default=None,
        description="One torch device per rank, e.g. ('cuda:0', 'cuda:1') or ('cpu', 'cpu'). "
        "Default: cuda:0..ranks-1 when that many GPUs are visible, else cpu for every rank. "
        "Under Ray only the kind counts (Ray picks the GPU of each rank).",
    )
    threads_per_rank: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="torch threads of each CPU rank (default: this machine's cores / ranks).",
    )
    launcher: Literal["local", "ray"] = Field(
        default="local",
        description="'local': rank processes on this machine, started by the backend. 'ray': "
        "a Ray actor group in a placement group (across machines; needs `ray`).",
    )
    shard_base_model: bool = Field(
        default=False,
        description="Shard the frozen base weights (and the adapter) across the ranks with "
        "FSDP2: each rank keeps 1/ranks of them, for models that do not fit one device.",
    )
    backend: Literal["auto", "gloo", "nccl"] = Field(
        default="auto",
        description="torch.distributed backend: 'auto' is NCCL on CUDA, gloo on CPU.",
    )
    start_timeout_s: float = Field(
        default=900.0, gt=0, description="Seconds the ranks get to start and load the model."
    )
    collective_timeout_s: float = Field(
        default=1800.0,
        gt=0,
        description="Seconds a collective may wait for the other ranks before it fails.",
    )
    ray_address: str | None = Field(
        default=None,
        description="Ray cluster to join when Ray is not initialized yet (None: RAY_ADDRESS "
        "or a new local cluster).",
    )
    ray_placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    ray_max_restarts: int = Field(
        default=-1, ge=-1, description="How often Ray restarts a dead rank (-1: always)."
    )

    @model_validator(mode="after")
    def _check(self) -> TrainingWorld:
        if self.devices is not None:
            if len(self.devices) != self.ranks:
                raise ValueError(
                    f"devices names {len(self.devices)} devices for {self.ranks} ranks; give "
                    "one per rank"
                )
            kinds = set()
            for name in self.devices:
                try:
                    kinds.add(torch.device(name).type)
                except RuntimeError as error:
                    raise ValueError(f"devices: {name!r} is not a torch device") from error
            if not kinds <= {"cpu", "cuda"}:
                raise ValueError(f"devices must be cpu or cuda devices, got {self.devices}")
            if len(kinds) > 1:
                raise ValueError(f"all ranks must use one kind of device, got {self.devices}")
            if self.launcher == "local" and "cuda" in kinds:
                indexed = [torch.device(name) for name in self.devices]
                if any(d.index is None for d in indexed) and self.ranks > 1:
                    raise ValueError("local CUDA ranks need indexed devices: 'cuda:0', 'cuda:1'")
                if len({d.index for d in indexed}) != len(indexed):
                    raise ValueError(f"two ranks cannot share one GPU: {self.devices}")
        if self.backend == "nccl" and self.device_type() != "cuda":
            raise ValueError("the nccl backend needs CUDA devices; use gloo on CPU")
        return self

    def device_type(self) -> str:
        """'cuda' or 'cpu': the kind of device every rank uses."""
        if self.devices is not None:
            return torch.device(self.devices[0]).type
        if self.launcher == "local":
            usable = torch.cuda.is_available() and torch.cuda.device_count() >= self.ranks
            return "cuda" if usable else "cpu"
        return "cuda" if torch.cuda.is_available() else "cpu"

    def rank_devices(self) -> list[str]:
        """The device of each rank, as the local launcher starts it."""
        if self.devices is not None:
            return list(self.devices)
        if self.device_type() == "cuda":
            return [f"cuda:{rank}" for rank in range(self.ranks)]
        return ["cpu"] * self.ranks

    def collective_backend(self) -> str:
        """The torch.distributed backend: NCCL on CUDA, gloo on CPU (unless chosen)."""
        if self.backend != "auto":
            return self.backend
        return "nccl" if self.device_type() == "cuda" else "gloo"

    def threads(self) -> int:
        """torch threads per CPU rank."""
        if self.threads_per_rank is not None:
            return self.threads_per_rank
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        return max(1, (cores or os.cpu_count() or 1) // self.ranks)
