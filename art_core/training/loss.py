"""The GRPO loss over the trained tokens of a micro-batch, nanoGPT-style: flat and readable.

All tensors here are 1-D, one entry per trained (completion) token, in the same order:

- ``logprobs``: the policy's logprob of each sampled token, with gradient;
- ``sampler_logprobs``: what the engine recorded when it sampled the token (temperature 1,
  raw logits before any grammar mask), so the ratio is exactly "new policy / sampler";
- ``advantages``: the rollout's group-relative advantage, repeated over its tokens;
- ``weights``: the per-rollout credit (``advantages.rollout_token_weight``); the weights of a
  whole optimizer step sum to 1, so summing ``weights * per_token_loss`` over micro-batches
  and calling backward on each part accumulates exactly the full-batch gradient.

The returned loss is that weighted sum; metrics are weighted sums too, so adding them up over
the micro-batches of a step gives weighted means.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from art_core.training.config import check_off_policy_mask


@dataclass
class LossOutput:
    """A micro-batch's loss (a weighted sum, with gradient) and its weighted-sum metrics."""

    loss: torch.Tensor
    metrics: dict[str, float]


def token_logprobs(
    logits: torch.Tensor, target_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprob of each target id and the entropy of each position's distribution.

    ``logits`` is ``(num_tokens, vocab)``, bf16 under autocast; the math runs in fp32 (the
    ratio compares against fp32 sampler logprobs). The entropy is detached: a metric only.

    Memory: a plain ``log_softmax(logits.float())`` keeps a full fp32 ``(tokens, vocab)``
    copy for backward, and the entropy adds two more; with a 49k vocabulary and 4k tokens
    that is ~2.4 GB per micro-batch. Here the softmax is computed in row chunks; backward
    reuses it when the batch is small (up to 64M logits) and recomputes it chunk by chunk
    when it is larger, so a large batch keeps nothing vocabulary-sized beyond the logits.
    ``head_logprobs`` goes further: from the hidden states, the logits never exist whole.

    Example:
        >>> lp, ent = token_logprobs(torch.zeros(1, 4), torch.tensor([2]))
        >>> round(lp.item(), 4), round(ent.item(), 4)   # uniform over 4: log(1/4), log(4)
        (-1.3863, 1.3863)
    """
    if logits.ndim != 2 or target_ids.ndim != 1 or logits.shape[0] != target_ids.shape[0]:
        raise ValueError(
            f"expected logits (N, vocab) and target ids (N,), got {tuple(logits.shape)} and "
            f"{tuple(target_ids.shape)}"
        )
    chunk = max(1, _CHUNK_ELEMENTS // max(1, logits.shape[-1]))
    selected, entropy = _ChunkedLogprobs.apply(logits, target_ids, chunk)
    return selected, entropy


# Rows per chunk are chosen so one fp32 chunk holds at most this many values (32 MB; a
# chunk's forward makes about four such blocks at once).
_CHUNK_ELEMENTS = 1 << 23
# Up to this many logits, forward's softmax is kept for backward (256 MB in fp32) rather than
# recomputed: faster, and small next to what a batch that size costs anyway.
_KEEP_ELEMENTS = 1 << 26


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)  # bf16/fp16 -> fp32; fp64 stays


class _ChunkedLogprobs(torch.autograd.Function):
    """``log_softmax(logits)[i, target_i]`` and the entropy, chunk by chunk over rows.

    Backward needs the softmax again: kept from forward when it is small (it is already
    computed there, for the entropy), recomputed chunk by chunk when it is large.
    """

    @staticmethod
    def forward(
        ctx: Any, logits: torch.Tensor, target_ids: torch.Tensor, chunk: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = _compute_dtype(logits.dtype)
        n = logits.shape[0]
        keep = logits.numel() <= _KEEP_ELEMENTS
        selected = torch.empty(n, dtype=dtype, device=logits.device)
        entropy = torch.empty(n, dtype=dtype, device=logits.device)
        kept: list[torch.Tensor] = []
        for start in range(0, n, chunk):
            block = logits[start : start + chunk].to(dtype)
            targets = target_ids[start : start + chunk].unsqueeze(-1)
            log_probs = torch.log_softmax(block, dim=-1)
            probs = log_probs.exp()
            selected[start : start + chunk] = log_probs.gather(-1, targets).squeeze(-1)
            # nansum: a masked (-inf) logit gives 0 * -inf = nan, and contributes 0.
            entropy[start : start + chunk] = -(probs * log_probs).nansum(-1)
            if keep:
                kept.append(probs)
        ctx.save_for_backward(logits, target_ids, *kept)
        ctx.chunk = chunk
        ctx.mark_non_differentiable(entropy)
        return selected, entropy

    @staticmethod
    def backward(
        ctx: Any, grad_selected: torch.Tensor, _grad_entropy: torch.Tensor
    ) -> tuple[torch.Tensor, None, None]:
        logits, target_ids, *kept = ctx.saved_tensors
        dtype = _compute_dtype(logits.dtype)
        grad = torch.empty_like(logits)
        for index, start in enumerate(range(0, logits.shape[0], ctx.chunk)):
            stop = start + ctx.chunk
            probs = kept[index] if kept else torch.softmax(logits[start:stop].to(dtype), dim=-1)
            upstream = grad_selected[start:stop].to(dtype).unsqueeze(-1)
            # d logp_target / d logits = onehot(target) - softmax(logits)
            block_grad = probs * -upstream
            block_grad.scatter_add_(-1, target_ids[start:stop].unsqueeze(-1), upstream)
            grad[start:stop] = block_grad.to(grad.dtype)
        return grad, None, None


def head_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target_ids: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``token_logprobs(hidden @ weight.T + bias, target_ids)`` without the ``(N, vocab)``
    logits: the output layer and the softmax run together, a chunk of rows at a time.

    ``hidden`` is ``(N, hidden_size)``, the last hidden state at the positions predicting
    ``target_ids``; ``weight`` the output layer's ``(vocab, hidden_size)``, frozen (no
    gradient is computed for it, nor for ``bias``). Under autocast the head's matmul runs in
    the autocast dtype, as the model's own ``lm_head`` would, in forward and in backward.
    Backward reuses forward's softmax when the batch is small (up to 64M logits), else
    recomputes each chunk's logits (one more head matmul): nothing vocabulary-sized grows
    with the batch. With Qwen2.5's 152k vocabulary the plain path keeps 0.6 MB per trained
    token twice over (the logits, then their gradient).

    Example:
        >>> hidden, weight = torch.randn(3, 8), torch.randn(50, 8)
        >>> targets = torch.tensor([1, 2, 3])
        >>> fused, _ = head_logprobs(hidden, weight, targets)
        >>> plain, _ = token_logprobs(hidden @ weight.T, targets)
        >>> torch.allclose(fused, plain, atol=1e-5)
        True
    """
    if (
        hidden.ndim != 2
        or weight.ndim != 2
        or target_ids.ndim != 1
        or hidden.shape[0] != target_ids.shape[0]
        or hidden.shape[1] != weight.shape[1]
    ):
        raise ValueError(
            f"expected hidden (N, d), weight (vocab, d) and target ids (N,), got "
            f"{tuple(hidden.shape)}, {tuple(weight.shape)} and {tuple(target_ids.shape)}"
        )
    if weight.requires_grad or (bias is not None and bias.requires_grad):
        raise ValueError("head_logprobs computes no gradient for the output layer: freeze it")
    chunk = max(1, _CHUNK_ELEMENTS // max(1, weight.shape[0]))
    selected, entropy = _ChunkedHeadLogprobs.apply(hidden, weight, bias, target_ids, chunk)
    return selected, entropy


def _autocast_dtype_now(device_type: str) -> torch.dtype | None:
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


def _head_logits(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype | None
) -> torch.Tensor:
    """One chunk's logits, in the autocast dtype the forward ran under (None: as stored);
    ``weight`` and ``bias`` already in it (cast once, not once per chunk)."""
    if dtype is not None:
        hidden = hidden.to(dtype)
    return torch.nn.functional.linear(hidden, weight, bias)


def _cast_head(
    weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The head in the matmul's dtype: a no-op when its frozen weights are stored in the
    autocast dtype already (``loading.base_weights_dtype``)."""
    if dtype is None:
        return weight, bias
    return weight.to(dtype), None if bias is None else bias.to(dtype)


class _ChunkedHeadLogprobs(torch.autograd.Function):
    """``head_logprobs``: the output layer, the log-softmax and the entropy, chunk by chunk."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        target_ids: torch.Tensor,
        chunk: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cast = _autocast_dtype_now(hidden.device.type)
        n, vocab = hidden.shape[0], weight.shape[0]
        keep = n * vocab <= _KEEP_ELEMENTS
        dtype = torch.float64 if hidden.dtype == torch.float64 else torch.float32
        selected = torch.empty(n, dtype=dtype, device=hidden.device)
        entropy = torch.empty(n, dtype=dtype, device=hidden.device)
        kept: list[torch.Tensor] = []
        matmul_weight, matmul_bias = _cast_head(weight, bias, cast)
        for start in range(0, n, chunk):
            block = _head_logits(hidden[start : start + chunk], matmul_weight, matmul_bias, cast)
            block = block.to(dtype)
            targets = target_ids[start : start + chunk].unsqueeze(-1)
            log_probs = torch.log_softmax(block, dim=-1)
            del block
            probs = log_probs.exp()
            selected[start : start + chunk] = log_probs.gather(-1, targets).squeeze(-1)
            entropy[start : start + chunk] = -(probs * log_probs).nansum(-1)
            del log_probs
            if keep:
                kept.append(probs)
        ctx.save_for_backward(hidden, weight, bias, target_ids, *kept)
        ctx.chunk, ctx.cast = chunk, cast
        ctx.mark_non_differentiable(entropy)
        return selected, entropy

    @staticmethod
    def backward(
        ctx: Any, grad_selected: torch.Tensor, _grad_entropy: torch.Tensor
    ) -> tuple[torch.Tensor, None, None, None, None]:
        hidden, weight, bias, target_ids, *kept = ctx.saved_tensors
        cast = ctx.cast
        dtype = torch.float64 if hidden.dtype == torch.float64 else torch.float32
        matmul_weight, matmul_bias = _cast_head(weight, bias, cast)
        grad = torch.empty_like(hidden)
        for index, start in enumerate(range(0, hidden.shape[0], ctx.chunk)):
            stop = start + ctx.chunk
            if kept:
                probs = kept[index]
            else:
                logits = _head_logits(hidden[start:stop], matmul_weight, matmul_bias, cast)
                logits = logits.to(dtype)
                probs = torch.softmax(logits, dim=-1)
                del logits
            upstream = grad_selected[start:stop].to(dtype).unsqueeze(-1)
            # d logp_target / d logits = onehot(target) - softmax(logits)
            block_grad = probs * -upstream
            block_grad.scatter_add_(-1, target_ids[start:stop].unsqueeze(-1), upstream)
            # d logits / d hidden = weight, in the dtype the forward's matmul ran in.
            grad[start:stop] = (block_grad.to(matmul_weight.dtype) @ matmul_weight).to(grad.dtype)
            del block_grad, probs
        return grad, None, None, None, None


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(policy || reference), per token: unbiased and >= 0.

    ``exp(ref - logp) - (ref - logp) - 1``, evaluated on tokens sampled from the policy.

    Example:
        >>> k3_kl(torch.tensor([-1.0]), torch.tensor([-1.0])).item()
        0.0
    """
    log_ratio = ref_logprobs - logprobs
    return torch.exp(log_ratio) - log_ratio - 1


def sequence_means(values: torch.Tensor, sequence_index: torch.Tensor) -> torch.Tensor:
    """The mean of ``values`` over each sequence's tokens, repeated on every token (with
    gradient): ``out[i] = mean(values[j] for j with sequence_index[j] == sequence_index[i])``.

    Example:
        >>> sequence_means(torch.tensor([1.0, 3.0, 5.0]), torch.tensor([0, 0, 1])).tolist()
        [2.0, 2.0, 5.0]
    """
    if values.numel() == 0:
        return values
    count = int(sequence_index.max()) + 1
    sums = torch.zeros(count, dtype=values.dtype, device=values.device).index_add(
        0, sequence_index, values
    )
    sizes = torch.bincount(sequence_index, minlength=count).clamp(min=1).to(values.dtype)
    return (sums / sizes)[sequence_index]


def reverse_kl(
    logprobs: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    *,
    student_top_logprobs: torch.Tensor | None = None,
    teacher_top_logprobs: torch.Tensor | None = None,
    importance_weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The on-policy distillation loss per trained token, and the reverse KL it measures.

    Reverse KL(student || teacher) at each position the student sampled, two ways:

    - **sampled token** (no top-k): ``kl = log p_s(x) - log p_t(x)`` for the sampled ``x``
      (an unbiased one-sample estimate of the KL). Its gradient is the score function:
      ``loss = sg(w * kl) * log p_s(x)``, because ``grad KL = E_x~p_s[kl(x) grad log p_s(x)]``
      (``E[grad log p_s] = 0``); ``w`` = ``importance_weight`` (p_s / p_sampler, for tokens
      sampled by an older policy), 1 by default.
    - **top-k** (``student_top_logprobs`` and ``teacher_top_logprobs``, ``(n, k)``: both
      models' logprobs of the teacher's k most likely tokens): the KL between the two
      distributions over k + 1 outcomes, those k tokens and "any other token" (mass
      ``1 - sum``): ``loss = kl = sum_v p_s(v) (log p_s(v) - log p_t(v)) + r_s (log r_s -
      log r_t)``, differentiated directly. The "other" bucket makes mass the student puts
      outside the teacher's top-k cost what it should (renormalising over the k tokens would
      not see it); the KL of this coarser view is never above the full KL, and equals it when
      k covers the vocabulary.

    Example:
        >>> loss, kl = reverse_kl(torch.tensor([-1.0]), torch.tensor([-3.0]))
        >>> kl.item(), loss.item()   # kl = -1 - (-3); loss = sg(kl) * logp
        (2.0, -2.0)
    """
    if (student_top_logprobs is None) != (teacher_top_logprobs is None):
        raise ValueError(
            "top-k reverse KL needs both student_top_logprobs and teacher_top_logprobs"
        )
    if student_top_logprobs is not None and teacher_top_logprobs is not None:
        if student_top_logprobs.shape != teacher_top_logprobs.shape:
            raise ValueError(
                f"student_top_logprobs {tuple(student_top_logprobs.shape)} and "
                f"teacher_top_logprobs {tuple(teacher_top_logprobs.shape)} differ in shape"
            )
        dtype = _compute_dtype(student_top_logprobs.dtype)  # bf16 logits: the math in fp32
        student = student_top_logprobs.to(dtype)
        teacher = teacher_top_logprobs.to(dtype)
        top = (student.exp() * (student - teacher)).sum(-1)
        # The "other tokens" bucket. A teacher's rounded top-k may sum past 1: its rest is
        # floored at a tiny mass; where the student has none left the term is 0.
        student_rest = (1 - student.exp().sum(-1)).clamp(min=0)
        teacher_rest = (1 - teacher.exp().sum(-1)).clamp(min=_REST_FLOOR)
        rest = student_rest * (student_rest.clamp(min=_REST_FLOOR).log() - teacher_rest.log())
        kl = top + rest
        return kl, kl.detach()
    kl = (logprobs - teacher_logprobs).detach()
    weight = 1.0 if importance_weight is None else importance_weight.detach()
    return (weight * kl) * logprobs, kl


# The least probability mass the "other tokens" bucket of a top-k KL is given (its log is
# taken); far below what a model can resolve, so it changes no real KL.
_REST_FLOOR = 1e-12


def grpo_loss(
    logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    *,
    loss_type: Literal["ppo", "cispo"] = "ppo",
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    old_logprobs: torch.Tensor | None = None,
    truncated_importance_sampling: float | None = None,
    off_policy_mask: tuple[float, float] | None = None,
    ref_logprobs: torch.Tensor | None = None,
    beta: float = 0.0,
    entropy: torch.Tensor | None = None,
    importance_sampling_level: Literal["token", "sequence"] = "token",
    sequence_index: torch.Tensor | None = None,
    metric_weights: torch.Tensor | None = None,
    policy_loss_weight: float = 1.0,
    distill: tuple[torch.Tensor, torch.Tensor] | None = None,
    distill_weight: float = 1.0,
    teacher_top_ids: torch.Tensor | None = None,
    target_ids: torch.Tensor | None = None,
) -> LossOutput:
    """The clipped GRPO objective (PPO or CISPO, token or sequence level), optionally with
    TIS, a k3 KL penalty and an on-policy distillation term.

    Per token, with ``A`` the advantage and ``r`` the importance ratio:

    - ``importance_sampling_level="token"``: ``r = exp(logp - logp_old)`` per token (GRPO);
    - ``"sequence"`` (GSPO): ``r = exp(mean over the sequence's trained tokens of (logp -
      logp_old))``, the geometric mean of its token ratios, the same on every token of the
      sequence (``sequence_index`` says which tokens belong together);

    - ``ppo``:   ``-min(r * A, clip(r, 1 - eps, 1 + eps_high) * A)``
    - ``cispo``: ``-sg(clip(r, 1 - eps, 1 + eps_high)) * A * logp`` (``sg`` = stop-gradient;
      unlike PPO, clipped tokens still get a gradient, only its size is capped)

    ``logp_old`` is the sampler's logprob, unless ``truncated_importance_sampling = C`` is set:
    then it is ``old_logprobs`` (the trainer's own logprobs before the update), and each
    token's policy loss is multiplied by ``sg(min(exp(logp_old - logp_sampler), C))`` to
    correct for the sampler and trainer computing slightly different probabilities (at the
    sequence level: the geometric mean of those token ratios over the sequence, capped at
    ``C``).

    ``off_policy_mask = (low, high)`` (masked importance sampling, IcePop): a token whose
    trainer/sampler ratio ``exp(logp_old - logp_sampler)`` (``old_logprobs`` again) lies
    outside ``[low, high]`` gets no policy loss and no policy gradient; kept tokens keep
    exactly the loss they had without the mask (the PPO/CISPO ratio's reference does not
    change). At the sequence level the geometric-mean ratio decides, for the whole sequence.
    With TIS too the mask comes first: kept tokens are weighted by ``min(ratio, C)``, masked
    ones by 0 (``C >= high`` gives IcePop's ``M(k) = k`` on ``[low, high]``, 0 outside). A
    masked token stays in the loss normalisation (its weight is not moved to the others;
    why: the comment where the mask applies); only the policy loss is masked, like TIS.
    With ``beta > 0`` and ``ref_logprobs`` (adapter disabled), ``beta * k3`` is added.
    ``distill`` (``reverse_kl``'s loss and kl per token) adds ``distill_weight * loss``;
    ``policy_loss_weight=0`` leaves the policy loss out (distillation alone).

    The loss is ``sum(weights * per-token loss)`` (``weights``: the loss normalisation, see
    ``advantages.token_weight``); metrics are sums weighted by ``metric_weights`` (the
    per-rollout credit; default ``weights``). With the mask, ``off_policy/masked_share`` is
    the masked tokens' share, weighted like ``clip_fraction``.

    Example:
        >>> out = grpo_loss(torch.tensor([-1.0]), torch.tensor([-1.0]),
        ...                 advantages=torch.tensor([2.0]), weights=torch.tensor([0.5]))
        >>> out.loss.item()   # -(ratio 1 * advantage 2) * weight 0.5
        -1.0
    """
    band = _check_loss_inputs(
        logprobs,
        {
            "sampler_logprobs": sampler_logprobs,
            "advantages": advantages,
            "weights": weights,
            "old_logprobs": old_logprobs,
            "ref_logprobs": ref_logprobs,
            "sequence_index": sequence_index,
            "metric_weights": metric_weights,
        },
        beta=beta,
        truncated_importance_sampling=truncated_importance_sampling,
        off_policy_mask=off_policy_mask,
        importance_sampling_level=importance_sampling_level,
    )
    low = 1.0 - epsilon
    high = 1.0 + (epsilon if epsilon_high is None else epsilon_high)
    sequence_level = importance_sampling_level == "sequence"

    def level(log_ratio: torch.Tensor) -> torch.Tensor:
        assert sequence_index is not None or not sequence_level  # checked above
        return sequence_means(log_ratio, sequence_index) if sequence_level else log_ratio  # type: ignore[arg-type]

    truncated = truncated_importance_sampling is not None
    reference = old_logprobs if truncated and old_logprobs is not None else sampler_logprobs
    keep, ratio = _importance_ratio(
        logprobs - reference, level, band, old_logprobs, sampler_logprobs
    )
    policy_loss, is_clipped = _clipped_objective(
        ratio, advantages, logprobs, loss_type=loss_type, low=low, high=high
    )
    policy_loss = _masked_and_truncated(
        policy_loss, level, keep, truncated_importance_sampling, old_logprobs, sampler_logprobs
    )

    credit = weights if metric_weights is None else metric_weights
    metrics: dict[str, float] = {}
    per_token = _add_kl_and_distill(
        policy_loss * policy_loss_weight,
        credit,
        metrics,
        logprobs=logprobs,
        ref_logprobs=ref_logprobs,
        beta=beta,
        distill=distill,
        distill_weight=distill_weight,
        teacher_top_ids=teacher_top_ids,
        target_ids=target_ids,
    )

    loss = (weights * per_token).sum()
    with torch.no_grad():
        metrics["loss"] = float(loss)
        metrics["policy_loss"] = float((weights * policy_loss).sum())
        metrics["clip_fraction"] = float((credit * is_clipped.float()).sum())
        metrics["ratio"] = float((credit * torch.exp(logprobs - reference)).sum())
        if sequence_level:
            metrics["sequence_ratio"] = float((credit * ratio).sum())
        metrics["logprob_mismatch"] = float((credit * (logprobs - sampler_logprobs).abs()).sum())
        if keep is not None:
            metrics["off_policy/masked_share"] = float((credit * (~keep).float()).sum())
        if entropy is not None:
            metrics["entropy"] = float((credit * entropy).sum())
    return LossOutput(loss=loss, metrics=metrics)


def _check_loss_inputs(
    logprobs: torch.Tensor,
    per_token: dict[str, torch.Tensor | None],
    *,
    beta: float,
    truncated_importance_sampling: float | None,
    off_policy_mask: tuple[float, float] | None,
    importance_sampling_level: str,
) -> tuple[float, float] | None:
    """``grpo_loss``'s argument checks: every per-token tensor has ``logprobs``' shape and
    each option has the inputs it needs. Returns the checked off-policy band (or None)."""
    n = logprobs.shape[0]
    for name, tensor in per_token.items():
        if tensor is not None and tensor.shape != (n,):
            raise ValueError(
                f"{name} must have shape ({n},) like logprobs, got {tuple(tensor.shape)}"
            )
    old_logprobs = per_token["old_logprobs"]
    if beta > 0 and per_token["ref_logprobs"] is None:
        raise ValueError("beta > 0 needs ref_logprobs (the base model's logprobs)")
    if truncated_importance_sampling is not None and old_logprobs is None:
        raise ValueError("truncated importance sampling needs the trainer's old_logprobs")
    band = None if off_policy_mask is None else check_off_policy_mask(off_policy_mask)
    if band is not None:
        if old_logprobs is None:
            raise ValueError("off_policy_mask needs the trainer's old_logprobs")
    if importance_sampling_level not in ("token", "sequence"):
        raise ValueError(
            f"importance_sampling_level must be 'token' or 'sequence', got "
            f"{importance_sampling_level!r}"
        )
    if importance_sampling_level == "sequence" and per_token["sequence_index"] is None:
        raise ValueError("sequence-level importance sampling needs sequence_index")
    return band


def _importance_ratio(
    log_ratio: torch.Tensor,
    level: Callable[[torch.Tensor], torch.Tensor],
    band: tuple[float, float] | None,
    old_logprobs: torch.Tensor | None,
    sampler_logprobs: torch.Tensor,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The importance ratio (per token or per sequence, by ``level``) and, with an off-policy
    ``band``, the mask of the tokens kept (None without one)."""
    keep = None
    if band is not None:
        assert old_logprobs is not None  # checked above
        # In log space, so that no mismatch overflows the test (and a NaN one is masked).
        mismatch = level(old_logprobs - sampler_logprobs).detach()
        keep = (mismatch >= math.log(band[0])) & (mismatch <= math.log(band[1]))
        # A masked token's ratio is set to 1 before exp: its loss stays finite and its
        # gradient is exactly 0, whatever its mismatch (masking after an exp that overflowed
        # would give 0 * inf = nan in backward). Kept tokens' values are untouched.
        log_ratio = torch.where(keep, log_ratio, torch.zeros_like(log_ratio))
    return keep, torch.exp(level(log_ratio))


def _clipped_objective(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    logprobs: torch.Tensor,
    *,
    loss_type: str,
    low: float,
    high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The PPO or CISPO policy loss per token, and where clipping is active."""
    clipped_ratio = torch.clamp(ratio, low, high)
    if loss_type == "ppo":
        unclipped_objective = ratio * advantages
        clipped_objective = clipped_ratio * advantages
        policy_loss = -torch.minimum(unclipped_objective, clipped_objective)
        # Clipping is active where min() picked the clipped term: no gradient flows there.
        is_clipped = clipped_objective < unclipped_objective
    elif loss_type == "cispo":
        policy_loss = -clipped_ratio.detach() * advantages * logprobs
        is_clipped = (ratio < low) | (ratio > high)
    else:
        raise ValueError(f"loss_type must be 'ppo' or 'cispo', got {loss_type!r}")
    return policy_loss, is_clipped


def _masked_and_truncated(
    policy_loss: torch.Tensor,
    level: Callable[[torch.Tensor], torch.Tensor],
    keep: torch.Tensor | None,
    truncated_importance_sampling: float | None,
    old_logprobs: torch.Tensor | None,
    sampler_logprobs: torch.Tensor,
) -> torch.Tensor:
    """The policy loss with the off-policy mask (``keep``) and TIS weights applied."""
    if keep is not None:
        # Masked tokens get no policy loss. Their ``weights`` are left as they are, so they
        # still count in the loss normalisation (the denominator), as PPO-clipped tokens do:
        # IcePop's objective keeps 1/|y_i| (Ring-1T paper), slime keeps each rollout's
        # precomputed token total and TRL zeroes the ratio without touching completion_mask
        # (verl's rejection sampling does drop them from the denominator). Here the weights
        # are fixed before any forward, since a rollout's tokens and an update's can span
        # micro-batches whose gradients are accumulated one by one: renormalising would need
        # every token's mask before the first backward, one more forward pass even for a
        # one-update step; and a masked token does not make its rollout's others weigh more.
        policy_loss = torch.where(keep, policy_loss, torch.zeros_like(policy_loss))
    if truncated_importance_sampling is not None:
        assert old_logprobs is not None  # checked above
        tis_weight = torch.exp(level(old_logprobs - sampler_logprobs)).clamp(
            max=truncated_importance_sampling
        )
        if keep is not None:
            # Mask first, then truncation: kept tokens weigh min(ratio, C), masked ones 0.
            tis_weight = torch.where(keep, tis_weight, torch.zeros_like(tis_weight))
        policy_loss = policy_loss * tis_weight.detach()
    return policy_loss


def _add_kl_and_distill(
    per_token: torch.Tensor,
    credit: torch.Tensor,
    metrics: dict[str, float],
    *,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    beta: float,
    distill: tuple[torch.Tensor, torch.Tensor] | None,
    distill_weight: float,
    teacher_top_ids: torch.Tensor | None,
    target_ids: torch.Tensor | None,
) -> torch.Tensor:
    """The per-token loss with the k3 KL penalty and the distillation term added; their
    metrics go into ``metrics``."""
    if ref_logprobs is not None:
        kl = k3_kl(logprobs, ref_logprobs)
        if beta > 0:
            per_token = per_token + beta * kl
        metrics["kl"] = float((credit * kl.detach()).sum())
    if distill is not None:
        distill_loss, distill_kl = distill
        per_token = per_token + distill_weight * distill_loss
        metrics["distill/kl"] = float((credit * distill_kl).sum())
        if teacher_top_ids is not None and target_ids is not None and teacher_top_ids.shape[1]:
            agree = (teacher_top_ids[:, 0] == target_ids).float()
            metrics["distill/teacher_agreement"] = float((credit * agree).sum())
    return per_token
