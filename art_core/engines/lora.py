"""Serving LoRA adapters with three tensor ops per layer, instead of peft's wrapper stack.

peft's ``LoraLayer.forward`` is built for training: per layer and call it walks the active
adapters, upcasts the input to the adapter's fp32, runs dropout, two linears and a scale, and
casts back. On a CPU decode step (8 rows, 210 adapted layers of a 135M model) that overhead
doubled the step time. Here each adapted ``nn.Linear`` is swapped in place for a
``LoraLinear`` that computes ``base(x) + (x @ A.T) @ (scale * B).T`` (the update in fp32),
with the adapter picked by one shared switch per batch. Weights are never merged: merging a
small update into bf16 weights rounds most of it away, and adapters must swap per batch.

Only plain LoRA on linear layers is handled (what ``TrainConfig`` trains). Anything else in an
adapter folder (DoRA, embedding/conv LoRA, bias training, ``modules_to_save``, per-module rank
or alpha patterns) raises ``UnsupportedAdapter``, and the engine serves it with peft instead.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn


class UnsupportedAdapter(ValueError):
    """An adapter folder this module cannot serve (the engine falls back to peft)."""


@dataclass
class _Switch:
    """Which adapter every ``LoraLinear`` of one model applies now (None: the base model)."""

    active: str | None = None


class LoraLinear(nn.Module):
    """An ``nn.Linear`` plus any number of loaded LoRA deltas, one of them active at a time.

    Example:
        >>> layer = LoraLinear(nn.Linear(4, 3, bias=False), _Switch())
        >>> layer.add("a", torch.zeros(2, 4), torch.zeros(3, 2))
        >>> layer(torch.ones(1, 4)).shape
        torch.Size([1, 3])
    """

    def __init__(self, base: nn.Linear, switch: _Switch) -> None:
        super().__init__()
        self.base = base
        self.switch = switch
        self.deltas: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def add(self, name: str, lora_a: torch.Tensor, scaled_b: torch.Tensor) -> None:
        """Register adapter ``name``: ``lora_a`` is ``(r, in)``, ``scaled_b`` ``(out, r)``."""
        weight = self.base.weight
        expected_a = (lora_a.shape[0], weight.shape[1])
        if lora_a.shape != expected_a or scaled_b.shape != (weight.shape[0], lora_a.shape[0]):
            raise UnsupportedAdapter(
                f"LoRA shapes A {tuple(lora_a.shape)} / B {tuple(scaled_b.shape)} do not fit a "
                f"linear layer of weight {tuple(weight.shape)}"
            )
        # fp32 whatever the serving dtype: a (tokens x 576) @ (576 x 8) matmul costs ~25 us
        # in bf16 on CPU (oneDNN's fixed cost) and ~4 us in fp32, and fp32 keeps small
        # updates exact.
        self.deltas[name] = (
            lora_a.to(device=weight.device, dtype=torch.float32).contiguous(),
            scaled_b.to(device=weight.device, dtype=torch.float32).contiguous(),
        )

    @property
    def weight(self) -> torch.Tensor:  # code that reads ``lm_head.weight`` etc. keeps working
        return self.base.weight

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        delta = self.deltas.get(self.switch.active) if self.switch.active else None
        if delta is None:
            return out
        lora_a, scaled_b = delta
        update = torch.nn.functional.linear(torch.nn.functional.linear(x.float(), lora_a), scaled_b)
        return out + update.to(out.dtype)


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
        >>> weights = read_adapter(Path("checkpoints/0003"))  # doctest: +SKIP
        >>> sorted(weights.deltas)[0]                          # doctest: +SKIP
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
    rank, alpha = int(config["r"]), float(config["lora_alpha"])
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
    """The LoRA adapters of one model, applied by ``LoraLinear`` layers swapped into it.

    Example:
        >>> server = LoraServer(model)                  # doctest: +SKIP
        >>> server.load("step-3", Path("checkpoints/0003"))  # doctest: +SKIP
        >>> with server.using("step-3"):                # doctest: +SKIP
        ...     logits = model(input_ids).logits
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._switch = _Switch()
        self._layers: dict[str, LoraLinear] = {}
        self._names: set[str] = set()

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
        targets: dict[str, nn.Linear | LoraLinear] = {}
        for path, (lora_a, scaled_b) in weights.deltas.items():
            try:
                module = self.model.get_submodule(path)
            except AttributeError as exc:
                raise UnsupportedAdapter(f"the model has no module {path}") from exc
            if not isinstance(module, (nn.Linear, LoraLinear)):
                raise UnsupportedAdapter(f"{path} is a {type(module).__name__}, not a linear layer")
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
            layer = module if isinstance(module, LoraLinear) else self._wrap(path, module)
            layer.add(name, *weights.deltas[path])
        self._names.add(name)

    def remove(self, name: str) -> None:
        """Forget adapter ``name`` (no-op when it is not loaded)."""
        for layer in self._layers.values():
            layer.deltas.pop(name, None)
        self._names.discard(name)
        if self._switch.active == name:
            self._switch.active = None

    def activate(self, name: str | None) -> None:
        """Serve adapter ``name`` (None: the base model) in every forward from now on."""
        if name is not None and name not in self._names:
            raise KeyError(f"adapter {name!r} is not loaded")
        self._switch.active = name

    def uninstall(self) -> None:
        """Put the original linear layers back and forget every adapter."""
        for path, layer in self._layers.items():
            parent_path, _, attribute = path.rpartition(".")
            parent: Any = self.model.get_submodule(parent_path) if parent_path else self.model
            setattr(parent, attribute, layer.base)
        self._layers.clear()
        self._names.clear()
        self._switch.active = None

    def _wrap(self, path: str, linear: nn.Linear) -> LoraLinear:
        parent_path, _, attribute = path.rpartition(".")
        parent: Any = self.model.get_submodule(parent_path) if parent_path else self.model
        layer = LoraLinear(linear, self._switch)
        setattr(parent, attribute, layer)
        self._layers[path] = layer
        return layer
