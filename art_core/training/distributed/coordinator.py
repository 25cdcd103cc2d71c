"""``DistributedTrainer``: a ``Trainer`` whose steps run on a data-parallel world of ranks.

It keeps ``Trainer``'s contract (``train_step`` writes checkpoint ``latest + 1`` or raises
with the previous checkpoint in force), so the backend does not care where a step runs.
The coordinator, in the backend's process, is not a rank itself: it turns the groups into
each optimizer update's examples with their final loss weights (the same code as the
in-process trainer), splits every update across the ranks by token count, and drives the
ranks through two phases:

1. ``train``: every rank runs its share, the ranks sum their LoRA gradients, every rank
   applies the same update; each reports its metric sums, tokens and times, and the
   trainer's logprobs of its examples' trained tokens (the coordinator writes the step's
   training signal from them, see ``training.training_signal``);
2. ``save``: rank 0 writes the checkpoint into a staging folder (with FSDP every rank
   helps gather the sharded state).

Only when every rank has finished both does the coordinator commit the checkpoint (one
rename). A rank that dies or raises anywhere before that fails the step: the other ranks
are stopped, the staging folder is removed, the previous checkpoint stays in force, the
error names the rank and how it ended, and the next step re-forms the world from the
latest checkpoint.
"""

from __future__ import annotations

import json
import logging
import queue
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from art_core.distill.teachers import make_teacher, score_rollouts
from art_core.model_folder import ADAPTER_CONFIG_FILE, ModelFolder
from art_core.training.batch import PreparedBatch, prepare_batch, update_examples
from art_core.training.cancel import raise_if_cancelled
from art_core.training.checkpoints import commit_checkpoint
from art_core.training.config import TrainConfig, TrainResult
from art_core.training.distributed.balance import split_by_tokens
from art_core.training.distributed.local_group import LocalRankGroup
from art_core.training.distributed.messages import encode_examples
from art_core.training.distributed.ray_group import RayRankGroup
from art_core.training.distributed.world import TrainingWorld
from art_core.training.packing import TrainingExample
from art_core.training.step_stats import ProgressCallback, StepStats
from art_core.training.trainer import Trainer
from art_core.training.training_signal import decode_seen, signal_records
from art_core.trajectories import TrajectoryGroup

logger = logging.getLogger(__name__)
# After the first rank fails, how long the others get to report their own failure (the
# root cause, a dead rank, and its consequence, a broken collective, usually both arrive).
FAILURE_GRACE_S = 15.0
# A rank's error is cut to its first line, at most this long, in the step's error message
# (the full traceback goes to the log).
MESSAGE_CHARS = 300


class TrainingWorldError(RuntimeError):
    """A training step (or the start of the world) failed on a rank.

    Nothing of the step was saved: the previous checkpoint stays in force, and the next
    step starts the ranks again.
    """


class RankFailure(Exception):
    """One or more ranks died or raised during an op (internal; becomes a
    ``TrainingWorldError``)."""


class RankGroup(Protocol):
    """The rank processes of a world, however launched (``LocalRankGroup``,
    ``RayRankGroup``)."""

    size: int
    events: queue.Queue[tuple[int, dict[str, Any] | None]]

    def rank_devices(self) -> list[str]: ...

    def launch(self) -> str: ...

    def send(self, rank: int, op: str, payload: dict[str, Any]) -> None: ...

    def describe(self, rank: int) -> str: ...

    def alive(self) -> bool: ...

    def stop(self, *, failed: bool) -> None: ...


def make_group(world: TrainingWorld, folder: ModelFolder) -> RankGroup:
    """The launcher the world asks for."""
    if world.launcher == "ray":
        return RayRankGroup(world)

    return LocalRankGroup(world, folder.logs)


