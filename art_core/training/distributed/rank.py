"""One rank of a data-parallel training world: a ``Trainer`` that runs its share of a step.

The coordinator (``DistributedTrainer``) sends each rank its share of every optimizer
update's examples, with their loss weights already computed over the whole update. The rank
packs its share into micro-batches, runs forward and backward on them exactly as the
in-process trainer does, then sums the LoRA gradients over all ranks (one flat
``all_reduce``), clips them by the global norm and applies the update: every rank holds the
same gradients, so every rank's optimizer takes the same step, and the sum over the ranks
of the weighted losses is the single-process loss of the whole update.

Why a flat ``all_reduce`` and not ``DistributedDataParallel``: DDP averages (the weights
already make the loss a sum), expects every rank to run the same number of backward passes
(token-balanced shares give ranks different numbers of micro-batches, sometimes none), and
its bucketing and overlap buy little for LoRA gradients, which fit one bucket. Under FSDP2
(``shard_base_model``) the gradients are reduce-scattered in backward instead; every rank
then runs the same number of forwards (shorter lists are padded with a zero-weight
micro-batch), since each forward gathers the sharded weights collectively.

``RankWorker`` is the process-side entry point both launchers call: ``handle(op, payload,
emit)`` for the ops of ``messages``.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import math
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from art_core.memory import release_freed_memory
from art_core.training.checkpoints import stage_checkpoint
from art_core.training.config import TrainConfig, TrainingSettings
from art_core.training.distributed.messages import decode_examples, dumps, error_message, loads
from art_core.training.loading import load_trainable_model
from art_core.training.memory import DevicePeak, MemoryPlan, SequenceSize
from art_core.training.packing import MicroBatch, TrainingExample, make_micro_batches, pack_row
from art_core.training.sequences import TokenSequence
from art_core.training.step_stats import StepStats
from art_core.training.trainer import Trainer
from art_core.training.training_signal import encode_seen

logger = logging.getLogger(__name__)
Emit = Callable[[dict[str, Any]], None]
# Rank r seeds dropout with seed + step + r * stride: rank 0 draws what a single process
# draws, the others draw different masks for their different tokens.
RANK_SEED_STRIDE = 1_000_003


def padding_micro_batch() -> MicroBatch:
    """A one-token micro-batch of weight 0 that a rank runs when it has fewer micro-batches
    than its peers under FSDP (``num_sequences == 0``: it adds nothing and is not reported)."""
    sequence = TokenSequence([0, 0], [False, True], [0.0, 0.0])
    batch = pack_row([TrainingExample(sequence, 0.0, 0.0)], share_prefixes=False)
    return dataclasses.replace(batch, num_sequences=0)


class RankTrainer(Trainer):
    """The ``Trainer`` of one rank: its model, optimizer and share of each step.

    Loading and the step loop are the in-process trainer's; only how gradients are combined
    (``_finish_gradients``) and, with ``shard_base_model``, how the model and optimizer are
    placed (``_load_model_and_optimizer``) differ.
    """

    def __init__(
        self,
        base_model_path: Path,
        model_dir: Path,
        *,
        device: str,
        rank: int,
        world_size: int,
        shard_base_model: bool,
    ) -> None:
        super().__init__(base_model_path, model_dir, device=device)
        self.rank = rank
        self.world_size = world_size
        self.shard_base_model = shard_base_model
        self.allreduce_seconds = 0.0
        self.last_allreduce_seconds = 0.0
        self.last_memory_plan: MemoryPlan | None = None

    def _output_head(self, config: TrainingSettings) -> torch.nn.Linear | None:
        # Sharded, the model's root module gathers the output layer in its forward: the
        # backbone cannot run alone.
        return None if self.shard_base_model else super()._output_head(config)

    def _load_model(self, config: TrainingSettings, adapter: Path | None) -> Any:
        if not self.shard_base_model:
            return super()._load_model(config, adapter)
        from art_core.training.distributed.fsdp import shard_model  # FSDP2: only when sharding

        # Loaded on the CPU; fully_shard moves only this rank's slices to the device.
        model = load_trainable_model(
            self.base_model_path,
            config,
            self.device,
            adapter_path=adapter,
            load_device=torch.device("cpu"),
        )
        shard_model(model, self.device)
        return model

    def _load_model_and_optimizer(
        self, config: TrainingSettings, adapter: Path | None
    ) -> tuple[Any, torch.optim.Optimizer, list[str]]:
        model, optimizer, names = super()._load_model_and_optimizer(config, adapter)
        if self.shard_base_model:
            from art_core.training.distributed.fsdp import shard_optimizer_state  # FSDP2, as above

            # The checkpoint holds full state tensors: slice them like their parameters.
            shard_optimizer_state(optimizer)
        return model, optimizer, names

    def _finish_gradients(self, params: list[torch.nn.Parameter], config: TrainConfig) -> float:
        started = time.perf_counter()
        if not self.shard_base_model:
            # One flat buffer, one all_reduce(SUM): the gradient of the whole update.
            flat = torch.cat(
                [
                    (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                    for p in params
                ]
            )
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            offset = 0
            for p in params:
                p.grad = flat[offset : offset + p.numel()].view_as(p).clone()
                offset += p.numel()
        # The norm of the summed gradients, the same on every rank (sharded: a collective).
        norm = torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm or math.inf)
        from torch.distributed.tensor import DTensor

        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        self.last_allreduce_seconds = time.perf_counter() - started
        self.allreduce_seconds += self.last_allreduce_seconds
        return float(norm)

    # ------------------------------------------------------------------ the ops
    def plan(
        self, updates: list[list[TrainingExample]], config: TrainConfig
    ) -> list[list[MicroBatch]]:
        """This rank's micro-batches of each update (padded to its peers' count when sharded),
        sized to this rank's memory budget (``training.memory``; sharded ranks all keep the
        config's gradient checkpointing: a layer recomputed on one rank only would make the
        ranks' collectives differ)."""
        memory = self.last_memory_plan = self._plan_memory(
            [
                SequenceSize(
                    len(e.sequence), e.sequence.num_trainable_tokens, f"rollout {e.source}"
                )
                for examples in updates
                for e in examples
                if e.sequence.num_trainable_tokens
            ],
            config,
            gradient_checkpointing=bool(config.gradient_checkpointing)
            if self.shard_base_model
            else None,
        )
        attn = getattr(self._model.config, "_attn_implementation", None)
        plan = [
            make_micro_batches(
                examples,
                max_tokens=memory.max_tokens,
                packing=config.packing,
                share_prefixes=config.share_prefixes,
                attn_implementation=attn,
            )
            for examples in updates
        ]
        if self.shard_base_model:
            counts = torch.tensor([len(mbs) for mbs in plan], dtype=torch.long)
            if self.device.type == "cuda":
                counts = counts.to(self.device)
            dist.all_reduce(counts, op=dist.ReduceOp.MAX)
            for mbs, count in zip(plan, counts.tolist(), strict=True):
                mbs += [padding_micro_batch() for _ in range(count - len(mbs))]
        return plan

    def train_share(self, payload: dict[str, Any], emit: Emit) -> dict[str, Any]:
        """Run this rank's share of a step (no checkpoint yet: ``stage``)."""
        config = TrainConfig.model_validate(payload["config"])
        step = int(payload["step"])
        with self._lock, DevicePeak(self.device) as peak:
            try:
                self._ensure_loaded(config)
                if self._loaded_step != step:
                    raise RuntimeError(
                        f"rank {self.rank} sees checkpoint {self._loaded_step} as the latest of "
                        f"{self.model_dir}, the coordinator {step}: do all ranks see the same "
                        "model folder (a filesystem shared by every node)?"
                    )
                updates = [decode_examples(records) for records in payload["updates"]]
                plan = self.plan(updates, config)
                real = [b for mbs in plan for b in mbs if b.num_sequences]
                emit(
                    {
                        "event": "planned",
                        "rank": self.rank,
                        "micro_batches": config.num_epochs * len(real),
                    }
                )

                def forward(record: dict[str, Any]) -> None:
                    record = {**record, "rank": self.rank}
                    if record["event"] == "optimizer_step":
                        record["allreduce_seconds"] = self.last_allreduce_seconds
                    emit(record)

                stats = StepStats(
                    step=step + 1,
                    num_micro_batches=config.num_epochs * len(real),
                    on_progress=forward,
                    show_bar=False,
                )
                self.allreduce_seconds = 0.0
                started = time.perf_counter()
                seen = self._run_updates(
                    plan,
                    config,
                    stats,
                    seed=config.seed + step + 1 + RANK_SEED_STRIDE * self.rank,
                )
                seconds = time.perf_counter() - started
                stats.close()
                memory = (
                    {}
                    if self.last_memory_plan is None
                    else self.last_memory_plan.metrics("train", real)
                )
                memory["train/peak_memory_bytes"] = float(peak.peak())
            except BaseException:
                self._loaded_step = -1  # the weights may be half-updated: reload next time
                raise
            finally:
                release_freed_memory()
        return {
            # This rank's memory plan and peak (``training.memory``).
            "memory": memory,
            "sums": dict(stats.sums),
            "tokens": config.num_epochs * sum(b.num_tokens for b in real),
            "trained_tokens": config.num_epochs * sum(b.num_trainable_tokens for b in real),
            "micro_batches": config.num_epochs * len(real),
            "seconds": seconds,
            "allreduce_seconds": self.allreduce_seconds,
            # The trainer's logprobs of this rank's examples (by source), for the training
            # signal the coordinator writes.
            "seen": encode_seen(seen),
        }

    def stage(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Write the step's checkpoint into a staging folder (rank 0; every rank takes part
        in gathering sharded state). The coordinator commits it once every rank is done."""
        new_step = int(payload["step"])
        with self._lock:
            try:
                assert self._optimizer is not None
                adapter_state: dict[str, torch.Tensor] | None = None
                optimizer_state: Any = self._optimizer
                if self.shard_base_model:
                    # FSDP2, as in _load_model.
                    from art_core.training.distributed.fsdp import (
                        full_optimizer_state,
                        full_trainable_state,
                    )

                    adapter_state = full_trainable_state(self._model)
                    optimizer_state = full_optimizer_state(self._optimizer)
                staging = None
                if self.rank == 0:
                    model = self._model

                    def save_adapter(path: Path) -> None:
                        if adapter_state is None:
                            model.save_pretrained(path, safe_serialization=True)
                        else:
                            model.save_pretrained(
                                path, state_dict=adapter_state, safe_serialization=True
                            )

                    staging = stage_checkpoint(
                        self.folder,
                        new_step,
                        save_adapter=save_adapter,
                        optimizer=optimizer_state,
                        param_names=self._param_names,
                        extra_state=payload["extra_state"],
                    )
                # Committed by the coordinator next; if it is not, the world is re-formed
                # and every rank reloads from the folder.
                self._loaded_step = new_step
            except BaseException:
                self._loaded_step = -1
                raise
        return {"staging": None if staging is None else str(staging)}


class RankWorker:
    """The ops of one rank process: ``start`` (join the process group, load the model),
    ``train`` (a share of a step), ``save`` (stage the checkpoint), ``close``.

    Example:
        >>> worker = RankWorker()
        >>> worker.handle("close", {}, emit=print)
        {}
    """

    def __init__(self) -> None:
        self.trainer: RankTrainer | None = None

    def handle(self, op: str, payload: dict[str, Any], emit: Emit) -> dict[str, Any]:
        if op == "start":
            return self.start(payload)
        if op == "close":
            self.close()
            return {}
        if self.trainer is None:
            raise RuntimeError(f"op {op!r} before start")
        if op == "train":
            return self.trainer.train_share(payload, emit)
        if op == "save":
            return self.trainer.stage(payload)
        raise ValueError(f"unknown op {op!r}")

    def start(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Join the world (``init_process_group``) and load the model for ``spec["config"]``."""
        device = torch.device(spec["device"])
        if device.type == "cpu":
            torch.set_num_threads(int(spec["threads"]))
        else:
            torch.cuda.set_device(device)
        rank, world_size = int(spec["rank"]), int(spec["world_size"])
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group(
            backend=spec["backend"],
            init_method=spec["init_method"],
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=float(spec["timeout_s"])),
            device_id=device if device.type == "cuda" else None,
        )
        self.trainer = RankTrainer(
            Path(spec["base_model_path"]),
            Path(spec["model_dir"]),
            device=str(device),
            rank=rank,
            world_size=world_size,
            shard_base_model=bool(spec["shard_base_model"]),
        )
        config = TrainConfig.model_validate(spec["config"])
        loaded = self.trainer.load(config)
        # Every rank is loaded before the first step runs (and loading errors surface here).
        dist.barrier()
        return {
            "rank": rank,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "device": str(device),
            "threads": torch.get_num_threads(),
            "loaded_step": loaded,
        }

    def close(self) -> None:
        """Leave the process group and free the model."""
        self.trainer = None
        if dist.is_initialized():
            dist.destroy_process_group()


def serve(requests: Connection, replies: Connection) -> None:
    """A rank process's loop: one op at a time from the coordinator, until ``close`` or the
    pipe closes (the coordinator is gone); each answered with its result or its error."""
    worker = RankWorker()

    def emit(event: dict[str, Any]) -> None:
        replies.send_bytes(dumps({"kind": "event", "event": event}))

    while True:
        try:
            message = loads(requests.recv_bytes())
        except EOFError:
            break  # the coordinator is gone
        op = message.get("op")
        try:
            result = worker.handle(str(op), message.get("payload") or {}, emit)
            reply = {"kind": "result", "result": result}
        except Exception as error:
            traceback.print_exc()  # into this rank's log
            sys.stderr.flush()
            reply = error_message(error)
        replies.send_bytes(dumps(reply))
        if op == "close":
            break
    worker.close()
