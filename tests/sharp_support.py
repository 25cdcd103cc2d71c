"""tiny-random with seeded weights of a larger scale: its own weights make every row repeat
its last token with near-uniform logits, which tells nothing apart."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from art_core.embedded import resolve_base_model


def sharp_tiny_random() -> Any:
    """tiny-random's architecture, fp32, each weight matrix seeded with std 0.15."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        resolve_base_model("tiny-random"), dtype=torch.float32
    ).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:  # the matrices; norms stay ones
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.15)
    return model


def sharp_model_folder(folder: Path) -> Path:
    """``sharp_tiny_random`` saved as a model folder (with tiny-random's tokenizer files)."""
    shutil.copytree(resolve_base_model("tiny-random"), folder)
    sharp_tiny_random().save_pretrained(folder)
    return folder