class DistributedTrainer(Trainer):
    """GRPO steps on ``world.ranks`` processes (``torch.distributed``), same API as ``Trainer``.

    The ranks start on the first ``load`` or ``train_step`` and stay (each holds the model
    and optimizer) until ``unload``; N ranks give the update one process gives on the same
    groups, up to float summation order.

    Example:
        >>> trainer = DistributedTrainer(base, Path(".art/p/models/m"),
        ...                              TrainingWorld(ranks=2, devices=("cpu", "cpu")))  # too slow for a docstring: two rank processes, `groups` to train on  # doctest: +SKIP
        >>> trainer.train_step(groups, TrainConfig()).metrics["train/world_size"]  # too slow for a docstring  # doctest: +SKIP
        2.0
        >>> trainer.unload()  # too slow for a docstring  # doctest: +SKIP
    """

    def __init__(
        self, base_model_path: Path, model_dir: Path | ModelFolder, world: TrainingWorld
    ) -> None:
        super().__init__(base_model_path, model_dir, device="cpu")
        self.world = world
        self._group: RankGroup | None = None
        self._formed = False
        self._group_lora: dict[str, object] | None = None
        self._ranks: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ public API
    @property
    def ranks(self) -> list[dict[str, Any]]:
        """What each running rank reported when it started: rank, pid, host, device,
        threads (empty while no world is formed)."""
        return list(self._ranks)

    def load(self, config: TrainConfig | None = None) -> int:
        """Start the ranks now (else on the first step); return the step they loaded."""
        with self._lock:
            self._form(TrainConfig() if config is None else config)
            return self.latest_step()

    def unload(self) -> None:
        """Stop the rank processes (started again by the next step)."""
        with self._lock:
            self._stop(failed=False)

    # ------------------------------------------------------------------ the world
    def _form(self, config: TrainConfig) -> RankGroup:
        lora = config.lora_settings()
        if self._formed and self._group_lora != lora and self.latest_step() == 0:
            # A fresh adapter is shaped by the first step's config, not by the one the
            # ranks were started with.
            self._stop(failed=False)
        if self._formed and self._group is not None and not self._group.alive():
            # A rank ended between steps: form a new world rather than fail this step.
            logger.warning("a training rank ended since the last step; starting the ranks again")
            self._stop(failed=True)
        if self._group is None:
            self._group = make_group(self.world, self.folder)
        group = self._group
        if self._formed:
            return group
        devices = group.rank_devices()
        try:
            try:
                init_method = group.launch()
            except ValueError:
                raise  # a world this machine cannot host: the request is wrong
            except Exception as error:
                raise RankFailure(f"the ranks could not be launched: {error}") from error
            specs = [
                {
                    "rank": rank,
                    "world_size": group.size,
                    "init_method": init_method,
                    "backend": self.world.collective_backend(),
                    "device": devices[rank],
                    "threads": self.world.threads(),
                    "shard_base_model": self.world.shard_base_model,
                    "base_model_path": str(self.base_model_path),
                    "model_dir": str(self.model_dir),
                    "timeout_s": self.world.collective_timeout_s,
                    "config": config.model_dump(mode="json"),
                }
                for rank in range(group.size)
            ]
            started = self._call(group, "start", specs, timeout=self.world.start_timeout_s)
        except BaseException as error:
            self._stop(failed=True)
            if isinstance(error, RankFailure):
                raise TrainingWorldError(
                    f"the training world of {group.size} ranks did not start: {error}"
                ) from None
            raise
        self._formed, self._group_lora, self._ranks = True, lora, started
        logger.info("training world formed: %s", started)
        return group

    def _stop(self, *, failed: bool) -> None:
        """End the world: after a failure the launcher is kept (Ray restarts its actors and
        the next step forms a new world on them); otherwise it is released."""
        group = self._group
        self._formed, self._ranks = False, []
        if not failed:
            self._group = None
        if group is not None:
            group.stop(failed=failed)

    def _call(
        self,
        group: RankGroup,
        op: str,
        payloads: Sequence[dict[str, Any]],
        *,
        timeout: float | None = None,
        on_event: Any = None,
    ) -> list[dict[str, Any]]:
        """Send ``op`` to every rank and wait for all results; ``RankFailure`` when a rank
        dies, raises or (with ``timeout``) takes too long."""
        for rank, payload in enumerate(payloads):
            group.send(rank, op, payload)
        results: dict[int, dict[str, Any]] = {}
        failures: dict[int, str] = {}
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(results) + len(failures) < group.size:
            # A cancelled step ends the world (the ranks are formed again on the next step):
            # the caller's except clause stops the group and removes the staging folder.
            # (The step in force is read from disk only once a cancel is seen.)
            if op == "train" and self._cancel is not None and self._cancel.is_set():
                raise_if_cancelled(self._cancel, self.latest_step())
            if failures and deadline is None:
                deadline = time.monotonic() + FAILURE_GRACE_S
            wait = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
            try:
                rank, message = group.events.get(timeout=wait)
            except queue.Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    for rank in range(group.size):
                        if rank not in results and rank not in failures:
                            failures[rank] = f"rank {rank} did not answer {op!r} in time"
                continue
            if rank in failures:
                continue
            if message is None:
                # Gone, even if it answered this op already: it cannot take part in the next.
                results.pop(rank, None)
                failures[rank] = group.describe(rank)
            elif message.get("kind") == "event":
                if on_event is not None:
                    on_event(rank, message["event"])
            elif message.get("kind") == "result":
                results[rank] = message["result"]
            else:
                text = str(message.get("message") or "").strip()
                first = text.splitlines()[0] if text else ""
                if len(first) > MESSAGE_CHARS:
                    first = first[:MESSAGE_CHARS] + "..."
                failures[rank] = f"rank {rank} raised {message.get('type')}: {first}"
                logger.warning("rank %d failed in %r:\n%s", rank, op, message.get("traceback"))
        if failures:
            # Dead ranks first: they are the cause, broken collectives the consequence.
            ordered = sorted(failures.items(), key=lambda item: ("raised" in item[1], item[0]))
            raise RankFailure("; ".join(text for _, text in ordered))
        return [results[rank] for rank in range(group.size)]

    # ------------------------------------------------------------------ a step
    def _check_lora(self, config: TrainConfig, step: int) -> None:
        """A later step cannot change the adapter's shape (read from the checkpoint)."""
        if step == 0:
            return
        saved = json.loads(
            (self.folder.checkpoint(step) / ADAPTER_CONFIG_FILE).read_text(encoding="utf-8")
        )
        targets = saved.get("target_modules") or []
        have = {
            "r": saved.get("r"),
            "lora_alpha": saved.get("lora_alpha"),
            "target_modules": sorted([targets] if isinstance(targets, str) else targets),
        }
        want = config.lora_settings()
        if have != want:
            raise ValueError(
                f"the adapter of {self.model_dir} has LoRA settings {have}, but the TrainConfig "
                f"asks for {want}; LoRA shape cannot change between steps of one model"
            )

    def _train_step(
        self,
        groups: list[TrajectoryGroup],
        config: TrainConfig,
        on_progress: ProgressCallback | None,
    ) -> TrainResult:
        started = time.perf_counter()
        step = self.latest_step()
        new_step = step + 1
        self._check_lora(config, step)
        prepared = _prepared_with_teacher(groups, config)
        updates = _trainable_updates(prepared, config)
        if not updates:
            return self._nothing_trained(step, groups, prepared.metrics)
        group = self._form(config)
        share_prefixes = config.packing and config.share_prefixes
        shares = [
            split_by_tokens(examples, group.size, share_prefixes=share_prefixes)
            for examples in updates
        ]
        payloads = [
            {
                "step": step,
                "config": config.model_dump(mode="json"),
                "updates": [encode_examples(parts[rank]) for parts in shares],
            }
            for rank in range(group.size)
        ]
        relay = _ProgressRelay(new_step, group.size, on_progress, started)
        try:
            reports = self._call(group, "train", payloads, on_event=relay.event)
            relay.close()
            metrics = {
                **prepared.metrics,
                **relay.metrics(reports, config, updates=config.num_epochs * len(updates)),
                "train/trained": 1.0,
            }
            folder = self._save_checkpoint(group, new_step, config, metrics)
        except BaseException as error:
            relay.close()
            self._stop(failed=True)
            self._remove_staging(new_step)
            if isinstance(error, RankFailure):
                raise TrainingWorldError(
                    f"training step {new_step} failed: {error}. Nothing was saved: checkpoint "
                    f"{step} stays in force; the ranks are started again on the next step"
                ) from None
            raise
        # Each example ran on exactly one rank, which reported its logprobs by source.
        seen = {
            source: values
            for report in reports
            for source, values in decode_seen(report.get("seen", [])).items()
        }
        signal = signal_records(prepared.rollouts, updates, seen)
        self._record(step, groups, metrics, checkpoint_step=new_step, signal=signal)
        return TrainResult(step=new_step, metrics=metrics, checkpoint_path=str(folder))

    def _save_checkpoint(
        self, group: RankGroup, new_step: int, config: TrainConfig, metrics: dict[str, float]
    ) -> Path:
        """Have the ranks save step ``new_step`` (rank 0 stages it) and commit it."""
        extra_state = {
            "base_model": str(self.base_model_path),
            "config": config.model_dump(mode="json"),
            "metrics": {k: v for k, v in metrics.items() if _finite(v)},
            "world": self.world.model_dump(mode="json"),
        }
        saved = self._call(
            group, "save", [{"step": new_step, "extra_state": extra_state}] * group.size
        )
        staging = saved[0].get("staging")
        if not staging:
            raise RankFailure("rank 0 staged no checkpoint")
        return commit_checkpoint(self.folder, new_step, Path(staging))

    def _remove_staging(self, step: int) -> None:
        """Remove staging folders of ``step`` left by a rank 0 that died while writing."""
        if self.folder.checkpoints.is_dir():
            for leftover in self.folder.checkpoints.glob(f".{step:04d}-*"):
                shutil.rmtree(leftover, ignore_errors=True)


