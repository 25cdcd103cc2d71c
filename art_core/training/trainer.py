"""``Trainer``: GRPO steps on a LoRA adapter, with checkpoints, history and resume.

One ``Trainer`` owns one model folder (``.art/{project}/models/{name}/``). ``train_step`` is
synchronous on purpose: the backend runs it in a worker thread while the engine is paused,
then hot-swaps ``result.checkpoint_path`` into the engine.

Step numbering follows ART: step ``s`` is the adapter that served the rollouts; training on
them writes checkpoint ``s + 1``. The history record and the trajectory log of that call are
stored under step ``s``, so ``train/reward`` at step ``s`` measures checkpoint ``s``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from art_core import memory as process_memory
from art_core.device import autocast_dtype, choose_device, follow_free_cores, use_cpu_threads
from art_core.distill.scores import Teacher
from art_core.distill.teachers import make_teacher, score_rollouts, teacher_key
from art_core.kept_logits import KeptLogits
from art_core.memory import (
    DEFAULT_FRACTION,
    MemoryBudget,
    collect_frozen_unless_freed,
    freeze_heap,
    release_freed_memory,
    resident_bytes,
    resolve_memory_budget,
    weak_references,
)
from art_core.model_folder import ModelFolder
from art_core.training.batch import (
    PreparedBatch,
    nothing_trained_reason,
    prepare_batch,
    update_examples,
)
from art_core.training.cancel import raise_if_cancelled
from art_core.training.checkpoints import (
    load_optimizer_state,
    save_checkpoint,
    steps_to_delete,
)
from art_core.training.config import (
    SFTConfig,
    TeacherConfig,
    TrainConfig,
    TrainingSettings,
    TrainResult,
)
from art_core.training.loading import (
    adapter_settings,
    base_weights_dtype,
    load_trainable_model,
)
from art_core.training.loss import (
    LossOutput,
    grpo_loss,
    head_logprobs,
    reverse_kl,
    token_logprobs,
)
from art_core.training.memory import (
    DevicePeak,
    MemoryPlan,
    ModelShape,
    SequenceSize,
    SequenceTooLargeError,
    estimate_step_memory,
    plan_memory,
    rollout_sequence_sizes,
)
from art_core.training.output_head import decoder_of, fusable_output_head
from art_core.training.packing import MicroBatch, TrainingExample, make_micro_batches
from art_core.training.sft import SFTRecord, plan_sft, run_sft
from art_core.training.step_stats import ALWAYS_REPORTED, ProgressCallback, StepStats
from art_core.training.training_signal import SeenLogprobs, record_logprobs, signal_records
from art_core.trajectories import TrajectoryGroup

logger = logging.getLogger(__name__)


def _needs_old_logprobs(config: TrainConfig) -> bool:
    """Whether the loss needs the trainer's logprobs before the update: truncated importance
    sampling and the off-policy mask compare them with the sampler's."""
    return config.truncated_importance_sampling is not None or config.off_policy_mask is not None


def _needs_full_logits(config: TrainingSettings) -> bool:
    """Whether a step needs the student's logits whole (a teacher's top-k distillation)."""
    teacher = getattr(config, "teacher", None)
    return teacher is not None and teacher.top_k > 0


