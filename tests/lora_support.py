"""Build a small random LoRA adapter that visibly changes a model's outputs."""

from __future__ import annotations

from pathlib import Path

import torch


def make_adapter(base_path: Path, folder: Path, seed: int) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(base_path),
        LoraConfig(r=8, lora_alpha=64, target_modules=["q_proj", "v_proj", "down_proj"]),
    )
    for name, parameter in model.named_parameters():
        if "lora_B" in name:  # peft starts B at zero (a no-op adapter); make it change outputs
            torch.nn.init.normal_(parameter, std=0.5)
    model.save_pretrained(folder)