def _prepared_with_teacher(groups: list[TrajectoryGroup], config: TrainConfig) -> PreparedBatch:
    """The step's rollouts with their advantages, scored by the teacher when there is one."""
    prepared = prepare_batch(
        groups,
        scale_rewards=config.scale_rewards,
        keep_equal_groups=config.trains_equal_groups,
    )
    if config.teacher is not None and prepared.rollouts:
        # Scored once, here: every rank trains on the same teacher scores.
        teacher = make_teacher(config.teacher)
        try:
            scored = score_rollouts(prepared.rollouts, teacher, top_k=config.teacher.top_k)
        finally:
            teacher.close()
        prepared.metrics.update({f"train/{name}": value for name, value in scored.items()})
    return prepared


def _trainable_updates(prepared: PreparedBatch, config: TrainConfig) -> list[list[TrainingExample]]:
    """The examples of each update that has tokens to train."""
    # The loss weights of each update are computed over the whole update, here, before
    # any split: where a token runs cannot change its weight.
    return [
        examples
        for examples in update_examples(
            prepared.rollouts,
            config.optimizer_steps_per_epoch,
            normalization=config.loss_normalization,
            dr_grpo_length=config.dr_grpo_length,
        )
        if any(example.sequence.num_trainable_tokens for example in examples)
    ]


