"""A causal LM's logits at chosen positions only, through a boolean ``logits_to_keep``.

transformers >= ~5.2 takes a boolean mask as ``logits_to_keep`` and computes the
vocabulary-sized logits of the kept positions alone (the trainer's and a local teacher's
largest tensor). Older versions index hidden states with it as if it were 1-D positions
(IndexError/RuntimeError), or take no such argument (TypeError); some models ignore it and
return every position. ``KeptLogits`` handles all three, falling back to full logits for good
at the first refusal.

The trainer's and a local teacher's (``distill/``) forward passes share it, so it lives below
both.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

logger = logging.getLogger("art_core.training")


class KeptLogits:
    """Call a model for the logits of the ``keep`` positions, ``(kept, vocab)``, row-major.

    Example:
        >>> kept = KeptLogits("the model")
        >>> logits = kept(model, {"input_ids": ids}, keep=mask)  # fragment: a loaded `model`, its `ids` and a `mask`  # doctest: +SKIP
    """

    def __init__(self, label: str) -> None:
        self.label = label
        self.masked = True  # whether the model takes a boolean logits_to_keep

    def __call__(self, model: Any, inputs: dict[str, Any], keep: torch.Tensor) -> torch.Tensor:
        if self.masked:
            try:
                logits = model(**inputs, logits_to_keep=keep).logits
            except (IndexError, RuntimeError, TypeError) as exc:
                logger.info(
                    "%s refuses a boolean logits_to_keep (%s): full logits", self.label, exc
                )
                self.masked = False
            else:
                # A model that ignored the boolean logits_to_keep returned every position.
                return logits[keep] if logits.ndim == 3 else logits
        return model(**inputs, logits_to_keep=0).logits[keep]
