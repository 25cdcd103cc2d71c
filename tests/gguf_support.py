"""Write a small GGUF file from a tiny Qwen2 Hugging Face folder, as llama.cpp's converter would.

Qwen2 is the simplest architecture to write: llama.cpp stores its attention weights as they
are (Llama's q/k weights would need the rope permutation), and its tokenizer is the same
byte-level BPE (``gpt2`` in GGUF terms) our tiny models use.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

# Hugging Face name (after ``model.layers.N.``) -> GGUF name (after ``blk.N.``).
_LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def _gguf_name(name: str) -> str:
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    if name == "lm_head.weight":
        return "output.weight"
    _, _, index, rest = name.split(".", 3)
    return f"blk.{index}.{_LAYER_TENSORS[rest]}"


def write_qwen2_gguf(
    hf_folder: Path, path: Path, *, quantize: bool = True, architecture: str = "qwen2"
) -> None:
    """Write ``hf_folder`` (a Qwen2 model with a byte-level BPE tokenizer) as a GGUF file.

    ``quantize``: store the 2-D weights as Q8_0 (as real GGUF files do), else all F32.
    ``architecture``: what ``general.architecture`` says (another value makes a file
    transformers refuses, for the error tests).
    """
    import gguf
    from safetensors.numpy import load_file

    config = json.loads((hf_folder / "config.json").read_text())
    tokenizer = json.loads((hf_folder / "tokenizer.json").read_text())
    template = json.loads((hf_folder / "tokenizer_config.json").read_text()).get("chat_template")
    if template is None and (hf_folder / "chat_template.jinja").is_file():
        template = (hf_folder / "chat_template.jinja").read_text()

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny qwen2")
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    rope = config.get("rope_parameters") or {}
    writer.add_rope_freq_base(float(rope.get("rope_theta", config.get("rope_theta", 10000.0))))

    vocab: dict[str, int] = tokenizer["model"]["vocab"]
    added = {entry["id"]: entry for entry in tokenizer["added_tokens"]}
    size = max([*vocab.values(), *added]) + 1
    tokens = [""] * size
    types = [gguf.TokenType.NORMAL] * size
    for token, index in vocab.items():
        tokens[index] = token
    for index, entry in added.items():
        tokens[index] = entry["content"]
        types[index] = gguf.TokenType.CONTROL if entry["special"] else gguf.TokenType.USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_pad_token_id(config["pad_token_id"])
    writer.add_add_bos_token(False)
    if template:
        writer.add_chat_template(template)

    for name, array in load_file(hf_folder / "model.safetensors").items():
        array = array.astype(np.float32)
        if quantize and array.ndim == 2 and array.shape[-1] % 32 == 0:
            packed = gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(_gguf_name(name), packed, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(_gguf_name(name), array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
