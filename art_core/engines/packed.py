"""Linear layers with weights pre-packed for oneDNN, for bf16 decoding on CPU.

``F.linear`` in bf16 on CPU hands oneDNN a plain weight matrix, which it re-lays out for its
kernels on every call. A decode step of a few rows is bound by reading the weights, so that
per-call reorder nearly doubles the cost: for SmolLM2-135M's 210 projections at batch 8,
22 ms per step plain vs 15 ms pre-packed (outputs identical). This is what ``torch.compile``
does on CPU with freezing; here it is done eagerly, once, at load time.

The packed copy is extra memory (the plain weights stay: tied embeddings, adapters and peft
read them), so packing is skipped for models whose linear weights exceed ``max_bytes``.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)

# Rows per call the packing is tuned for (decoding batches); any row count still works.
_BATCH_HINT = 32


def packing_supported(device: str, dtype: torch.dtype) -> bool:
    """Whether this torch build and CPU can run pre-packed bf16 linears.

    Example:
        >>> packing_supported("cuda", torch.bfloat16)
        False
    """
    if device != "cpu" or dtype != torch.bfloat16:
        return False
    mkldnn = getattr(torch.ops, "mkldnn", None)
    try:
        return (
            torch.backends.mkldnn.is_available()
            and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
            and hasattr(mkldnn, "_reorder_linear_weight")
            and hasattr(mkldnn, "_linear_pointwise")
        )
    except (AttributeError, RuntimeError):
        return False


def pack_linears(model: nn.Module, *, max_bytes: int = 2 << 30) -> int:
    """Pre-pack the weight of every ``nn.Linear`` of ``model``; returns how many were packed.

    Call it only where ``packing_supported`` is true; the model must only run under
    ``torch.inference_mode`` or ``no_grad`` afterwards (packed linears have no backward).

    Example:
        >>> model = nn.Sequential(nn.Linear(8, 4)).to(torch.bfloat16)
        >>> pack_linears(model) if packing_supported("cpu", torch.bfloat16) else 1
        1
    """
    linears = [m for m in model.modules() if type(m) is nn.Linear]
    total = sum(m.weight.numel() * m.weight.element_size() for m in linears)
    if total > max_bytes:
        return 0
    try:
        with torch.no_grad():
            packed = [
                torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), _BATCH_HINT)
                for linear in linears
            ]
    except RuntimeError as exc:  # an odd layer oneDNN rejects: serve everything unpacked
        logger.warning("not pre-packing linear weights: %s", exc)
        return 0
    for linear, weight in zip(linears, packed, strict=True):
        linear._art_packed = weight
        restore_forward(linear)
    return len(linears)


def base_linear(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``linear(x)`` with the pre-packed weight when there is one, else plain ``F.linear``.

    Example:
        >>> layer = nn.Linear(3, 2)
        >>> torch.equal(base_linear(layer, torch.ones(1, 3)), layer(torch.ones(1, 3)))
        True
    """
    packed: Any = linear.__dict__.get("_art_packed")
    if packed is None:
        return torch.nn.functional.linear(x, linear.weight, linear.bias)
    if torch.compiler.is_compiling():  # traced by dynamo: an op inductor keeps as a call
        return torch.ops.art_core.packed_linear(x, packed, linear.bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed, linear.bias, "none", [], "")


def register_packed_linear_op() -> None:
    """Define ``torch.ops.art_core.packed_linear`` (once per process): ``base_linear`` as a
    custom op, which is what a compiled step (``engines/compiled_step.py``) traces.

    Inductor cannot lower ``mkldnn._linear_pointwise`` on a packed weight; as an opaque
    custom op with a shape-only fake it stays one oneDNN call in the generated code.

    Example:
        >>> register_packed_linear_op()
        >>> hasattr(torch.ops.art_core, "packed_linear")
        True
    """
    global _op_registered
    if _op_registered:
        return

    @torch.library.custom_op("art_core::packed_linear", mutates_args=())
    def packed_linear(
        x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")

    @packed_linear.register_fake
    def _(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return x.new_empty((*x.shape[:-1], packed.shape[0]))

    _op_registered = True


_op_registered = False


def restore_forward(linear: nn.Linear) -> None:
    """Give ``linear`` its default forward: the packed one if packed, else ``nn.Linear``'s."""
    if "_art_packed" in linear.__dict__:
        linear.forward = functools.partial(base_linear, linear)  # type: ignore[method-assign]
    else:
        linear.__dict__.pop("forward", None)
