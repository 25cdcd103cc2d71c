"""Randomly initialised models of real shapes, built offline, for the GPU checks.

The GPU machines reach no network, so no weights are downloaded: each model here is its real
checkpoint's ``config.json`` (values copied below) with seeded random weights, saved in the
Hugging Face layout with a tokenizer. The tokenizer is the embedded ``tiny-qwen2.5`` one
(Qwen2.5's special tokens, chat template and stop ids over a small BPE vocabulary): the model
keeps its real vocabulary size (151936 / 152064 rows), so every forward pays the real
embedding and head, and ids past the tokenizer decode to nothing, as a padded vocabulary's
do. Random weights sample near-uniformly, so an answer runs to its ``max_tokens``: what a
throughput benchmark wants.

``tiny=True`` keeps each config's architecture and vocabulary but shrinks the layers (hidden
64, 2 layers), for the CPU smoke run.

Usage: python benchmarks/gpu_models.py   (prints each model's parameter count, built on the
meta device: no memory used)
       python benchmarks/gpu_models.py --smoke   (the same, then builds each model at tiny size
                                                 in a temporary folder, loads it back and
                                                 runs one forward pass: build_model's path)
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

# config.json of Qwen/Qwen2.5-0.5B-Instruct and Qwen/Qwen2.5-7B-Instruct (token ids left out:
# they follow the tokenizer used here).
QWEN25_05B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "hidden_act": "silu",
    "hidden_size": 896,
    "initializer_range": 0.02,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "max_window_layers": 21,
    "model_type": "qwen2",
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
QWEN25_7B: dict[str, Any] = {
    **QWEN25_05B,
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "max_window_layers": 28,
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "sliding_window": 131072,
    "tie_word_embeddings": False,
    "vocab_size": 152064,
}
MODELS: dict[str, dict[str, Any]] = {"qwen2.5-0.5b": QWEN25_05B, "qwen2.5-7b": QWEN25_7B}
# The smoke run's shape: the tiny families' (heads divide hidden, kv heads divide heads).
TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_window_layers": 2,
}
TOKENIZER_SOURCE = "tiny-qwen2.5"
_TOKENIZER_FILES: tuple[str, ...] = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)
_TOKENIZER_FILES += ("chat_template.jinja", "generation_config.json")


def model_config(name: str, *, tiny: bool = False, token_ids: dict[str, Any] | None = None) -> Any:
    """The ``Qwen2Config`` of model ``name`` (``MODELS``), shrunk by ``TINY`` when ``tiny``."""
    from transformers import Qwen2Config

    values = {**MODELS[name], **(TINY if tiny else {}), **(token_ids or {})}
    values.pop("architectures")
    values.pop("model_type")
    return Qwen2Config(**values)


def parameter_count(name: str, *, tiny: bool = False) -> int:
    """How many parameters model ``name`` has (built on the meta device: no memory)."""
    import torch
    from transformers import Qwen2ForCausalLM

    with torch.device("meta"):
        model = Qwen2ForCausalLM(model_config(name, tiny=tiny))
    return sum(p.numel() for p in model.parameters())


def build_model(
    name: str,
    folder: Path,
    *,
    device: str = "cpu",
    tiny: bool = False,
    seed: int = 0,
    art_path: Path | None = None,
) -> Path:
    """Write model ``name`` (seeded random weights in bf16, the tokenizer) to ``folder``;
    a folder built before (its ``config.json`` there) is reused. Returns ``folder``.

    Weights are initialised on ``device`` (a 7B model initialises in seconds on a GPU and in
    minutes on a CPU) and saved as safetensors.
    """
    import torch
    from transformers import Qwen2ForCausalLM

    from art_core.embedded import resolve_base_model

    if (folder / "config.json").is_file():
        return folder
    source = resolve_base_model(TOKENIZER_SOURCE, art_path or folder.parent)
    source_config = json.loads((source / "config.json").read_text())
    ids = {key: source_config[key] for key in ("bos_token_id", "eos_token_id", "pad_token_id")}
    config = model_config(name, tiny=tiny, token_ids=ids)
    staging = folder.with_name(folder.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # built in bf16: half the memory of fp32, no cast
    try:
        with torch.device(device):
            model = Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    model.save_pretrained(staging)
    del model
    for file in _TOKENIZER_FILES:
        if (source / file).is_file():
            shutil.copy(source / file, staging / file)
    staging.rename(folder)
    return folder


def smoke_build(name: str, work: Path) -> str:
    """Build ``name`` at tiny size under ``work``, load it back, one forward pass: a line."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    folder = build_model(name, work / "models" / f"{name}-tiny", tiny=True, art_path=work)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.inference_mode():
        logits = model(ids).logits
    assert logits.shape[-1] == MODELS[name]["vocab_size"], logits.shape
    return (
        f"{name} (tiny): built, loaded, forward of {ids.shape[1]} tokens -> "
        f"{logits.shape[-1]} logits in {time.perf_counter() - started:.1f} s"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--smoke", action="store_true", help="also build, load and run each model at tiny size"
    )
    args = parser.parse_args()
    for model_name in MODELS:
        real, small = parameter_count(model_name), parameter_count(model_name, tiny=True)
        print(f"{model_name}: {real / 1e9:.3f} B parameters ({small / 1e6:.1f} M when tiny)")
    if args.smoke:
        with tempfile.TemporaryDirectory(prefix="art-gpu-models-") as tmp:
            for model_name in MODELS:
                print(smoke_build(model_name, Path(tmp)))
