"""``format="merged"``: the base with the adapter merged in, a plain Hugging Face model.

The base is loaded, upcast to fp32 for the merge (``merge_and_unload``), cast back to the
base's own dtype and saved as safetensors, with the gateway's tokenizer and chat template,
so ``AutoModelForCausalLM.from_pretrained(out)`` and ``AutoTokenizer.from_pretrained(out)``
need nothing else.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from art_core.export.tokenizer import save_gateway_tokenizer


def merge_adapter(base_path: Path, checkpoint: Path) -> Any:
    """The base model of ``base_path`` with the adapter of ``checkpoint`` merged in, in the
    base's dtype (on the CPU)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base: Any = AutoModelForCausalLM.from_pretrained(base_path, dtype="auto")
    dtype = base.dtype
    base = base.to(torch.float32)
    model = PeftModel.from_pretrained(base, checkpoint)
    merged = model.merge_and_unload()
    return merged.to(dtype)


def write_merged(checkpoint: Path, base_path: Path, staging: Path) -> str:
    """Write the merged model of ``checkpoint`` into ``staging``; return its dtype's name."""
    merged = merge_adapter(base_path, checkpoint)
    merged.save_pretrained(staging, safe_serialization=True)
    save_gateway_tokenizer(base_path, staging)
    return str(merged.dtype).removeprefix("torch.")
