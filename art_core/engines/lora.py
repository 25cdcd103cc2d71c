"""Serving LoRA adapters with three tensor ops per layer, instead of peft's wrapper stack.

peft's ``LoraLayer.forward`` is built for training: per layer and call it walks the active
adapters, upcasts the input to the adapter's fp32, runs dropout, two linears and a scale, and
casts back. On a CPU decode step (8 rows, 210 adapted layers of a 135M model) that overhead
doubled the step time. Here, for the batch's adapter, each adapted ``nn.Linear`` gets a
forward that computes ``linear(x) + (x @ A.T) @ (scale * B).T`` (the update in fp32); for the
base model the layers are plain ``nn.Linear`` again, with no overhead at all. Weights are
never merged: merging a small update into bf16 weights rounds most of it away, and adapters
must swap per batch.

Only plain LoRA on linear layers is handled (what ``TrainConfig`` trains). Anything else in an
adapter folder (DoRA, embedding/conv LoRA, bias training, ``modules_to_save``, per-module rank
or alpha patterns) raises ``UnsupportedAdapter``, and the engine serves it with peft instead.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from art_core.engines.packed import base_linear, restore_forward


class UnsupportedAdapter(ValueError):
    """An adapter folder this module cannot serve (the engine falls back to peft)."""


def lora_forward(
    linear: nn.Linear, a_t: torch.Tensor, scaled_b_t: torch.Tensor, x: torch.Tensor
) -> torch.Tensor:
    """``linear(x) + x @ A.T @ (scale * B).T``; ``a_t`` is ``A.T``, ``scaled_b_t`` is
    ``(scale * B).T``, both fp32: the update is computed in fp32.

    fp32 whatever the serving dtype: a ``(8 x 576) @ (576 x 8)`` matmul costs ~25 us in bf16
    on CPU (oneDNN's fixed cost per call) and ~4 us in fp32, and fp32 keeps small updates.
    Two plain ``mm`` calls on pre-transposed factors: ``F.linear`` would add a transpose and
    a ``matmul`` dispatch per factor, which at 210 layers per decode step is measurable.

    Example:
        >>> layer = nn.Linear(4, 3, bias=False)
        >>> x = torch.ones(1, 4)
        >>> torch.equal(lora_forward(layer, torch.zeros(4, 2), torch.zeros(2, 3), x), layer(x))
        True
    """
    out = base_linear(linear, x)
    flat = x.reshape(-1, x.shape[-1]).float()
    update = torch.mm(torch.mm(flat, a_t), scaled_b_t).view(out.shape)
    if torch.is_grad_enabled():
        return out + update.to(out.dtype)
    return out.add_(update)  # serving: one op, cast on the fly


def lora_forward_rows(
    linear: nn.Linear,
    groups: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    x: torch.Tensor,
) -> torch.Tensor:
    """``linear(x)`` plus, for each ``(A.T, (scale*B).T, rows)`` group, that adapter's update
    on those rows only: one batch serves rows of several adapters (rows of none get none).

    Example:
        >>> layer = nn.Linear(4, 3, bias=False)
        >>> x = torch.ones(2, 1, 4)
        >>> groups = [(torch.ones(4, 1), torch.ones(1, 3), torch.tensor([1]))]
        >>> out = lora_forward_rows(layer, groups, x)
        >>> torch.equal(out[0], layer(x)[0]), torch.allclose(out[1], layer(x)[1] + 4)
        (True, True)
    """
    out = base_linear(linear, x)
    for a_t, scaled_b_t, rows in groups:
        chosen = x.index_select(0, rows)
        flat = chosen.reshape(-1, chosen.shape[-1]).float()
        update = torch.mm(torch.mm(flat, a_t), scaled_b_t)
        out.index_add_(0, rows, update.view(*chosen.shape[:-1], -1).to(out.dtype))
    return out


class AdapterSlot:
    """One linear's LoRA forward over fp32 factor buffers that outlive the adapter in them.

    ``hold`` copies an adapter's ``(A.T, (scale * B).T)`` into the buffers and returns the
    forward reading them, the same object for every adapter of the same rank: a compiled
    decode step (``compiled_step.py``), which guards on a linear's forward and reads its
    tensors as graph inputs, serves the next checkpoint of a run with the graph it has,
    instead of tracing it again. The copy is two small tensors per linear (rank x width).
    The buffers are plain tensors (not inference tensors), so they can be refilled in and
    out of ``torch.inference_mode``.

    Example:
        >>> slot = AdapterSlot(nn.Linear(4, 3, bias=False))
        >>> first = slot.hold(torch.zeros(4, 2), torch.zeros(2, 3))
        >>> slot.hold(torch.ones(4, 2), torch.ones(2, 3)) is first
        True
        >>> slot.hold(torch.ones(4, 1), torch.ones(1, 3)) is first  # another rank
        False
    """

    def __init__(self, linear: nn.Linear) -> None:
        self.linear = linear
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None
        self._forward: functools.partial[torch.Tensor] | None = None

    def hold(self, a_t: torch.Tensor, scaled_b_t: torch.Tensor) -> functools.partial[torch.Tensor]:
        """Copy the factors in; the forward computing ``linear(x) + x @ A.T @ (scale*B).T``."""
        device = self.linear.weight.device
        with torch.inference_mode(False), torch.no_grad():
            held = self._buffers
            if held is None or held[0].shape != a_t.shape or held[1].shape != scaled_b_t.shape:
                held = (
                    torch.empty(a_t.shape, dtype=torch.float32, device=device),
                    torch.empty(scaled_b_t.shape, dtype=torch.float32, device=device),
                )
                self._buffers = held
                self._forward = functools.partial(lora_forward, self.linear, *held)
            held[0].copy_(a_t)
            held[1].copy_(scaled_b_t)
        assert self._forward is not None
        return self._forward


class _Adapted:
    """One linear layer of the model and the LoRA deltas loaded for it, by adapter name."""

    def __init__(self, linear: nn.Linear) -> None:
        self.linear = linear
        self.deltas: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # name: (A.T, sB.T)
        self.slot = AdapterSlot(linear)

    def apply(self, name: str | None) -> None:
        """Make the layer compute with adapter ``name``, or as plain ``nn.Linear``."""
        delta = self.deltas.get(name) if name is not None else None
        if delta is None:
            restore_forward(self.linear)  # back to the plain layer: no overhead
        else:
            # An instance attribute shadows the class's forward; the module tree, parameter
            # names and ``lm_head.weight``-style accesses all stay as they were.
            self.linear.forward = self.slot.hold(*delta)  # type: ignore[method-assign]

    def apply_rows(self, rows_by_name: dict[str, torch.Tensor]) -> None:
        """Make the layer add each adapter's update to its own rows of the batch."""
        groups = [
            (*self.deltas[name], rows) for name, rows in rows_by_name.items() if name in self.deltas
        ]
        if not groups:
            restore_forward(self.linear)
        else:
            self.linear.forward = functools.partial(lora_forward_rows, self.linear, groups)  # type: ignore[method-assign]


@dataclass
class _AdapterWeights:
    deltas: dict[str, tuple[torch.Tensor, torch.Tensor]]  # module path -> (A, scale * B)
    # Copies of base parameters saved alongside (peft saves a tied lm_head/embedding when
    # the adapter targets it): parameter name -> tensor; they must equal the model's own.
    base_copies: dict[str, torch.Tensor]


def read_adapter(folder: Path) -> _AdapterWeights:
    """Read a PEFT LoRA adapter folder into per-module ``(A, scale * B)`` pairs (fp32).

    Raises ``UnsupportedAdapter`` for anything but plain LoRA on linear layers.

    Example:
        >>> weights = read_adapter(Path("checkpoints/0003"))  # needs files: a trained checkpoint  # doctest: +SKIP
        >>> sorted(weights.deltas)[0]                          # needs files  # doctest: +SKIP
        'model.layers.0.mlp.down_proj'
    """
    from safetensors.torch import load_file

    folder = Path(folder)
    try:
        config = json.loads((folder / "adapter_config.json").read_text())
    except (OSError, ValueError) as exc:
        raise UnsupportedAdapter(f"cannot read {folder / 'adapter_config.json'}: {exc}") from exc
    problems = [
        f"{key}={config.get(key)!r}"
        for key, plain in (
            ("peft_type", "LORA"),
            ("use_dora", False),
            ("bias", "none"),
            ("fan_in_fan_out", False),
            ("lora_bias", False),
        )
        if config.get(key, plain) not in (plain, None)
    ]
    for key in (
        "modules_to_save",
        "rank_pattern",
        "alpha_pattern",
        "layer_replication",
        "trainable_token_indices",
        "target_parameters",
        "alora_invocation_tokens",
        "arrow_config",
        "use_qalora",
        "use_bdlora",
    ):
        if config.get(key):  # variants that change the forward beyond A and B
            problems.append(f"{key}={config[key]!r}")
    if problems:
        raise UnsupportedAdapter(f"adapter {folder} uses {', '.join(problems)}")
    try:
        rank, alpha = int(config["r"]), float(config["lora_alpha"])
    except (KeyError, TypeError, ValueError) as exc:
        raise UnsupportedAdapter(f"adapter {folder} has no usable r / lora_alpha: {exc}") from exc
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank

    weights_file = folder / "adapter_model.safetensors"
    if not weights_file.is_file():
        raise UnsupportedAdapter(f"{folder} has no adapter_model.safetensors")
    tensors = load_file(str(weights_file))
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    base_copies: dict[str, torch.Tensor] = {}
    for key, tensor in tensors.items():
        name = key.removeprefix("base_model.model.")
        for part in ("lora_A", "lora_B"):
            marker = f".{part}.weight"
            if name.endswith(marker):
                pairs.setdefault(name[: -len(marker)], {})[part] = tensor.float()
                break
        else:
            if "lora_" in name:  # lora_embedding_A, lora_magnitude_vector, ...
                raise UnsupportedAdapter(
                    f"adapter {folder} has a tensor this server cannot apply: {key}"
                )
            base_copies[name.replace(".base_layer.", ".")] = tensor
    deltas: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for module, parts in pairs.items():
        if set(parts) != {"lora_A", "lora_B"}:
            raise UnsupportedAdapter(f"adapter {folder} has only {sorted(parts)} for {module}")
        deltas[module] = (parts["lora_A"], parts["lora_B"] * scale)
    if not deltas:
        raise UnsupportedAdapter(f"adapter {folder} holds no LoRA weights")
    return _AdapterWeights(deltas, base_copies)


class LoraServer:
    """The LoRA adapters of one model; ``activate`` picks the one every forward applies.

    Example:
        >>> server = LoraServer(model)                       # fragment: a loaded `model`, a trained checkpoint  # doctest: +SKIP
        >>> server.load("step-3", Path("checkpoints/0003"))  # fragment  # doctest: +SKIP
        >>> server.activate("step-3")                        # fragment  # doctest: +SKIP
        >>> logits = model(input_ids).logits                 # fragment  # doctest: +SKIP
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._layers: dict[str, _Adapted] = {}
        self._names: set[str] = set()
        self._active: str | None = None
        # The adapter of each row of the running batch (``use_rows``), and adapters removed
        # while rows still used them: freed once no row does.
        self._rows: tuple[str | None, ...] | None = None
        self._deferred: set[str] = set()

    @property
    def names(self) -> list[str]:
        """The adapters loaded now."""
        return sorted(self._names)

    def load(self, name: str, folder: Path) -> None:
        """Load adapter ``folder`` as ``name`` (replacing one of that name).

        Everything is checked before anything changes: on ``UnsupportedAdapter`` the model
        serves exactly what it served before.
        """
        weights = read_adapter(folder)
        targets: dict[str, nn.Linear] = {}
        for path, (lora_a, scaled_b) in weights.deltas.items():
            try:
                module = self.model.get_submodule(path)
            except AttributeError as exc:
                raise UnsupportedAdapter(f"the model has no module {path}") from exc
            if type(module) is not nn.Linear:
                raise UnsupportedAdapter(f"{path} is a {type(module).__name__}, not nn.Linear")
            out_features, in_features = module.weight.shape
            rank = lora_a.shape[0]
            if lora_a.shape != (rank, in_features) or scaled_b.shape != (out_features, rank):
                raise UnsupportedAdapter(
                    f"{path}: LoRA A {tuple(lora_a.shape)} / B {tuple(scaled_b.shape)} do not "
                    f"fit its weight {tuple(module.weight.shape)}"
                )
            targets[path] = module
        for parameter_name, saved in weights.base_copies.items():
            module_path, _, attribute = parameter_name.rpartition(".")
            try:
                own = getattr(self.model.get_submodule(module_path), attribute, None)
            except AttributeError:
                own = None
            if not isinstance(own, torch.Tensor) or own.shape != saved.shape:
                raise UnsupportedAdapter(
                    f"the adapter saves {parameter_name}, which the model lacks"
                )
            if not torch.equal(own, saved.to(device=own.device, dtype=own.dtype)):
                raise UnsupportedAdapter(f"the adapter changes the base weight {parameter_name}")
        self.remove(name)
        for path, module in targets.items():
            layer = self._layers.setdefault(path, _Adapted(module))
            lora_a, scaled_b = weights.deltas[path]  # fp32 from read_adapter
            device = module.weight.device
            layer.deltas[name] = (
                lora_a.to(device).t().contiguous(),
                scaled_b.to(device).t().contiguous(),
            )
        self._names.add(name)
        self._deferred.discard(name)  # loaded again under its name: keep it

    def remove(self, name: str) -> None:
        """Forget adapter ``name`` (no-op when it is not loaded). Rows of the running batch
        that use it keep it until they finish (``use_rows`` frees it then)."""
        if self._rows is not None and name in self._rows:
            self._deferred.add(name)
            self._names.discard(name)
            return
        if self._active == name:
            self.activate(None)
        for layer in self._layers.values():
            layer.deltas.pop(name, None)
        self._names.discard(name)
        self._deferred.discard(name)

    def activate(self, name: str | None) -> None:
        """Serve adapter ``name`` (None: the base model) in every forward from now on."""
        if name is not None and name not in self._names:
            raise KeyError(f"adapter {name!r} is not loaded")
        if name == self._active and self._rows is None:
            return
        for layer in self._layers.values():
            layer.apply(name)
        self._active, self._rows = name, None

    def use_rows(self, names: list[str | None]) -> None:
        """Serve row ``i`` of every following forward with adapter ``names[i]`` (None: the
        base model): one batch holds rows of several adapters, e.g. requests that started on
        step ``s`` finishing while new ones already run on step ``s + 1``. One adapter for
        all rows takes the plain single-adapter path (no row indexing).
        """
        key = tuple(names)
        if key == self._rows:
            return
        for name in set(key) - {None}:
            if name not in self._names and name not in self._deferred:
                raise KeyError(f"adapter {name!r} is not loaded")
        distinct = set(key)
        if len(distinct) <= 1:
            single = next(iter(distinct), None)
            for layer in self._layers.values():
                layer.apply(single)
        else:
            rows: dict[str, list[int]] = {}
            for i, name in enumerate(key):
                if name is not None:
                    rows.setdefault(name, []).append(i)
            device = next(iter(self.model.parameters())).device
            indices = {n: torch.tensor(r, dtype=torch.long, device=device) for n, r in rows.items()}
            for layer in self._layers.values():
                layer.apply_rows(indices)
        self._active, self._rows = None, key
        for name in [n for n in self._deferred if n not in distinct]:
            self._deferred.discard(name)
            for layer in self._layers.values():
                layer.deltas.pop(name, None)

    def uninstall(self) -> None:
        """Serve the plain model again and forget every adapter."""
        self.activate(None)
        self._layers.clear()
        self._names.clear()
