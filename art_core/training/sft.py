"""Supervised fine-tuning on the GRPO adapter: cross-entropy on the trained tokens of records.

A record is one demonstration (a trajectory, a chat record) already turned into token
sequences with a loss mask: recorded calls keep the ids the model sampled, exactly as GRPO
assembles them, and chat data is rendered with the model's template (``art_core.sft``). Here
records only meet the optimizer:

- the records are shuffled per epoch (seeded) and cut into batches of ``batch_size``; each
  batch is one optimizer step, whose loss is the mean negative log-likelihood of its trained
  tokens (every trained token of the batch weighs the same, as in TRL and transformers);
- the learning rate of each step comes from the config's list, or from its schedule
  (linear warmup, then constant / linear / cosine decay to 0 over the call's steps);
- micro-batches reuse GRPO's packing (a prompt shared by records of a batch runs once) and
  are built right before their step, so memory does not grow with the data.

Example:
    >>> seq = TokenSequence([5, 6, 7], [False, True, True], [0.0, 0.0, 0.0])
    >>> plan = plan_sft([SFTRecord("r0", [seq])] * 3, SFTConfig(batch_size=2, epochs=2))
    >>> [len(update.records) for update in plan.updates]
    [2, 1, 2, 1]
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from art_core.epochs import epoch_order
from art_core.training.config import SFTConfig
from art_core.training.loss import LossOutput
from art_core.training.packing import MicroBatch, TrainingExample, make_micro_batches
from art_core.training.sequences import TokenSequence
from art_core.training.step_stats import StepStats

# StepStats reports these GRPO-only numbers with every step; an SFT step has none of them.
_GRPO_ONLY = ("policy_loss", "clip_fraction", "logprob_mismatch")

Forward = Callable[[MicroBatch], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class SFTRecord:
    """One demonstration as token sequences; ``label`` names it in errors (e.g. its file line).

    Example:
        >>> SFTRecord("data[0]", [TokenSequence([1, 2], [False, True], [0.0, 0.0])]).num_trainable_tokens
        1
    """

    label: str
    sequences: list[TokenSequence]

    @property
    def num_trainable_tokens(self) -> int:
        return sum(sequence.num_trainable_tokens for sequence in self.sequences)


@dataclass
class SFTUpdate:
    """One optimizer step: which records (indices), in which epoch, at which learning rate."""

    epoch: int
    learning_rate: float
    records: list[int]


@dataclass
class SFTPlan:
    """The optimizer steps of one SFT call and the micro-batch settings to build them with."""

    records: list[SFTRecord]
    updates: list[SFTUpdate]
    max_tokens: int
    packing: bool
    share_prefixes: bool
    attn_implementation: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    def micro_batches(self, update: SFTUpdate) -> list[MicroBatch]:
        """The micro-batches of ``update``; token weights make the step a token mean."""
        chosen = [self.records[index] for index in update.records]
        weight = 1.0 / sum(record.num_trainable_tokens for record in chosen)
        examples = [
            TrainingExample(sequence, 1.0, weight)
            for record in chosen
            for sequence in record.sequences
        ]
        return make_micro_batches(
            examples,
            max_tokens=self.max_tokens,
            packing=self.packing,
            share_prefixes=self.share_prefixes,
            attn_implementation=self.attn_implementation,
        )


def learning_rate_schedule(
    total_steps: int,
    peak_lr: float,
    schedule_type: str = "constant",
    warmup_steps: int = 0,
) -> list[float]:
    """One learning rate per optimizer step: linear warmup to ``peak_lr``, then decay to 0.

    Warmup step ``i`` (0-based) gets ``peak * (i + 1) / warmup_steps``; the decay runs over
    the remaining steps, its first at the peak and its last at 0 (``linear``, ``cosine``), or
    stays at the peak (``constant``).

    Example:
        >>> learning_rate_schedule(4, 1.0, "linear", warmup_steps=1)
        [1.0, 1.0, 0.5, 0.0]
        >>> [round(x, 3) for x in learning_rate_schedule(3, 1.0, "cosine")]
        [1.0, 0.5, 0.0]
    """
    if total_steps < 0 or not 0 <= warmup_steps <= total_steps:
        raise ValueError(
            f"need 0 <= warmup_steps <= total_steps, got {warmup_steps}, {total_steps}"
        )
    rates = [peak_lr * (i + 1) / warmup_steps for i in range(warmup_steps)]
    decay = total_steps - warmup_steps
    for i in range(decay):
        progress = i / (decay - 1) if decay > 1 else 0.0
        if schedule_type == "constant":
            rates.append(peak_lr)
        elif schedule_type == "linear":
            rates.append(peak_lr * (1.0 - progress))
        elif schedule_type == "cosine":
            rates.append(peak_lr * 0.5 * (1.0 + math.cos(math.pi * progress)))
        else:
            raise ValueError(
                f"schedule_type must be constant, linear or cosine, got {schedule_type!r}"
            )
    return rates


def plan_sft(
    records: Sequence[SFTRecord],
    config: SFTConfig,
    *,
    attn_implementation: str | None = None,
    max_length: int | None = None,
) -> SFTPlan:
    """Check every record and lay out the call's optimizer steps (nothing is trained yet).

    Raises ``ValueError`` naming the first record with no trained token or a sequence longer
    than ``max_length`` (the model's context), and for a learning-rate list whose length is
    not the number of steps (``epochs * ceil(records / batch_size)``).

    Example:
        >>> seq = TokenSequence([5, 6], [False, True], [0.0, 0.0])
        >>> plan = plan_sft([SFTRecord("a", [seq])], SFTConfig(learning_rate=[1e-3, 5e-4], epochs=2))
        >>> [u.learning_rate for u in plan.updates]
        [0.001, 0.0005]
    """
    records = list(records)
    if not records:
        raise ValueError("train_sft needs at least one record to train on")
    for record in records:
        if record.num_trainable_tokens == 0:
            raise ValueError(f"{record.label}: no assistant token to train on")
        if max_length is not None:
            longest = max(len(sequence) for sequence in record.sequences)
            if longest > max_length:
                raise ValueError(
                    f"{record.label}: a sequence of {longest} tokens is over the model's context "
                    f"of {max_length} tokens"
                )
    batch_size = config.resolved_batch_size
    per_epoch = math.ceil(len(records) / batch_size)
    total = config.epochs * per_epoch
    if isinstance(config.learning_rate, list):
        if len(config.learning_rate) != total:
            raise ValueError(
                f"learning_rate lists one rate per optimizer step: {len(records)} records in "
                f"batches of {batch_size} for {config.epochs} epochs make {total} steps, but "
                f"{len(config.learning_rate)} rates were given"
            )
        rates = list(config.learning_rate)
    else:
        warmup = min(total, math.ceil(total * config.warmup_ratio))
        rates = learning_rate_schedule(total, config.learning_rate, config.schedule_type, warmup)
    updates: list[SFTUpdate] = []
    for epoch in range(config.epochs):
        order = (
            epoch_order(len(records), config.seed, epoch)
            if config.shuffle
            else list(range(len(records)))
        )
        for start in range(0, len(order), batch_size):
            updates.append(SFTUpdate(epoch, rates[len(updates)], order[start : start + batch_size]))
    return SFTPlan(
        records=records,
        updates=updates,
        max_tokens=config.max_tokens_per_batch,
        packing=config.packing,
        share_prefixes=config.share_prefixes,
        attn_implementation=attn_implementation,
        metrics={
            "sft/num_records": float(len(records)),
            "sft/num_sequences": float(sum(len(r.sequences) for r in records)),
            "sft/num_trainable_tokens": float(sum(r.num_trainable_tokens for r in records)),
            "sft/epochs": float(config.epochs),
            "sft/batch_size": float(batch_size),
        },
    )


def sft_loss(
    logprobs: torch.Tensor, weights: torch.Tensor, entropy: torch.Tensor | None = None
) -> LossOutput:
    """The weighted negative log-likelihood of the trained tokens (a share of the step's mean).

    Example:
        >>> sft_loss(torch.tensor([-1.0, -3.0]), torch.tensor([0.5, 0.5])).loss.item()
        2.0
    """
    if logprobs.shape != weights.shape:
        raise ValueError(
            f"weights must have the shape of logprobs {tuple(logprobs.shape)}, got "
            f"{tuple(weights.shape)}"
        )
    loss = -(weights * logprobs).sum()
    metrics = {"loss": float(loss.detach())}
    if entropy is not None:
        metrics["entropy"] = float((weights * entropy).sum())
    return LossOutput(loss=loss, metrics=metrics)


def run_sft(
    plan: SFTPlan,
    *,
    model: Any,
    optimizer: torch.optim.Optimizer,
    forward: Forward,
    config: SFTConfig,
    stats: StepStats,
) -> dict[str, float]:
    """Run the plan's optimizer steps on ``model``; return the call's ``sft/...`` metrics.

    ``forward(batch)`` gives the model's logprobs (and entropies) of the batch's trained
    tokens (``Trainer._logprobs``). A step whose gradient norm is not finite is skipped
    (counted in ``sft/skipped_updates``), as in GRPO steps.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for group in optimizer.param_groups:
        group.update(betas=config.adam_betas, weight_decay=config.weight_decay)
    epoch_losses: dict[int, list[float]] = {}
    tokens_run = 0
    built = 0
    model.train()
    try:
        for index, update in enumerate(plan.updates):
            micro_batches = plan.micro_batches(update)
            built += len(micro_batches)
            # Exact so far, estimated for the steps still to build.
            remaining = len(plan.updates) - index - 1
            stats.set_total(built + round(remaining * built / (index + 1)))
            for group in optimizer.param_groups:
                group["lr"] = update.learning_rate
            optimizer.zero_grad(set_to_none=True)
            step_loss = 0.0
            for batch in micro_batches:
                logprobs, entropy = forward(batch)
                out = sft_loss(logprobs, batch.weights.to(logprobs.device), entropy)
                out.loss.backward()
                step_loss += out.metrics["loss"]
                tokens_run += batch.num_tokens
                stats.micro_batch(
                    out.metrics,
                    tokens=batch.num_trainable_tokens,
                    epoch=update.epoch,
                    update=index,
                )
            norm = float(torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm or math.inf))
            if math.isfinite(norm):
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            stats.optimizer_step(norm, epoch=update.epoch, update=index)
            epoch_losses.setdefault(update.epoch, []).append(step_loss)
    finally:
        model.eval()
        stats.close()
    rates = [update.learning_rate for update in plan.updates]
    reported = stats.metrics(
        updates=len(plan.updates),
        tokens_run=tokens_run,
        learning_rate=statistics.fmean(rates),
    )
    metrics = {
        f"sft/{name.removeprefix('train/')}": value
        for name, value in reported.items()
        if name.removeprefix("train/") not in _GRPO_ONLY
    }
    first, last = min(epoch_losses), max(epoch_losses)
    metrics.update(plan.metrics)
    metrics["sft/first_epoch_loss"] = statistics.fmean(epoch_losses[first])
    metrics["sft/last_epoch_loss"] = statistics.fmean(epoch_losses[last])
    metrics["sft/final_learning_rate"] = rates[-1]
    return metrics