def _finite(value: float) -> bool:
    return value == value and value not in (float("inf"), float("-inf"))


class _ProgressRelay:
    """The ranks' progress records, relayed as one step's (``StepStats``): every rank's
    micro-batches (with ``rank``), and rank 0's optimizer steps (the norm is the same on
    every rank). Records that arrive before every rank said how many micro-batches it
    planned are held back, so the bar and ``num_micro_batches`` know the total."""

    def __init__(
        self,
        step: int,
        ranks: int,
        on_progress: ProgressCallback | None,
        started: float,
    ) -> None:
        self.step, self.ranks, self.on_progress, self.started = step, ranks, on_progress, started
        self.planned: dict[int, int] = {}
        self.held: list[tuple[int, dict[str, Any]]] = []
        self.stats: StepStats | None = None

    def event(self, rank: int, record: dict[str, Any]) -> None:
        if record.get("event") == "planned":
            self.planned[rank] = int(record["micro_batches"])
            if len(self.planned) == self.ranks:
                self.stats = StepStats(
                    step=self.step,
                    num_micro_batches=sum(self.planned.values()),
                    on_progress=self.on_progress,
                    started=self.started,
                )
                held, self.held = self.held, []
                for item in held:
                    self._relay(*item)
            return
        if self.stats is None:
            self.held.append((rank, record))
        else:
            self._relay(rank, record)

    def _relay(self, rank: int, record: dict[str, Any]) -> None:
        assert self.stats is not None
        where = {"epoch": record["epoch"], "update": record["optimizer_step"]}
        if record["event"] == "micro_batch":
            self.stats.micro_batch(
                {"loss": record["loss"]}, tokens=record["tokens"], rank=rank, **where
            )
        elif record["event"] == "optimizer_step" and rank == 0:
            self.stats.optimizer_step(
                record["grad_norm"], allreduce_seconds=record.get("allreduce_seconds"), **where
            )

    def close(self) -> None:
        if self.stats is not None:
            self.stats.close()

    def metrics(
        self, reports: list[dict[str, Any]], config: TrainConfig, *, updates: int
    ) -> dict[str, float]:
        """The step's metrics: the ranks' weighted sums added up (each update's weights sum
        to 1 over all ranks), rank 0's gradient norms, and each rank's tokens and times."""
        assert self.stats is not None
        sums: dict[str, float] = {}
        for report in reports:
            for name, value in report["sums"].items():
                sums[name] = sums.get(name, 0.0) + float(value)
        self.stats.sums.clear()
        self.stats.sums.update(sums)
        metrics = self.stats.metrics(
            updates=updates,
            tokens_run=sum(int(report["tokens"]) for report in reports),
            learning_rate=config.learning_rate,
        )
        metrics["train/world_size"] = float(len(reports))
        for rank, report in enumerate(reports):
            metrics[f"train/rank{rank}/tokens"] = float(report["tokens"])
            metrics[f"train/rank{rank}/seconds"] = float(report["seconds"])
            metrics[f"train/rank{rank}/allreduce_seconds"] = float(report["allreduce_seconds"])
        metrics["train/allreduce_seconds"] = max(float(r["allreduce_seconds"]) for r in reports)
        # Memory (``training.memory``): each rank's peak, and the largest of every figure.
        for rank, report in enumerate(reports):
            for name, value in report.get("memory", {}).items():
                metrics[name] = max(metrics.get(name, 0.0), float(value))
                if name == "train/peak_memory_bytes":
                    metrics[f"train/rank{rank}/peak_memory_bytes"] = float(value)
        tokens = [float(report["tokens"]) for report in reports]
        metrics["train/rank_token_imbalance"] = max(tokens) / max(sum(tokens) / len(tokens), 1.0)
        return metrics
