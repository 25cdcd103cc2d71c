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

from dataclasses import dataclass
from typing import Any, Literal

import torch


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


# Rows per chunk are chosen so one fp32 chunk holds at most this many values (128 MB).
_CHUNK_ELEMENTS = 1 << 25
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
    def forward(  # type: ignore[override]
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
    def backward(  # type: ignore[override]
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


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(policy || reference), per token: unbiased and >= 0.

    ``exp(ref - logp) - (ref - logp) - 1``, evaluated on tokens sampled from the policy.

    Example:
        >>> k3_kl(torch.tensor([-1.0]), torch.tensor([-1.0])).item()
        0.0
    """
    log_ratio = ref_logprobs - logprobs
    return torch.exp(log_ratio) - log_ratio - 1


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
    ref_logprobs: torch.Tensor | None = None,
    beta: float = 0.0,
    entropy: torch.Tensor | None = None,
) -> LossOutput:
    """The clipped GRPO objective (PPO or CISPO), optionally with TIS and a k3 KL penalty.

    Per token, with ``r = exp(logp - logp_old)`` and ``A`` the advantage:

    - ``ppo``:   ``-min(r * A, clip(r, 1 - eps, 1 + eps_high) * A)``
    - ``cispo``: ``-sg(clip(r, 1 - eps, 1 + eps_high)) * A * logp`` (``sg`` = stop-gradient;
      unlike PPO, clipped tokens still get a gradient, only its size is capped)

    ``logp_old`` is the sampler's logprob, unless ``old_logprobs`` (the trainer's own logprobs
    before the update) is given: then, with ``truncated_importance_sampling = C``, each token's
    policy loss is multiplied by ``sg(min(exp(logp_old - logp_sampler), C))`` to correct for
    the sampler and trainer computing slightly different probabilities.
    With ``beta > 0`` and ``ref_logprobs`` (adapter disabled), ``beta * k3`` is added.

    Example:
        >>> out = grpo_loss(torch.tensor([-1.0]), torch.tensor([-1.0]),
        ...                 advantages=torch.tensor([2.0]), weights=torch.tensor([0.5]))
        >>> out.loss.item()   # -(ratio 1 * advantage 2) * weight 0.5
        -1.0
    """
    n = logprobs.shape[0]
    for name, tensor in (
        ("sampler_logprobs", sampler_logprobs),
        ("advantages", advantages),
        ("weights", weights),
        ("old_logprobs", old_logprobs),
        ("ref_logprobs", ref_logprobs),
    ):
        if tensor is not None and tensor.shape != (n,):
            raise ValueError(
                f"{name} must have shape ({n},) like logprobs, got {tuple(tensor.shape)}"
            )
    if beta > 0 and ref_logprobs is None:
        raise ValueError("beta > 0 needs ref_logprobs (the base model's logprobs)")
    if truncated_importance_sampling is not None and old_logprobs is None:
        raise ValueError("truncated importance sampling needs the trainer's old_logprobs")
    low = 1.0 - epsilon
    high = 1.0 + (epsilon if epsilon_high is None else epsilon_high)

    reference = sampler_logprobs if old_logprobs is None else old_logprobs
    ratio = torch.exp(logprobs - reference)
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

    if truncated_importance_sampling is not None:
        assert old_logprobs is not None  # checked above
        tis_weight = torch.exp(old_logprobs - sampler_logprobs).clamp(
            max=truncated_importance_sampling
        )
        policy_loss = policy_loss * tis_weight.detach()

    per_token = policy_loss
    metrics: dict[str, float] = {}
    if ref_logprobs is not None:
        kl = k3_kl(logprobs, ref_logprobs)
        if beta > 0:
            per_token = per_token + beta * kl
        metrics["kl"] = float((weights * kl.detach()).sum())

    loss = (weights * per_token).sum()
    with torch.no_grad():
        metrics["loss"] = float(loss)
        metrics["policy_loss"] = float((weights * policy_loss).sum())
        metrics["clip_fraction"] = float((weights * is_clipped.float()).sum())
        metrics["ratio"] = float((weights * ratio).sum())
        metrics["logprob_mismatch"] = float((weights * (logprobs - sampler_logprobs).abs()).sum())
        if entropy is not None:
            metrics["entropy"] = float((weights * entropy).sum())
    return LossOutput(loss=loss, metrics=metrics)
