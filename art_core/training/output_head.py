"""The output layer run fused with the log-softmax, where a model allows it.

``loss.head_logprobs`` computes the trained tokens' logprobs from the last hidden state and
the output layer a chunk of rows at a time, so the ``(tokens, vocab)`` logits never exist
whole (0.6 MB per trained token and copy with Qwen2.5's 152k vocabulary). It needs what most
decoders are: a backbone whose output is the last hidden state (final norm applied) and logits
that are exactly ``lm_head(hidden)``. Some families change the logits after the head (Gemma 2
and 3 soft-cap them, Cohere and Granite scale them); a trained output layer (LoRA on
``lm_head``) or a sharded one (FSDP) is not a plain frozen ``Linear``. For those the trainer
keeps the model's own logits (``kept_logits``).

``fusable_output_head`` decides once per loaded model: the structure first, then a probe
(one 8-token forward, no gradient) comparing the model's own logits with the head applied to
its backbone's hidden state.

Example:
    >>> from transformers import AutoModelForCausalLM
    >>> from art_core.embedded import resolve_base_model
    >>> model = AutoModelForCausalLM.from_pretrained(resolve_base_model("tiny-random"))
    >>> head = fusable_output_head(model, lambda: contextlib.nullcontext())
    >>> head is None or isinstance(head, torch.nn.Linear)
    True
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import torch

logger = logging.getLogger("art_core.training")

# Config fields of families that transform the logits after the output layer.
_LOGIT_TRANSFORMS = (
    "final_logit_softcapping",
    "logit_scale",
    "logits_scaling",
    "output_multiplier_scale",
    "lm_head_multiplier",
    "mup_width_multiplier",
)


def _causal_lm(model: Any) -> Any:
    """The transformers model under a peft wrapper (the model itself when not wrapped)."""
    get_base_model = getattr(model, "get_base_model", None)
    return get_base_model() if callable(get_base_model) else model


def decoder_of(model: Any) -> Any | None:
    """The backbone of a causal LM (``model.model`` for Llama/Qwen/Mistral), None when it
    has no separate one."""
    causal = _causal_lm(model)
    backbone = getattr(causal, getattr(causal, "base_model_prefix", "") or "", None)
    if not isinstance(backbone, torch.nn.Module) or backbone is causal:
        return None
    return backbone


def _structural_head(model: Any) -> torch.nn.Linear | None:
    causal = _causal_lm(model)
    config: Any = getattr(causal, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for name in _LOGIT_TRANSFORMS:
        value = getattr(text, name, None)
        if value not in (None, 1, 1.0, False):
            return None
    if decoder_of(model) is None:
        return None
    head = causal.get_output_embeddings() if hasattr(causal, "get_output_embeddings") else None
    if type(head) is not torch.nn.Linear:  # a LoRA-wrapped or custom head: not plain
        return None
    parameters = [head.weight] + ([head.bias] if head.bias is not None else [])
    if any(p.requires_grad or type(p.data) is not torch.Tensor for p in parameters):
        return None  # trained, or a sharded DTensor
    return head


def fusable_output_head(
    model: Any, autocast: Callable[[], contextlib.AbstractContextManager[Any]]
) -> torch.nn.Linear | None:
    """The model's output layer when its logits are exactly ``head(backbone(...))`` (checked
    by a probe, under ``autocast()``), else None.

    Example:
        >>> fusable_output_head(torch.nn.Linear(2, 2), contextlib.nullcontext) is None
        True
    """
    head = _structural_head(model)
    decoder = decoder_of(model)
    if head is None or decoder is None:
        return None
    device = head.weight.device
    ids = (torch.arange(1, 9, device=device) % head.weight.shape[0])[None]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), autocast():
            own = model(input_ids=ids, use_cache=False).logits[0].float()
            hidden = decoder(input_ids=ids, use_cache=False).last_hidden_state[0]
            fused = torch.nn.functional.linear(hidden, head.weight, head.bias).float()
    except Exception as exc:  # any model that cannot run its backbone alone
        logger.info("the output layer runs unfused: its backbone cannot run alone (%s)", exc)
        return None
    finally:
        model.train(was_training)
    tolerance = (1e-2 if hidden.dtype in (torch.bfloat16, torch.float16) else 1e-4) * max(
        1.0, float(own.abs().max())
    )
    if own.shape != fused.shape or float((own - fused).abs().max()) > tolerance:
        logger.info("the output layer runs unfused: the model's logits are not head(hidden)")
        return None
    return head
