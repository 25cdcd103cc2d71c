"""FSDP2 (``torch.distributed.fsdp.fully_shard``) for a base model too big for one device.

Every decoder layer, and then the rest of the model (embeddings, final norm, head), becomes
one FSDP unit: between uses each rank keeps only its 1/N slice of the unit's parameters,
frozen base weights and LoRA weights alike; a unit's full weights exist on a rank only while
it runs forward or backward (``all_gather``), and its LoRA gradients are summed over the
ranks and sliced again (``reduce_scatter``). The optimizer then works on the slices.

Checkpoints stay the same files as without sharding: the LoRA weights and the optimizer
state are gathered to full tensors (a collective, so every rank takes part) and rank 0
writes them; a sharded world resumes from them by slicing them again.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor, distribute_tensor


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a Hugging Face model (its ``_no_split_modules`` classes).

    Example:
        >>> from transformers import AutoModelForCausalLM
        >>> from art_core.embedded import resolve_base_model
        >>> model = AutoModelForCausalLM.from_pretrained(resolve_base_model("tiny-random"))
        >>> decoder_layers(model)[0].__class__.__name__
        'LlamaDecoderLayer'
    """
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    layers = [module for module in model.modules() if type(module).__name__ in names]
    if not layers:
        raise ValueError(
            f"cannot shard {type(model).__name__}: it names no transformer block class "
            "(_no_split_modules)"
        )
    return layers


def shard_model(model: torch.nn.Module, device: torch.device) -> None:
    """Shard ``model`` in place over the default process group, each rank's slices on
    ``device``; gradients are summed over the ranks (not averaged: every micro-batch's loss
    is already its share of the whole step's loss)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    world_size = torch.distributed.get_world_size()
    mesh = init_device_mesh(device.type, (world_size,))
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            # A plain SUM (gloo has no pre-multiplied sum; NCCL copies less with SUM too).
            module.set_force_sum_reduction_for_comms(True)


def full_tensor(value: Any) -> Any:
    """A DTensor gathered to its full value on the CPU (a collective); anything else as is."""
    if isinstance(value, DTensor):
        return value.full_tensor().detach().cpu()
    return value


def full_trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full values of the trainable (LoRA) parameters, by state-dict name."""
    return {
        name: full_tensor(param).detach().cpu()
        for name, param in model.named_parameters()
        if param.requires_grad
    }


def full_optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's ``state_dict`` with every sharded state tensor gathered (a new dict:
    the optimizer's own state is left alone)."""
    state_dict = optimizer.state_dict()
    return {
        "state": {
            index: {name: full_tensor(value) for name, value in state.items()}
            for index, state in state_dict["state"].items()
        },
        "param_groups": state_dict["param_groups"],
    }


def shard_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Slice full state tensors (loaded from a checkpoint) like their sharded parameters."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            if not isinstance(param, DTensor):
                continue
            state = optimizer.state.get(param, {})
            for name, value in list(state.items()):
                if (
                    isinstance(value, torch.Tensor)
                    and not isinstance(value, DTensor)
                    and value.shape == param.shape
                ):
                    state[name] = distribute_tensor(
                        value.to(param.to_local().device),
                        param.device_mesh,
                        param.placements,
                        src_data_rank=None,
                    )
