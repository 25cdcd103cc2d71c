"""Loading the base model with a trainable LoRA adapter, and choosing device and precision.

Plain transformers + peft everywhere; on CUDA, when ``unsloth`` is installed, its loader
(faster kernels, less memory) replaces them behind the same interface: both return a
``PeftModel`` whose ``disable_adapter()`` gives the base model back for the KL term.
Set ``ART_CORE_DISABLE_UNSLOTH=1`` to use plain peft on CUDA anyway.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path
from typing import Any

import torch

from art_core.device import autocast_dtype
from art_core.training.config import TrainingSettings

logger = logging.getLogger(__name__)


def base_weights_dtype(config: TrainingSettings, device: torch.device) -> torch.dtype:
    """The dtype of the frozen base weights: the autocast dtype, else fp32.

    Under autocast every matmul runs in that dtype anyway; storing the frozen weights in it
    saves re-casting all of them on every forward and backward (a fifth of a CPU step for
    SmolLM2-135M) and halves their memory. The trainable LoRA weights stay fp32.

    Example:
        >>> base_weights_dtype(TrainingSettings(precision="fp32"), torch.device("cpu"))
        torch.float32
    """
    return autocast_dtype(config.precision, device) or torch.float32


def use_unsloth(device: torch.device) -> bool:
    """Unsloth only runs on CUDA; use it there when installed and not disabled."""
    if device.type != "cuda" or os.environ.get("ART_CORE_DISABLE_UNSLOTH") == "1":
        return False
    return importlib.util.find_spec("unsloth") is not None


def _lora_config(config: TrainingSettings) -> Any:
    from peft import LoraConfig

    return LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=list(config.lora_target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )


def load_trainable_model(
    base_model_path: Path,
    config: TrainingSettings,
    device: torch.device,
    *,
    adapter_path: Path | None = None,
    load_device: torch.device | None = None,
) -> Any:
    """The base model with a trainable LoRA adapter: fresh from ``config``, or ``adapter_path``.

    The base weights stay frozen, in ``base_weights_dtype`` (decided for ``device``); LoRA
    weights are kept in fp32 so small updates are not rounded away. ``load_device`` (default
    ``device``) is where the weights are put: FSDP loads on the CPU and moves only each
    rank's shard to ``device``.

    Example:
        >>> from art_core.embedded import resolve_base_model
        >>> model = load_trainable_model(resolve_base_model("tiny-random"), TrainingSettings(),
        ...                              torch.device("cpu"))
        >>> type(model).__name__
        'PeftModelForCausalLM'
    """
    dtype = base_weights_dtype(config, device)
    load_device = device if load_device is None else load_device
    if use_unsloth(load_device):
        model = _load_with_unsloth(base_model_path, config, dtype, adapter_path)
    else:
        model = _load_with_peft(base_model_path, config, dtype, load_device, adapter_path)
    for parameter in model.parameters():
        if parameter.requires_grad and parameter.dtype != torch.float32:
            parameter.data = parameter.data.float()
    for module in model.modules():
        # peft casts each LoRA layer's input to the adapter's fp32, and autocast casts it
        # right back to bf16 for the matmul: two activation copies per layer and pass, for
        # nothing. With fp32 base weights the input is fp32 already.
        if hasattr(module, "cast_input_dtype_enabled"):
            module.cast_input_dtype_enabled = False
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def _load_with_peft(
    base_model_path: Path,
    config: TrainingSettings,
    dtype: torch.dtype,
    device: torch.device,
    adapter_path: Path | None,
) -> Any:
    from peft import PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    base: Any = AutoModelForCausalLM.from_pretrained(base_model_path, dtype=dtype)
    base = base.to(device)
    if adapter_path is not None:
        return PeftModel.from_pretrained(base, adapter_path, is_trainable=True)
    # Seeded so the same config gives the same initial adapter.
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(config.seed)
        return get_peft_model(base, _lora_config(config))


def _load_with_unsloth(
    base_model_path: Path,
    config: TrainingSettings,
    dtype: torch.dtype,
    adapter_path: Path | None,
) -> Any:  # pragma: no cover - needs CUDA
    from peft import PeftModel
    from unsloth import FastLanguageModel

    logger.info("loading %s with Unsloth", base_model_path)
    # Unsloth's fused loss path returns no logits unless asked; the GRPO loss needs them.
    os.environ.setdefault("UNSLOTH_RETURN_LOGITS", "1")
    base, _tokenizer = FastLanguageModel.from_pretrained(
        model_name=str(base_model_path), dtype=dtype, load_in_4bit=False
    )
    if adapter_path is not None:
        return PeftModel.from_pretrained(base, adapter_path, is_trainable=True)
    return FastLanguageModel.get_peft_model(
        base,
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=list(config.lora_target_modules),
        bias="none",
        use_gradient_checkpointing="unsloth" if config.gradient_checkpointing else False,
        random_state=config.seed,
    )


def adapter_settings(model: Any) -> dict[str, object]:
    """The LoRA shape of a loaded adapter, comparable with ``TrainConfig.lora_settings()``."""
    peft_config = model.peft_config["default"]
    targets = peft_config.target_modules
    return {
        "r": peft_config.r,
        "lora_alpha": peft_config.lora_alpha,
        "target_modules": sorted([targets] if isinstance(targets, str) else targets),
    }