class Trainer:
    """GRPO training of a LoRA adapter on captured trajectories, for one model folder.

    The base model and adapter are loaded lazily on the first ``train_step`` (from the latest
    checkpoint when there is one, with its optimizer state), so constructing a ``Trainer``
    is cheap and ``latest_step()`` works without loading anything.

    Example:
        >>> from art_core.embedded import resolve_base_model
        >>> trainer = Trainer(resolve_base_model("tiny-random"), Path(".art/demo/models/m1"))
        >>> result = trainer.train_step(groups, TrainConfig(learning_rate=1e-4))  # fragment: `groups` with recorded calls  # doctest: +SKIP
        >>> result.step, result.checkpoint_path                                   # fragment  # doctest: +SKIP
        (1, '.art/demo/models/m1/checkpoints/0001')
    """

    def __init__(
        self, base_model_path: Path, model_dir: Path | ModelFolder, *, device: str | None = None
    ) -> None:
        self.base_model_path = Path(base_model_path)
        if not (self.base_model_path / "config.json").is_file():
            raise FileNotFoundError(
                f"{self.base_model_path} is not a Hugging Face model folder (no config.json); "
                "resolve embedded names with art_core.embedded.resolve_base_model"
            )
        self.folder = model_dir if isinstance(model_dir, ModelFolder) else ModelFolder(model_dir)
        self.model_dir = self.folder.root
        self.device = choose_device(device)
        if self.device.type == "cpu":
            use_cpu_threads()
        self._lock = threading.Lock()
        self._model: Any = None
        self._optimizer: torch.optim.Optimizer | None = None
        self._param_names: list[str] = []
        self._loaded_step = -1
        self._base_dtype: torch.dtype | None = None
        # The running step's cancel event (see ``training.cancel``); None between steps.
        self._cancel: threading.Event | None = None
        # Only the trained positions' logits are computed, where the model allows it.
        self._kept_logits = KeptLogits("the model")
        # The output layer, when it can run fused with the log-softmax (``output_head``),
        # checked once per loaded model; whether gradient checkpointing is on now.
        self._head: torch.nn.Linear | None = None
        self._checkpointing = False
        # The CUDA default budget, taken of the device memory free at the first step.
        self._device_budget: MemoryBudget | None = None
        # On-policy distillation's teacher, kept between steps while its config stays.
        self._teacher: tuple[tuple[str | None, ...], Teacher] | None = None

    # ------------------------------------------------------------------ public API

    def latest_step(self) -> int:
        """The step of the newest complete checkpoint in ``model_dir`` (0 when there is none).

        Example:
            >>> from art_core.embedded import resolve_base_model
            >>> Trainer(resolve_base_model("tiny-random"), Path("new-model")).latest_step()
            0
        """
        return self.folder.latest_step()

    def checkpoint_path(self, step: int | None = None) -> Path | None:
        """The folder of checkpoint ``step`` (default: latest), None when it is not complete."""
        step = self.latest_step() if step is None else step
        return self.folder.checkpoint(step) if step in self.folder.checkpoint_steps() else None

    @property
    def model(self) -> Any:
        """The loaded ``PeftModel`` (None until the first ``load`` or ``train_step``)."""
        return self._model

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """The AdamW optimizer of the adapter weights (None until loaded)."""
        return self._optimizer

    def load(self, config: TrainConfig | None = None) -> int:
        """Load the base model and adapter now (else done lazily); return the loaded step.

        Resumes from the latest checkpoint (adapter weights and optimizer state) when there
        is one; otherwise creates a fresh adapter shaped by ``config``.

        Example:
            >>> from art_core.embedded import resolve_base_model
            >>> Trainer(resolve_base_model("tiny-random"), Path("new-model")).load()  # a fresh adapter
            0
        """
        with self._lock:
            self._ensure_loaded(TrainConfig() if config is None else config, check_lora=False)
            return self._loaded_step

    def train_step(
        self,
        groups: Sequence[TrajectoryGroup],
        config: TrainConfig | None = None,
        *,
        on_progress: ProgressCallback | None = None,
        cancel: threading.Event | None = None,
    ) -> TrainResult:
        """Train on ``groups`` and write checkpoint ``latest_step() + 1``.

        Assembles token-exact sequences from the recorded calls, computes group-relative
        advantages, runs ``config.num_epochs * config.optimizer_steps_per_epoch`` optimizer
        steps (gradients accumulated over micro-batches), then saves the checkpoint, appends
        metrics to ``history.jsonl``, the groups to ``trajectories/train/{step:04d}.jsonl``
        and what each rollout was trained with to ``signals/train/{step:04d}.jsonl``
        (``training.training_signal``).
        When the groups hold no token to train on (all rewards equal in every group, no
        recorded calls), nothing changes: a warning names the reason, the history records it
        (``train/trained`` 0) and no checkpoint is written; ``result.step`` stays the current
        step and ``result.nothing_trained`` holds the reason.
        ``on_progress`` is called (in this thread) after every micro-batch and optimizer step
        with a JSON-serializable dict. Setting ``cancel`` (from any thread) stops the step
        before its next forward pass with ``TrainingCancelled``: no checkpoint is written and
        the latest one stays in force.

        Example:
            >>> result = trainer.train_step(groups, TrainConfig())   # fragment: a `trainer`, `groups` with recorded calls  # doctest: +SKIP
            >>> result.metrics["train/loss"]                         # fragment  # doctest: +SKIP
            0.013
        """
        config = TrainConfig() if config is None else config
        if not isinstance(config, TrainConfig):
            raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
        groups = list(groups)
        if not groups:
            raise ValueError("train_step needs at least one TrajectoryGroup")
        with self._lock:
            self._cancel = cancel
            try:
                return self._train_step(groups, config, on_progress)
            except SequenceTooLargeError:
                raise  # refused before any forward: the weights in memory are the latest's
            except BaseException:
                # The weights in memory may be half-updated: reload the latest checkpoint next.
                self._loaded_step = -1
                raise
            finally:
                self._cancel = None

    def train_sft(
        self,
        records: Sequence[SFTRecord],
        config: SFTConfig | None = None,
        *,
        on_progress: ProgressCallback | None = None,
        groups: Sequence[TrajectoryGroup] = (),
        data_metrics: Mapping[str, float] | None = None,
        cancel: threading.Event | None = None,
    ) -> TrainResult:
        """Supervised epochs on ``records`` and write checkpoint ``latest_step() + 1``.

        Cross-entropy on the trained (assistant) tokens of each record's sequences, token-mean
        over each batch of ``config.resolved_batch_size`` records (see ``training.sft``).
        Same adapter, optimizer state, checkpoints and history as ``train_step``: the history
        record has split ``sft`` and ``sft/...`` metrics, under the step the call started
        from; ``groups`` (the data as trajectories) go to ``trajectories/sft/{step:04d}.jsonl``
        and ``data_metrics`` (e.g. how many records were rendered) join the metrics.
        Every record is checked before the first update; a failure leaves no checkpoint.
        ``cancel`` stops it as it stops ``train_step``.

        Example:
            >>> from art_core.embedded import resolve_base_model
            >>> from art_core.training.sequences import TokenSequence
            >>> trainer = Trainer(resolve_base_model("tiny-random"), Path("sft-model"))
            >>> records = [SFTRecord("demo", [TokenSequence([1, 2, 3], [False, True, True],
            ...                                             [0.0, 0.0, 0.0])])]
            >>> trainer.train_sft(records, SFTConfig(learning_rate=1e-4, epochs=2)).step
            1
        """
        config = SFTConfig() if config is None else config
        if not isinstance(config, SFTConfig):
            raise TypeError(f"config must be an SFTConfig, got {type(config).__name__}")
        records = list(records)
        with self._lock, DevicePeak(self.device) as peak:
            self._cancel = cancel
            started = time.perf_counter()
            try:
                self._ensure_loaded(config)
                assert self._optimizer is not None
                plan = plan_sft(
                    records,
                    config,
                    attn_implementation=getattr(self._model.config, "_attn_implementation", None),
                    max_length=getattr(self._model.config, "max_position_embeddings", None),
                )
                memory = self._plan_memory(
                    [
                        SequenceSize(len(seq), seq.num_trainable_tokens, record.label)
                        for record in records
                        for seq in record.sequences
                        if seq.num_trainable_tokens
                    ],
                    config,
                )
            except BaseException:
                self._cancel = None
                raise
            plan.max_tokens = memory.max_tokens
            step = self._loaded_step
            try:
                devices = [self.device] if self.device.type == "cuda" else []
                with torch.random.fork_rng(devices=devices):
                    # Dropout is reproducible per step without disturbing anyone else's RNG.
                    torch.manual_seed(config.seed + step + 1)
                    metrics = run_sft(
                        plan,
                        model=self._model,
                        optimizer=self._optimizer,
                        forward=lambda batch: self._logprobs(batch, config),
                        config=config,
                        stats=StepStats(
                            step=step + 1,
                            num_micro_batches=len(plan.updates),
                            on_progress=on_progress,
                            started=started,
                        ),
                    )
                metrics.update(data_metrics or {})
                metrics.update(memory.metrics("sft"))
                metrics["sft/peak_memory_bytes"] = float(peak.peak())
                return self._save(step, step + 1, list(groups), config, metrics, split="sft")
            except BaseException:
                # The weights in memory may be half-updated: reload the latest checkpoint next.
                self._loaded_step = -1
                raise
            finally:
                self._cancel = None
                release_freed_memory(self._host_budget(config))

    def delete_checkpoints(
        self,
        best_checkpoint_metric: str = "train/reward",
        *,
        higher_is_better: bool | None = None,
    ) -> list[int]:
        """Delete every checkpoint but the latest and the best; return the deleted steps.

        "Best" is read from ``history.jsonl``; higher is better unless the metric name
        contains "loss" (override with ``higher_is_better``).

        Example:
            >>> trainer.delete_checkpoints("train/reward")   # needs files: a model folder with checkpoints and history  # doctest: +SKIP
            [1, 2, 4]
        """
        if higher_is_better is None:
            higher_is_better = "loss" not in best_checkpoint_metric
        with self._lock:
            doomed = steps_to_delete(
                self.folder.checkpoint_steps(),
                self.folder.read_history(),
                best_checkpoint_metric,
                higher_is_better=higher_is_better,
            )
            for step in doomed:
                folder = self.folder.checkpoint(step)
                # Rename first so a half-deleted folder never looks like a checkpoint.
                trash = folder.with_name(f".deleting-{folder.name}")
                shutil.rmtree(trash, ignore_errors=True)  # left over by an interrupted delete
                folder.rename(trash)
                shutil.rmtree(trash, ignore_errors=True)
        return doomed

    def unload(self) -> None:
        """Free the model and optimizer (reloaded from the latest checkpoint when needed)."""
        with self._lock:
            let_go = weak_references(self._model, self._optimizer)
            self._model = None
            self._optimizer = None
            self._head = None
            self._loaded_step = -1
            if self._teacher is not None:
                self._teacher[1].close()
                self._teacher = None
            # The model was frozen at its load: a cycle would keep it from the collector.
            collect_frozen_unless_freed(let_go)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()

    # ------------------------------------------------------------------ loading

    def _ensure_loaded(self, config: TrainingSettings, *, check_lora: bool = True) -> None:
        latest = self.latest_step()
        dtype = base_weights_dtype(config, self.device)
        if self._model is None or self._loaded_step != latest or self._base_dtype != dtype:
            # First use, another process trained this model since, or a precision that
            # needs the base weights in another dtype: load from disk.
            adapter = self.folder.checkpoint(latest) if latest > 0 else None
            self._model, self._optimizer, self._param_names = self._load_model_and_optimizer(
                config, adapter
            )
            self._loaded_step = latest
            self._base_dtype = dtype
            self._checkpointing = bool(config.gradient_checkpointing)
            self._head = self._output_head(config)
            freeze_heap()  # the model's modules: out of later full collections
        have, want = adapter_settings(self._model), config.lora_settings()
        if check_lora and have != want:
            raise ValueError(
                f"the adapter of {self.model_dir} has LoRA settings {have}, but the "
                f"{type(config).__name__} asks for {want}; LoRA shape cannot change between "
                "steps of one model"
            )

    def _load_model_and_optimizer(
        self, config: TrainingSettings, adapter: Path | None
    ) -> tuple[Any, torch.optim.Optimizer, list[str]]:
        """The trainable model (from ``adapter`` when given), its AdamW optimizer (with the
        adapter's saved state) and the names of the parameters it optimizes, in order."""
        model = self._load_model(config, adapter)
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        # The learning rate is set before every update (a schedule may change it).
        optimizer = torch.optim.AdamW(
            [p for _, p in named],
            betas=config.adam_betas,
            weight_decay=config.weight_decay,
        )
        param_names = [name for name, _ in named]
        if adapter is not None:
            load_optimizer_state(adapter, optimizer, param_names)
        return model, optimizer, param_names

    def _load_model(self, config: TrainingSettings, adapter: Path | None) -> Any:
        """The base model with its trainable adapter, on this trainer's device."""
        return load_trainable_model(self.base_model_path, config, self.device, adapter_path=adapter)

    # ------------------------------------------------------------------ training

    def _autocast(self, config: TrainingSettings) -> contextlib.AbstractContextManager[Any]:
        dtype = autocast_dtype(config.precision, self.device)
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def _logprobs(
        self, batch: MicroBatch, config: TrainingSettings
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The current model's logprobs (and entropies) of the batch's trained tokens: from
        the last hidden state through the output layer fused with the log-softmax where the
        model allows it (``output_head``), else from the model's logits."""
        targets = batch.target_ids.to(self.device)
        head = self._head
        if head is None:
            return token_logprobs(self._trained_logits(batch, config), targets)
        hidden = self._trained_hidden(batch, config)
        with self._autocast(config):
            return head_logprobs(hidden, head.weight, targets, head.bias)

    def _output_head(self, config: TrainingSettings) -> torch.nn.Linear | None:
        """The loaded model's output layer when it can run fused (checked once per load)."""
        return fusable_output_head(self._model, lambda: self._autocast(config))

    def _model_inputs(self, batch: MicroBatch, config: TrainingSettings) -> dict[str, Any]:
        """The model's inputs for ``batch``, with its packed rows' mask made cheap for SDPA.

        SDPA converts a boolean mask to an additive one in the query's dtype on every call
        and keeps each layer's copy for backward: with 30 layers and a 3.6k-token row that
        was 0.75 GB. Given the additive mask (exactly what it would build: 0 or -inf), all
        layers share one. A row holding a single sequence needs no mask at all (causal).
        """
        device = self.device
        inputs: dict[str, Any] = {
            "input_ids": batch.input_ids.to(device),
            "position_ids": batch.position_ids.to(device),
            "use_cache": False,
        }
        mask = batch.attention_mask
        if mask is not None and mask.dtype == torch.bool and mask.ndim == 4:
            if getattr(self._model.config, "_attn_implementation", None) == "sdpa":
                if batch.input_ids.shape[0] == 1 and len(batch.segments) == 1:
                    return inputs  # one sequence: the block-diagonal mask is the causal one
                dtype = base_weights_dtype(config, device)
                additive = torch.zeros(mask.shape, dtype=dtype, device=device)
                inputs["attention_mask"] = additive.masked_fill_(~mask.to(device), -math.inf)
                return inputs
        if mask is not None:
            inputs["attention_mask"] = mask.to(device)
        return inputs

    def _trained_hidden(self, batch: MicroBatch, config: TrainingSettings) -> torch.Tensor:
        """The last hidden state at the positions predicting each trained token, ``(n, d)``."""
        raise_if_cancelled(self._cancel, self._loaded_step)
        decoder = decoder_of(self._model)
        assert decoder is not None  # the head was found fusable with it
        with self._autocast(config):
            hidden = decoder(**self._model_inputs(batch, config)).last_hidden_state
        device = self.device
        return hidden[batch.predict_mask.to(device)][batch.target_rows.to(device)]

    def _trained_logits(self, batch: MicroBatch, config: TrainingSettings) -> torch.Tensor:
        """The current model's logits predicting each trained token, ``(n, vocab)``."""
        # Every forward of a step comes here: the one place a cancelled step stops.
        raise_if_cancelled(self._cancel, self._loaded_step)
        device = self.device
        with self._autocast(config):
            logits = self._kept_logits(
                self._model, self._model_inputs(batch, config), batch.predict_mask.to(device)
            )
        # One row per trained token (a shared prompt's last position predicts several).
        return logits[batch.target_rows.to(device)]

    @contextlib.contextmanager
    def _no_grad_eval(self) -> Iterator[None]:
        was_training = self._model.training
        self._model.eval()
        try:
            with torch.no_grad():
                yield
        finally:
            self._model.train(was_training)

    def _plan(
        self, groups: list[TrajectoryGroup], config: TrainConfig
    ) -> tuple[PreparedBatch, list[list[TrainingExample]], list[list[MicroBatch]], MemoryPlan]:
        """The step's rollouts, the examples of each optimizer update, their micro-batches
        grouped by optimizer update, and the memory plan that sized them (which raises
        ``SequenceTooLargeError`` here, before any forward, when a sequence cannot fit)."""
        prepared = prepare_batch(
            groups,
            scale_rewards=config.scale_rewards,
            keep_equal_groups=config.trains_equal_groups,
        )
        memory = self._plan_memory(rollout_sequence_sizes(prepared.rollouts), config)
        if config.teacher is not None and prepared.rollouts:
            scored = score_rollouts(
                prepared.rollouts,
                self._teacher_for(config.teacher),
                top_k=config.teacher.top_k,
                vocab_size=self._vocab_size(),
            )
            prepared.metrics.update({f"train/{name}": value for name, value in scored.items()})
        updates = update_examples(
            prepared.rollouts,
            config.optimizer_steps_per_epoch,
            normalization=config.loss_normalization,
            dr_grpo_length=config.dr_grpo_length,
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
        return (
            prepared,
            updates,
            [micro_batches for micro_batches in plan if micro_batches],
            memory,
        )

    # ------------------------------------------------------------------ memory

    def _memory_budget(self, config: TrainingSettings) -> MemoryBudget:
        """The step's budget: ``config.memory_budget``, else ``$ART_CORE_MEMORY_BUDGET``, else
        the process's share of the machine (``art_core.memory``) or, on CUDA, of the device
        memory free at this trainer's first step."""
        explicit = (
            config.memory_budget is not None or os.environ.get(process_memory.ENV, "").strip()
        )
        if self.device.type != "cuda" or explicit:
            return resolve_memory_budget(config.memory_budget)
        if self._device_budget is None:
            free, _total = torch.cuda.mem_get_info(self.device)
            usable = free + torch.cuda.memory_reserved(self.device)
            self._device_budget = MemoryBudget(
                int(usable * DEFAULT_FRACTION),
                f"{DEFAULT_FRACTION:.0%} of the GPU memory free at the first step, "
                f"{usable / 2**30:.2f} GiB",
            )
        return self._device_budget

    def _host_budget(self, config: TrainingSettings) -> int | None:
        """The process's memory budget in bytes (on CUDA the step's budget is the device's;
        the host's is the process's)."""
        if self.device.type == "cuda":
            return process_memory.process_memory_budget().bytes
        return resolve_memory_budget(config.memory_budget).bytes

    def _memory_in_use(self, config: TrainingSettings) -> int:
        """What the process (on CUDA: the device) holds now: the step starts from there.
        On the host, memory freed before the step (a closed backend's model, a GGUF
        conversion's copy) but still resident would count as held and could refuse a
        sequence that fits: it goes back to the system first when the process is past
        ``TRIM_SHARE`` of its budget."""
        if self.device.type == "cuda":
            return int(torch.cuda.memory_allocated(self.device))
        release_freed_memory(self._host_budget(config))
        return resident_bytes()

    def _plan_memory(
        self,
        sequences: Sequence[SequenceSize],
        config: TrainingSettings,
        *,
        gradient_checkpointing: bool | None = None,
    ) -> MemoryPlan:
        """The micro-batch token budget and gradient checkpointing of a step on
        ``sequences`` under its memory budget (``training.memory``), applied to the model;
        ``SequenceTooLargeError`` when one sequence cannot fit. ``gradient_checkpointing``
        overrides the config's (a sharded rank decides as its peers do)."""
        assert self._optimizer is not None
        checkpointing = (
            config.gradient_checkpointing
            if gradient_checkpointing is None
            else gradient_checkpointing
        )
        budget = self._memory_budget(config)
        model_config = self._model.config
        autocast = autocast_dtype(config.precision, self.device) is not None
        costs = {
            on: estimate_step_memory(
                ModelShape.of(model_config),
                activation_bytes=3 if autocast else 4,
                checkpointing=on,
                lora_rank=config.lora_rank,
                lora_modules=len(config.lora_target_modules),
                # A teacher's top-k distillation needs the student's full logits.
                fused_head=self._head is not None and not _needs_full_logits(config),
                eager_attention=getattr(model_config, "_attn_implementation", None) == "eager",
            )
            for on in (False, True)
        }
        params = [p for group in self._optimizer.param_groups for p in group["params"]]
        trainable = sum(p.numel() * p.element_size() for p in params)
        # The gradients, and AdamW's two moments when its first update is still to come.
        fixed = trainable * (1 if self._optimizer.state else 3)
        plan = plan_memory(
            sequences,
            budget=budget,
            max_tokens_per_batch=config.max_tokens_per_batch,
            gradient_checkpointing=checkpointing,
            costs=costs,
            in_use=self._memory_in_use(config),
            fixed=fixed,
        )
        self._set_checkpointing(plan.checkpointing)
        return plan

    def _set_checkpointing(self, on: bool) -> None:
        if on == self._checkpointing:
            return
        if on:
            logger.info("gradient checkpointing on: the step would not fit its memory budget")
            self._model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        else:
            self._model.gradient_checkpointing_disable()
        self._checkpointing = on

    def _teacher_for(self, config: TeacherConfig) -> Teacher:
        """The teacher of ``config`` (kept from the previous step when it is the same)."""
        key = teacher_key(config)
        if self._teacher is None or self._teacher[0] != key:
            if self._teacher is not None:
                self._teacher[1].close()
            self._teacher = (key, make_teacher(config, device=str(self.device)))
        return self._teacher[1]

    def _vocab_size(self) -> int | None:
        """The student's vocabulary size (the rows of its output layer)."""
        embeddings = self._model.get_output_embeddings()
        weight = getattr(embeddings, "weight", None)
        return int(weight.shape[0]) if weight is not None else None

    def _train_step(
        self,
        groups: list[TrajectoryGroup],
        config: TrainConfig,
        on_progress: ProgressCallback | None,
    ) -> TrainResult:
        started = time.perf_counter()
        with DevicePeak(self.device) as peak:
            try:
                return self._train_step_measured(groups, config, on_progress, started, peak)
            finally:
                # What the step freed, back to the system when memory is short.
                release_freed_memory(self._host_budget(config))

    def _train_step_measured(
        self,
        groups: list[TrajectoryGroup],
        config: TrainConfig,
        on_progress: ProgressCallback | None,
        started: float,
        peak: DevicePeak,
    ) -> TrainResult:
        self._ensure_loaded(config)
        step, new_step = self._loaded_step, self._loaded_step + 1
        prepared, updates, plan, memory = self._plan(groups, config)
        if not plan:
            return self._nothing_trained(step, groups, prepared.metrics)
        stats = StepStats(
            step=new_step,
            num_micro_batches=config.num_epochs * sum(len(mbs) for mbs in plan),
            on_progress=on_progress,
            started=started,
        )
        # Dropout is reproducible per step without disturbing anyone else's RNG.
        seen = self._run_updates(plan, config, stats, seed=config.seed + new_step)
        stats.close()
        tokens_run = config.num_epochs * sum(b.num_tokens for mbs in plan for b in mbs)
        num_updates = config.num_epochs * len(plan)
        memory_metrics = memory.metrics("train", [b for mbs in plan for b in mbs])
        del plan  # the micro-batches' tensors: not needed to save
        metrics = {
            **prepared.metrics,
            **stats.metrics(
                updates=num_updates,
                tokens_run=tokens_run,
                learning_rate=config.learning_rate,
            ),
            **memory_metrics,
            "train/peak_memory_bytes": float(peak.peak()),
        }
        signal = signal_records(prepared.rollouts, updates, seen)
        return self._save(step, new_step, groups, config, metrics, signal=signal)

    def _run_updates(
        self, plan: list[list[MicroBatch]], config: TrainConfig, stats: StepStats, *, seed: int
    ) -> SeenLogprobs:
        """The step's optimizer updates: each accumulates the gradients of its micro-batches
        (``_finish_gradients`` combines and clips them) and is applied when they are finite.

        Returns the logprobs of the examples' trained tokens by source, as the first epoch
        saw them (the training signal: see ``_micro_batch_loss``).

        A micro-batch with ``num_sequences == 0`` is padding (a data-parallel rank without
        work of its own still runs the forwards its peers run): it adds nothing and is not
        reported.
        """
        model, optimizer = self._model, self._optimizer
        assert optimizer is not None
        for group in optimizer.param_groups:
            group.update(
                lr=config.learning_rate, betas=config.adam_betas, weight_decay=config.weight_decay
            )
        params = [p for group in optimizer.param_groups for p in group["params"]]
        seen: SeenLogprobs = {}
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            old_logprobs = self._old_logprobs(plan, config)
            model.train()
            for epoch in range(config.num_epochs):
                for update, micro_batches in enumerate(plan):
                    optimizer.zero_grad(set_to_none=True)
                    for position, batch in enumerate(micro_batches):
                        if self.device.type == "cpu":
                            follow_free_cores()  # fewer threads while other processes run
                        key = (update, position)
                        out, old = self._micro_batch_loss(
                            batch, config, old_logprobs.get(key), seen=seen if epoch == 0 else None
                        )
                        if old is not None:
                            # The first update's, from its first forward (no update has run
                            # yet): kept for the later epochs, which must not recompute it.
                            old_logprobs.setdefault(key, old)
                        out.loss.backward()
                        if batch.num_sequences:
                            stats.micro_batch(
                                out.metrics,
                                tokens=batch.num_trainable_tokens,
                                epoch=epoch,
                                update=update,
                            )
                        # The loss's graph: nothing of it may outlive the micro-batch.
                        del out, old
                    norm = self._finish_gradients(params, config)
                    if math.isfinite(norm):
                        optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    stats.optimizer_step(norm, epoch=epoch, update=update)
            model.eval()
        return seen

    def _finish_gradients(self, params: list[torch.nn.Parameter], config: TrainConfig) -> float:
        """Clip the accumulated gradients to ``max_grad_norm``; return their global norm.
        (A data-parallel rank first sums them over the ranks, see ``training.distributed``.)"""
        return float(torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm or math.inf))

    def _nothing_trained(
        self, step: int, groups: list[TrajectoryGroup], metrics: dict[str, float]
    ) -> TrainResult:
        """A step with no trainable token: say why, log it, and write no checkpoint (the
        adapter did not change, so step ``step`` stays the one served)."""
        reason = nothing_trained_reason(metrics)
        logger.warning(
            "train step %d trained on nothing: %s; no checkpoint written, the model stays at "
            "step %d",
            step + 1,
            reason,
            step,
        )
        metrics = {
            **metrics,
            **{f"train/{name}": 0.0 for name in ALWAYS_REPORTED},
            "train/optimizer_steps": 0.0,
            "train/trained": 0.0,
        }
        self._record(step, groups, metrics, checkpoint_step=None)
        latest = self.folder.latest_checkpoint()
        return TrainResult(
            step=step,
            metrics=metrics,
            checkpoint_path=str(latest[1]) if latest else None,
            nothing_trained=reason,
        )

    def _micro_batch_loss(
        self,
        batch: MicroBatch,
        config: TrainConfig,
        old_logprobs: torch.Tensor | None,
        *,
        seen: SeenLogprobs | None = None,
    ) -> tuple[LossOutput, torch.Tensor | None]:
        """Forward one micro-batch and compute its share of the step's loss; also return the
        trainer's logprobs before the update that the loss used (None when it needed none).

        ``old_logprobs``: those logprobs when the policy has moved since (``_old_logprobs``);
        None means it has not, and this forward's (detached) are them. Truncated importance
        sampling and the off-policy mask need them.

        With ``seen``, the trainer's logprobs of its trained tokens go there by example
        source: the policy before any update when truncated importance sampling made it the
        ratio's reference, else this forward's (what the loss's ratio saw).
        """
        device = self.device
        teacher = config.teacher if batch.teacher_logprobs is not None else None
        logprobs, entropy, top_logprobs = self._student_logprobs(
            batch, config, top_k=teacher is not None and teacher.top_k > 0
        )
        tis = config.truncated_importance_sampling is not None
        if seen is not None:
            record_logprobs(
                seen, batch, old_logprobs if tis and old_logprobs is not None else logprobs
            )
        old = None
        if _needs_old_logprobs(config):
            # None: the policy has not moved yet, the one before the update is this forward's.
            old = logprobs.detach() if old_logprobs is None else old_logprobs
        sampler = batch.sampler_logprobs.to(device)
        distill = (
            None
            if teacher is None
            else self._distill_terms(batch, config, logprobs, sampler, top_logprobs)
        )
        return grpo_loss(
            logprobs,
            sampler,
            batch.advantages.to(device),
            batch.weights.to(device),
            loss_type=config.loss,
            epsilon=config.epsilon,
            epsilon_high=config.upper_epsilon,
            old_logprobs=old,
            truncated_importance_sampling=config.truncated_importance_sampling,
            off_policy_mask=config.off_policy_mask,
            ref_logprobs=self._ref_logprobs(batch, config),
            beta=config.beta,
            entropy=entropy,
            importance_sampling_level=config.importance_sampling_level,
            sequence_index=batch.sequence_index.to(device),
            metric_weights=None
            if batch.metric_weights is None
            else batch.metric_weights.to(device),
            policy_loss_weight=0.0 if teacher is not None and not teacher.rl else 1.0,
            distill=distill,
            distill_weight=1.0 if teacher is None else teacher.weight,
            teacher_top_ids=(
                None if batch.teacher_top_ids is None else batch.teacher_top_ids.to(device)
            ),
            target_ids=batch.target_ids.to(device),
        ), old

    def _student_logprobs(
        self, batch: MicroBatch, config: TrainConfig, *, top_k: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The policy's logprobs of the trained tokens and their entropy; with ``top_k``
        (a teacher's top-k distillation) also its logprobs of the teacher's top-k tokens."""
        if not top_k:
            logprobs, entropy = self._logprobs(batch, config)
            return logprobs, entropy, None
        assert batch.teacher_top_ids is not None  # packed with the teacher's scores
        device = self.device
        logits = self._trained_logits(batch, config)
        targets = batch.target_ids.to(device)
        logprobs, entropy = token_logprobs(logits, targets)
        # The student's logprobs of the teacher's top-k tokens, with gradient, without a
        # second softmax over the vocabulary: log_softmax(z)_v = z_v - (z_x - logp(x)).
        log_normaliser = logits.gather(-1, targets[:, None]).float() - logprobs[:, None]
        top_logprobs = logits.gather(-1, batch.teacher_top_ids.to(device)).float() - log_normaliser
        del logits
        return logprobs, entropy, top_logprobs

    def _distill_terms(
        self,
        batch: MicroBatch,
        config: TrainConfig,
        logprobs: torch.Tensor,
        sampler: torch.Tensor,
        top_logprobs: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The on-policy distillation loss and KL per token (``reverse_kl``) against the
        teacher's scores packed in ``batch``."""
        device = self.device
        assert batch.teacher_logprobs is not None and batch.teacher_top_logprobs is not None
        return reverse_kl(
            logprobs,
            batch.teacher_logprobs.to(device),
            student_top_logprobs=top_logprobs,
            teacher_top_logprobs=(
                batch.teacher_top_logprobs.to(device) if top_logprobs is not None else None
            ),
            # Tokens an older policy sampled (a later epoch, a pipelined step), weighted
            # by p_student / p_sampler, capped like CISPO's ratio.
            importance_weight=torch.exp(logprobs - sampler).clamp(
                1 - config.epsilon, 1 + config.upper_epsilon
            ),
        )

    def _old_logprobs(
        self, plan: list[list[MicroBatch]], config: TrainConfig
    ) -> dict[tuple[int, int], torch.Tensor]:
        """The trainer's logprobs before any update, for truncated importance sampling and
        the off-policy mask, by (update, micro-batch): those of the updates after the first.

        The first update's equal its first forward's (detached; ``_run_updates`` keeps them
        for the later epochs), so this extra pass is only paid for the micro-batches that
        first run after the policy moved: those of the second and later updates.
        """
        if not _needs_old_logprobs(config) or len(plan) <= 1:
            return {}
        old: dict[tuple[int, int], torch.Tensor] = {}
        with self._no_grad_eval():
            for index, micro_batches in enumerate(plan[1:], start=1):
                for position, batch in enumerate(micro_batches):
                    old[(index, position)] = self._logprobs(batch, config)[0]
        return old

    def _ref_logprobs(self, batch: MicroBatch, config: TrainConfig) -> torch.Tensor | None:
        """The base model's logprobs (adapter disabled) for the KL penalty, when beta > 0."""
        if config.beta <= 0:
            return None
        with self._no_grad_eval(), self._model.disable_adapter():
            return self._logprobs(batch, config)[0]

    # ------------------------------------------------------------------ saving

    def _save(
        self,
        step: int,
        new_step: int,
        groups: list[TrajectoryGroup],
        config: TrainingSettings,
        metrics: dict[str, float],
        *,
        split: str = "train",
        signal: Sequence[Mapping[str, Any]] = (),
    ) -> TrainResult:
        assert self._optimizer is not None
        metrics = {**metrics, f"{split}/trained": 1.0}
        folder = save_checkpoint(
            self.folder,
            new_step,
            save_adapter=lambda path: self._model.save_pretrained(path, safe_serialization=True),
            optimizer=self._optimizer,
            param_names=self._param_names,
            extra_state={
                "base_model": str(self.base_model_path),
                "config": config.model_dump(mode="json"),
                "metrics": metrics,
            },
        )
        self._loaded_step = new_step
        self._record(step, groups, metrics, checkpoint_step=new_step, split=split, signal=signal)
        return TrainResult(step=new_step, metrics=metrics, checkpoint_path=str(folder))

    def _record(
        self,
        step: int,
        groups: list[TrajectoryGroup],
        metrics: dict[str, float],
        *,
        checkpoint_step: int | None,
        split: str = "train",
        signal: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        """The step's groups under ``trajectories/{split}/{step:04d}.jsonl``, the training
        signal of its rollouts (``signal``, when it trained) under
        ``signals/{split}/{step:04d}.jsonl`` and its metrics in ``history.jsonl`` (all under
        the step that sampled the rollouts, or that an SFT call started from)."""
        # Appended: a step that trained nothing and the next one both sampled with step ``step``.
        self.folder.append_trajectories(split, step, (g.model_dump_json() for g in groups))
        if signal:
            self.folder.append_training_signal(split, step, signal)
        self.folder.append_history(
            {
                "step": step,
                "split": split,
                "time": time.time(),
                "checkpoint_step": checkpoint_step,
                # NaN/inf (a diverged step) become null: history.jsonl stays strict JSON.
                **{k: (v if math.isfinite(v) else None) for k, v in metrics.items()},
            }
        )
