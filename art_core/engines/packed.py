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
import threading
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


# Sibling linears that every supported family calls on one input, in one forward: their
# weights are packed as one matrix, so one oneDNN call computes them all (``MergedLinears``).
MERGED_SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def pack_linears(model: nn.Module, *, max_bytes: int = 2 << 30) -> int:
    """Pre-pack the weight of every ``nn.Linear`` of ``model``; returns how many were packed.

    The projections a module computes from one input (``MERGED_SIBLINGS``: an attention's
    queries, keys and values; an MLP's gate and up) are packed as one matrix
    (``MergedLinears``). Call it only where ``packing_supported`` is true; the model must
    only run under ``torch.inference_mode`` or ``no_grad`` afterwards (packed linears have
    no backward).

    Example:
        >>> model = nn.Sequential(nn.Linear(8, 4)).to(torch.bfloat16)
        >>> pack_linears(model) if packing_supported("cpu", torch.bfloat16) else 1
        1
    """
    linears = [m for m in model.modules() if type(m) is nn.Linear]
    total = sum(m.weight.numel() * m.weight.element_size() for m in linears)
    if total > max_bytes:
        return 0
    groups = _sibling_groups(model)
    grouped = {id(linear) for group in groups for linear in group}
    alone = [linear for linear in linears if id(linear) not in grouped]
    try:
        with torch.no_grad():
            packed = [
                torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), _BATCH_HINT)
                for linear in alone
            ]
            merged = [MergedLinears(group) for group in groups]
    except RuntimeError as exc:  # an odd layer oneDNN rejects: serve everything unpacked
        logger.warning("not pre-packing linear weights: %s", exc)
        return 0
    for linear, weight in zip(alone, packed, strict=True):
        linear._art_packed = weight
        restore_forward(linear)
    for group in merged:
        for index, linear in enumerate(group.linears):
            # In the instance's dict, where ``base_linear`` looks (not a module attribute).
            linear.__dict__.update(_art_packed=group.packed, _art_merged=(group, index))
            restore_forward(linear)
    return len(linears)


