"""A training step's memory: what a micro-batch costs, how many tokens fit the budget, and the
error when one sequence alone cannot fit.

Measured on this repository's CPU trainer (bf16 autocast, LoRA r8 on every linear layer, one
packed row of 3.6k tokens; ``benchmarks/training_memory.py``, the tensors autograd saved
counted with ``saved_tensors_hooks``): what a step holds beyond the model is the activations
kept for backward, 0.94 MB per token for SmolLM2-135M (30 layers, hidden 576, MLP 1536), about
1.8 MB of resident memory for Qwen2.5-0.5B (24 layers, hidden 896, MLP 4864); with gradient checkpointing each
layer keeps only its input (0.05 MB per token for SmolLM2) and one layer's activations exist
at a time, though the allocator keeps several layers' worth resident. Two costs that grew with
the micro-batch are gone: the vocabulary-sized logits of the trained tokens (0.6 MB per token
and copy with Qwen's 152k vocabulary; the output layer and the log-softmax now run fused a
chunk at a time, ``loss.head_logprobs``) and SDPA's per-layer copy of a packed row's mask
(0.75 GB for SmolLM2 at 3.6k tokens; one additive mask now, ``Trainer._model_inputs``).

So the micro-batch's token budget is derived from the memory budget (``art_core.memory``):
as many tokens as fit ``budget - in use - fixed``, capped by ``max_tokens_per_batch``.
``estimate_step_memory`` gives the per-token costs from the model's config; every figure is an
estimate, its constants chosen to stay above what was measured (by 15-20% on those runs).

Example:
    >>> shape = ModelShape(hidden=576, layers=30, intermediate=1536, heads=9, kv_width=192,
    ...                    vocab=49152)
    >>> costs = estimate_step_memory(shape, activation_bytes=4, checkpointing=False,
    ...                              lora_rank=8, lora_modules=7, fused_head=True)
    >>> 0.8 < costs.per_token / 2**20 < 2.0
    True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from art_core.memory import MemoryBudget, PeakMemory

if TYPE_CHECKING:
    import torch

    from art_core.training.batch import Rollout

# How the estimate's activation count per layer, in values of the hidden width h, the
# key/value width kv and the MLP width i, is made (Llama/Qwen/Mistral decoders in
# transformers, LoRA on the linear layers): the two RMSNorms keep their input, the inverse
# RMS and the product (~3h each); q, k, v, their rotary copies and the attention output
# (~4h + 4kv); o_proj's input; the MLP's gate, up, SiLU(gate) and product (4i); each LoRA
# module its rank-r intermediate. Measured against it: SmolLM2 and Qwen2.5 fp32 kept 65-85%
# of this count, so it errs on the safe side.
_HIDDEN_PER_LAYER = 12
_KV_PER_LAYER = 4
_MLP_PER_LAYER = 4
# With gradient checkpointing: every layer keeps its input (and gets its gradient); the rest
# is transient, one layer's activations at a time, with their gradients in backward, but the
# allocator keeps much of what it freed resident, and how much varies from run to run: the
# same Qwen2.5-0.5B step measured 1.8 and 2.6 GB above the model, 6-8 layers' worth of
# activations for its 3.3k-token micro-batches where the saved inputs are 0.14 GB.
_RECOMPUTED_LAYERS = 8
# Transients beyond what the per-token figures count (the output layer's chunks, the
# allocator's slack): a constant, plus a share of the budget.
FIXED_SLACK = 192 * 2**20
BUDGET_SLACK = 0.05


class SequenceTooLargeError(MemoryError):
    """One sequence alone needs more memory than the step's budget: raised before any
    forward pass, so no checkpoint or record is written and the latest step stays.

    ``tokens``, ``estimated_bytes`` and ``budget_bytes`` say how far it is from fitting.
    """

    def __init__(
        self, message: str, *, tokens: int, estimated_bytes: int, budget_bytes: int
    ) -> None:
        super().__init__(message)
        self.tokens = tokens
        self.estimated_bytes = estimated_bytes
        self.budget_bytes = budget_bytes


@dataclass(frozen=True)
class ModelShape:
    """What a decoder's activation memory depends on, from its config.

    ``intermediate`` is the MLP width one token runs through (for a mixture of experts, the
    expert width times the experts per token, plus any shared expert).

    Example:
        >>> from types import SimpleNamespace
        >>> cfg = SimpleNamespace(hidden_size=64, num_hidden_layers=2, intermediate_size=128,
        ...                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        ...                       vocab_size=695)
        >>> ModelShape.of(cfg).kv_width
        32
    """

    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_width: int
    vocab: int

    @classmethod
    def of(cls, config: Any) -> ModelShape:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        hidden = int(text.hidden_size)
        heads = int(getattr(text, "num_attention_heads", None) or max(1, hidden // 64))
        head_dim = int(getattr(text, "head_dim", None) or hidden // heads)
        kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
        intermediate = int(getattr(text, "intermediate_size", None) or 4 * hidden)
        experts = getattr(text, "num_experts_per_tok", None) or getattr(
            text, "experts_per_token", None
        )
        if experts:
            width = getattr(text, "moe_intermediate_size", None) or intermediate
            shared = getattr(text, "shared_expert_intermediate_size", None) or 0
            intermediate = int(width) * int(experts) + int(shared)
        return cls(
            hidden=hidden,
            layers=int(text.num_hidden_layers),
            intermediate=intermediate,
            heads=heads,
            kv_width=kv_heads * head_dim,
            vocab=int(text.vocab_size),
        )


@dataclass(frozen=True)
class TokenCosts:
    """The estimated bytes a micro-batch adds to a step: ``per_token`` for each token it runs,
    ``per_trained_token`` for each token it trains (vocabulary-sized work), ``per_row_square``
    per squared row length (attention masks and scores) and ``constant``.

    Example:
        >>> TokenCosts(per_token=1000.0, per_trained_token=0.0, per_row_square=1.0,
        ...            constant=0).bytes_for(tokens=100, trained=10, row_length=100)
        110000
    """

    per_token: float
    per_trained_token: float
    per_row_square: float
    constant: int
    # The output layer's kept softmax (``loss._KEEP_ELEMENTS`` values at most), per trained
    # token and at most ``kept_cap`` bytes.
    kept_per_trained_token: float = 0.0
    kept_cap: int = 0

    def bytes_for(self, *, tokens: int, trained: int, row_length: int) -> int:
        """The estimated bytes of one forward and backward of such a micro-batch."""
        kept = min(self.kept_per_trained_token * trained, self.kept_cap)
        return int(
            self.constant
            + self.per_token * tokens
            + self.per_trained_token * trained
            + kept
            + self.per_row_square * row_length**2
        )

    def max_tokens(self, room: int) -> int:
        """The most tokens one micro-batch may run within ``room`` bytes, every token trained
        (the worst case) and packed in one row; 0 when not even one fits.

        Example:
            >>> TokenCosts(per_token=1000.0, per_trained_token=0.0, per_row_square=0.0,
            ...            constant=0).max_tokens(10**6)
            1000
        """
        low, high = 0, 1 << 30  # bytes_for grows with the tokens: the largest that fits
        while low < high:
            middle = (low + high + 1) // 2
            if self.bytes_for(tokens=middle, trained=middle, row_length=middle) <= room:
                low = middle
            else:
                high = middle - 1
        return low


def estimate_step_memory(
    shape: ModelShape,
    *,
    activation_bytes: int,
    checkpointing: bool,
    lora_rank: int,
    lora_modules: int,
    fused_head: bool,
    eager_attention: bool = False,
) -> TokenCosts:
    """The per-token costs of a forward and backward of ``shape`` (see ``TokenCosts``).

    ``activation_bytes`` is the size of one activation value (4 in fp32; under bf16 autocast
    the matmuls' outputs take 2 but norms and LoRA paths stay fp32: give 3). ``fused_head``:
    the output layer runs fused with the log-softmax (``loss.head_logprobs``), so only its
    kept softmax grows with the trained tokens (up to 256 MB); otherwise the logits of every
    trained token and their gradient exist whole. ``eager_attention``: the attention
    implementation materialises the ``(heads, L, L)`` scores (``"eager"``), which SDPA and
    flash attention do not.

    Example:
        >>> shape = ModelShape(hidden=896, layers=24, intermediate=4864, heads=14,
        ...                    kv_width=128, vocab=151936)
        >>> full = estimate_step_memory(shape, activation_bytes=4, checkpointing=False,
        ...                             lora_rank=8, lora_modules=7, fused_head=True)
        >>> lean = estimate_step_memory(shape, activation_bytes=4, checkpointing=True,
        ...                             lora_rank=8, lora_modules=7, fused_head=True)
        >>> full.per_token > 2 * lean.per_token
        True
    """
    h, kv, i = shape.hidden, shape.kv_width, shape.intermediate
    per_layer = (
        _HIDDEN_PER_LAYER * h
        + _KV_PER_LAYER * kv
        + _MLP_PER_LAYER * i
        + 2 * lora_rank * lora_modules
    ) * activation_bytes
    per_token = shape.layers * per_layer
    if checkpointing:
        kept_inputs = shape.layers * h * activation_bytes * 2
        per_token = min(per_token, kept_inputs + _RECOMPUTED_LAYERS * per_layer)
    # The embedding output, the final norm and the kept hidden states.
    per_token += 4 * h * 4
    vocab = shape.vocab
    if fused_head:
        per_trained, kept_cap = 2 * h * 4.0, _KEEP_ELEMENTS * 4
    else:
        # The logits (autocast dtype), their gradient, and the fp32 chunks around them.
        per_trained, kept_cap = vocab * (2 * activation_bytes + 4.0), _KEEP_ELEMENTS * 4
    layers_with_scores = (1 if checkpointing else shape.layers) if eager_attention else 0
    # A packed row's 4-D boolean mask (and one float copy of it), plus eager scores and
    # probabilities kept for backward.
    per_row_square = 1 + 4 + layers_with_scores * shape.heads * 2 * activation_bytes
    return TokenCosts(
        per_token=float(per_token),
        per_trained_token=per_trained,
        per_row_square=float(per_row_square),
        constant=FIXED_SLACK,
        kept_per_trained_token=vocab * 4.0,
        kept_cap=kept_cap,
    )


# Mirrors ``loss._KEEP_ELEMENTS`` (a softmax up to this many values is kept for backward).
_KEEP_ELEMENTS = 1 << 26


@dataclass(frozen=True)
class MemoryPlan:
    """What a step's budget decided: the micro-batch token budget, whether gradient
    checkpointing is on, and the figures behind them (for the step's metrics).

    ``max_tokens`` is ``max_tokens_per_batch`` when the budget is off.
    """

    budget: MemoryBudget
    max_tokens: int
    checkpointing: bool
    in_use: int = 0
    fixed: int = 0
    costs: TokenCosts | None = None

    def estimated_peak(self, micro_batches: Sequence[Any]) -> int | None:
        """The estimated peak of a step on ``micro_batches`` (``packing.MicroBatch``): what
        was held before it, plus its largest micro-batch's forward and backward."""
        if self.costs is None:
            return None
        costs = self.costs
        largest = max(
            (
                costs.bytes_for(
                    tokens=batch.num_tokens,
                    trained=batch.num_trainable_tokens,
                    row_length=int(batch.input_ids.shape[-1]),
                )
                for batch in micro_batches
            ),
            default=0,
        )
        return self.in_use + self.fixed + largest

    def metrics(self, prefix: str, micro_batches: Sequence[Any] = ()) -> dict[str, float]:
        """The plan as ``{prefix}/memory_budget_bytes`` (0 when off), ``{prefix}/micro_batch_
        token_budget``, ``{prefix}/gradient_checkpointing`` and, with the step's
        ``micro_batches``, ``{prefix}/estimated_peak_memory_bytes``.

        Example:
            >>> MemoryPlan(MemoryBudget(None, "off"), 4096, False).metrics("train")
            {'train/memory_budget_bytes': 0.0, 'train/micro_batch_token_budget': 4096.0, 'train/gradient_checkpointing': 0.0}
        """
        metrics = {
            f"{prefix}/memory_budget_bytes": float(self.budget.bytes or 0),
            f"{prefix}/micro_batch_token_budget": float(self.max_tokens),
            f"{prefix}/gradient_checkpointing": float(self.checkpointing),
        }
        estimate = self.estimated_peak(micro_batches) if micro_batches else None
        if estimate is not None:
            metrics[f"{prefix}/estimated_peak_memory_bytes"] = float(estimate)
        return metrics


@dataclass(frozen=True)
class SequenceSize:
    """One sequence a step trains on: its tokens, trained tokens and a label for messages."""

    tokens: int
    trained: int
    label: str


def rollout_sequence_sizes(rollouts: Sequence[Rollout]) -> list[SequenceSize]:
    """The sizes of the sequences a step trains on (those with a trained token), labelled by
    rollout for ``SequenceTooLargeError``'s message.

    Example:
        >>> from art_core.training.batch import Rollout
        >>> from art_core.training.sequences import TokenSequence
        >>> seq = TokenSequence([1, 2, 3], [False, True, True], [0.0, -1.0, -1.0])
        >>> rollout_sequence_sizes([Rollout([seq], 1.0, trajectory_id="t1")])[0].label
        'rollout 0 (trajectory t1), sequence 0'
    """
    return [
        SequenceSize(
            len(seq),
            seq.num_trainable_tokens,
            f"rollout {index} (trajectory {rollout.trajectory_id or '?'}), sequence {position}",
        )
        for index, rollout in enumerate(rollouts)
        for position, seq in enumerate(rollout.sequences)
        if seq.num_trainable_tokens
    ]


class DevicePeak:
    """A span's peak memory on the trainer's device: the process's resident memory on the
    CPU (``art_core.memory.PeakMemory``), ``torch.cuda.max_memory_allocated`` on CUDA.

    Example:
        >>> import torch
        >>> with DevicePeak(torch.device("cpu")) as peak:
        ...     block = bytearray(16 * 2**20)
        ...     peak.peak() >= 16 * 2**20
        True
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._host = PeakMemory()

    def start(self) -> DevicePeak:
        if self.device.type == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self._host.start()
        return self

    def peak(self) -> int:
        if self.device.type == "cuda":
            import torch

            return int(torch.cuda.max_memory_allocated(self.device))
        return self._host.peak()

    def stop(self) -> int:
        if self.device.type == "cuda":
            return self.peak()
        return self._host.stop()

    def __enter__(self) -> DevicePeak:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def _gib(value: float) -> str:
    return f"{value / 2**30:.2f} GiB"


def plan_memory(
    sequences: Sequence[SequenceSize],
    *,
    budget: MemoryBudget,
    max_tokens_per_batch: int,
    gradient_checkpointing: bool | None,
    costs: dict[bool, TokenCosts],
    in_use: int,
    fixed: int,
) -> MemoryPlan:
    """The micro-batch token budget and gradient checkpointing of a step under ``budget``.

    ``costs[c]`` are the token costs with checkpointing ``c``; ``in_use`` what the process
    (or device) holds before the step, ``fixed`` what the step adds whatever the batch
    (gradients, optimizer state). ``gradient_checkpointing`` None turns it on only when the
    longest sequence would not fit without it. Raises ``SequenceTooLargeError`` when one
    sequence alone cannot fit, naming its size, the estimate, the budget and what to change.

    Example:
        >>> costs = {c: TokenCosts(per_token=1e6 / (1 + 4 * c), per_trained_token=0.0,
        ...                        per_row_square=0.0, constant=0) for c in (False, True)}
        >>> plan = plan_memory([SequenceSize(3000, 500, "rollout 0")],
        ...                    budget=MemoryBudget(2 * 10**9, "x"), max_tokens_per_batch=4096,
        ...                    gradient_checkpointing=None, costs=costs, in_use=0, fixed=0)
        >>> plan.checkpointing, plan.max_tokens
        (True, 4096)
    """
    if budget.bytes is None:
        return MemoryPlan(budget, max_tokens_per_batch, bool(gradient_checkpointing))
    room = int(budget.bytes * (1 - BUDGET_SLACK)) - in_use - fixed

    def need(sequence: SequenceSize, checkpointing: bool) -> int:
        return costs[checkpointing].bytes_for(
            tokens=sequence.tokens, trained=sequence.trained, row_length=sequence.tokens
        )

    longest = max(sequences, key=lambda s: need(s, False), default=None)
    checkpointing = bool(gradient_checkpointing)
    if gradient_checkpointing is None and longest is not None:
        checkpointing = need(longest, False) > room
    if longest is not None:
        longest = max(sequences, key=lambda s: need(s, checkpointing))
        needed = need(longest, checkpointing)
        if needed > room:
            raise SequenceTooLargeError(
                _too_large_message(longest, needed, budget, in_use + fixed, checkpointing),
                tokens=longest.tokens,
                estimated_bytes=needed + in_use + fixed,
                budget_bytes=budget.bytes,
            )
    fits = costs[checkpointing].max_tokens(room)
    return MemoryPlan(
        budget=budget,
        max_tokens=max(1, min(max_tokens_per_batch, fits)),
        checkpointing=checkpointing,
        in_use=in_use,
        fixed=fixed,
        costs=costs[checkpointing],
    )


def _too_large_message(
    sequence: SequenceSize, needed: int, budget: MemoryBudget, held: int, checkpointing: bool
) -> str:
    assert budget.bytes is not None
    remedies = []
    if not checkpointing:
        remedies.append("turn on gradient checkpointing (gradient_checkpointing=True or None)")
    remedies += [
        "raise the memory budget (TrainConfig.memory_budget or ART_CORE_MEMORY_BUDGET, e.g. "
        f'"{math.ceil((needed + held) / 2**30 / (1 - BUDGET_SLACK))}GiB")',
        "or make rollouts shorter (fewer turns, a lower max_tokens per call, shorter tool results)",
    ]
    return (
        f"{sequence.label}: a sequence of {sequence.tokens} tokens ({sequence.trained} trained) "
        f"needs an estimated {_gib(needed)} for its forward and backward"
        f"{' with' if checkpointing else ' without'} gradient checkpointing, on top of the "
        f"{_gib(held)} the process holds (model, optimizer), but the memory budget is "
        f"{budget.describe()}; one sequence cannot be split across micro-batches. Nothing "
        f"was trained or written. To fit it: {', '.join(remedies)}"
    )