class MergedLinears:
    """Sibling linears of one module packed as one matrix: the first of them called on an
    input computes all their outputs in one oneDNN call and keeps the others' for them.

    A decode step of a small model pays a fixed cost per linear call (SmolLM2-135M, 2 cores:
    ~15 us for a 576x576 bf16 projection of one row, against ~17 us for the 960x576 of its
    queries, keys and values together); packing q/k/v and gate/up cuts 210 calls to 120.
    Each sibling's output is its slice of the merged one (a view, not a copy). An output is
    handed out once, to a call on the very input it was computed from (held, so its identity
    cannot be reused); any other call computes afresh. Once every sibling has had its output
    the group holds nothing.

    Example:
        >>> q, k = nn.Linear(4, 3), nn.Linear(4, 2)
        >>> group = MergedLinears([q, k], pack=False)
        >>> x = torch.ones(1, 4)
        >>> torch.allclose(group.output(0, x), q(x)), torch.allclose(group.output(1, x), k(x))
        (True, True)
        >>> group.held is None
        True
    """

    def __init__(self, linears: list[nn.Linear], *, pack: bool = True) -> None:
        self.linears = linears
        self.sizes = [linear.out_features for linear in linears]
        weight = torch.cat([linear.weight.detach() for linear in linears])
        biases = [linear.bias for linear in linears]
        self.bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
        self.packed: torch.Tensor | None = (
            torch.ops.mkldnn._reorder_linear_weight(weight, _BATCH_HINT) if pack else None
        )
        self.weight = None if pack else weight
        # (input, each sibling's output still to hand out) between the siblings' calls.
        self.held: tuple[torch.Tensor, list[torch.Tensor | None]] | None = None

    def output(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """Sibling ``index``'s output for ``x``."""
        held = self.held
        if held is not None and held[0] is x and held[1][index] is not None:
            outputs = held[1]
        else:
            outputs = list(self.compute(x).split(self.sizes, dim=-1))
            self.held = (x, outputs)
        out = outputs[index]
        outputs[index] = None
        if all(o is None for o in outputs):
            self.held = None
        assert out is not None
        return out

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        """Every sibling's output for ``x``, side by side in the last dimension (one call)."""
        if self.packed is None:
            return torch.nn.functional.linear(x, self.weight, self.bias)  # type: ignore[arg-type]
        return _packed_linear(x, self.packed, self.bias)


def _sibling_groups(model: nn.Module) -> list[list[nn.Linear]]:
    """``MERGED_SIBLINGS`` found in ``model``: plain linears of one input size and dtype,
    with biases on all or none."""
    groups = []
    for module in model.modules():
        for names in MERGED_SIBLINGS:
            linears = [module.__dict__["_modules"].get(name) for name in names]
            if not all(type(linear) is nn.Linear for linear in linears):
                continue
            first = linears[0]
            if all(
                linear.in_features == first.in_features
                and linear.weight.dtype == first.weight.dtype
                and (linear.bias is None) == (first.bias is None)
                for linear in linears
            ):
                groups.append(linears)
    return groups


def base_linear(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``linear(x)`` with the pre-packed weight when there is one (its siblings' merged
    one, ``MergedLinears``, when it has siblings), else plain ``F.linear``.

    Example:
        >>> layer = nn.Linear(3, 2)
        >>> torch.equal(base_linear(layer, torch.ones(1, 3)), layer(torch.ones(1, 3)))
        True
    """
    merged: Any = linear.__dict__.get("_art_merged")
    if merged is not None:
        return merged[0].output(merged[1], x)
    packed: Any = linear.__dict__.get("_art_packed")
    if packed is None:
        return torch.nn.functional.linear(x, linear.weight, linear.bias)
    return _packed_linear(x, packed, linear.bias)


def _packed_linear(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    if torch.compiler.is_compiling():  # traced by dynamo: an op inductor keeps as a call
        return torch.ops.art_core.packed_linear(x, packed, bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def register_packed_linear_op() -> None:
    """Define ``torch.ops.art_core.packed_linear`` (once per process): ``base_linear`` as a
    custom op, which is what a compiled step (``engines/compiled_step.py``) traces.

    Inductor cannot lower ``mkldnn._linear_pointwise`` on a packed weight; as an opaque
    custom op with a shape-only fake it stays one oneDNN call in the generated code. It is
    defined with ``torch.library.Library`` and one ``CompositeExplicitAutograd`` kernel, not
    ``torch.library.custom_op``: the compiled step calls it for every linear of every step,
    and ``custom_op``'s Python wrapper cost ~5 us a call (SmolLM2-135M: 211 calls, ~1 ms a
    step) against ~1.5 us.

    Example:
        >>> register_packed_linear_op()
        >>> hasattr(torch.ops.art_core, "packed_linear")
        True
    """
    global _library
    with _library_lock:
        if _library is None:
            _library = _define_packed_linear()


def _define_packed_linear() -> torch.library.Library:
    library = torch.library.Library("art_core", "FRAGMENT")
    library.define("packed_linear(Tensor x, Tensor packed, Tensor? bias) -> Tensor")

    def packed_linear(
        x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")

    def packed_linear_shape(
        x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        return x.new_empty((*x.shape[:-1], packed.shape[0]))

    library.impl("packed_linear", packed_linear, "CompositeExplicitAutograd")
    torch.library.register_fake("art_core::packed_linear", packed_linear_shape, lib=library)
    return library


# The library that holds ``art_core::packed_linear`` (its definition lives as long as it).
_library: torch.library.Library | None = None
_library_lock = threading.Lock()


def restore_forward(linear: nn.Linear) -> None:
    """Give ``linear`` its default forward: the packed one if packed, else ``nn.Linear``'s."""
    if "_art_packed" in linear.__dict__:
        linear.forward = functools.partial(base_linear, linear)  # type: ignore[method-assign]
    else:
        linear.__dict__.pop("forward", None)


# What ``pack_linears``, the LoRA slots (``engines/lora.py``) and the compiled step
# (``engines/compiled_step.py``) set in a module's own ``__dict__``.
SERVING_ATTRIBUTES = ("forward", "_art_packed", "_art_merged")


def drop_serving_forwards(model: nn.Module) -> None:
    """Take back what serving set on ``model``'s modules (``SERVING_ATTRIBUTES``: each
    instance's own forward, packed weight and merged group): they compute as plain
    ``nn.Linear`` again.

    Each such forward holds its module (``functools.partial(base_linear, linear)``), and a
    merged group holds its siblings while they hold it: reference cycles, which only a full
    garbage collection frees, and the model's modules are frozen out of those
    (``memory.freeze_heap``). Without them, a closed engine's model is freed by reference
    counting alone when its last holder lets go.

    Example:
        >>> model = nn.Sequential(nn.Linear(8, 4))
        >>> restore_forward(model[0]); model[0]._art_packed = model[0].weight.detach()
        >>> restore_forward(model[0]); "forward" in model[0].__dict__
        True
        >>> drop_serving_forwards(model); "forward" in model[0].__dict__
        False
    """
    for module in model.modules():
        for name in SERVING_ATTRIBUTES:
            module.__dict__.pop(name, None)
