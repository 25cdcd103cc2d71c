"""A merged Hugging Face model folder written as one GGUF file, for llama.cpp and Ollama.

``write_gguf(folder, out_dir, model_name="my-model")`` reads ``config.json``, the safetensors
weights, the tokenizer (``tokenizer.json`` / ``tokenizer_config.json``) and the chat template
of ``folder`` and writes ``out_dir/my-model.gguf`` plus an Ollama ``Modelfile`` beside it.

What goes into the file follows llama.cpp's own ``convert_hf_to_gguf.py``, so llama.cpp,
Ollama and transformers' GGUF loader all read it:

- tensors renamed by the ``gguf`` library's tensor-name map (``blk.0.attn_q.weight``, ...);
  Llama's q/k projections permuted for llama.cpp's RoPE layout (transformers' loader undoes
  exactly this permutation); Qwen2's are not (llama.cpp runs Qwen2 with NeoX RoPE);
  tied embeddings written once as ``token_embd`` with no ``output`` tensor;
- 1-D tensors (norms, biases) always float32, 2-D weights in the chosen ``gguf_type``;
  ``q8_0`` quantizes the weights whose rows are a multiple of 32 and keeps the rest f16;
- the architecture's hyper-parameters, the byte-level BPE tokenizer (``tokenizer.ggml.model``
  ``gpt2``: tokens, token types, merges, pre-tokenizer, special ids, add-bos/eos flags) and
  ``tokenizer.chat_template``.

Example:
    >>> write_gguf(Path("merged"), Path("export"), model_name="agent")  # needs files: a merged model folder  # doctest: +SKIP
    PosixPath('export/agent.gguf')
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

# HF architecture -> gguf's architecture name (``gguf.MODEL_ARCH_NAMES``) and whether q/k are
# permuted for llama.cpp's (GPT-J style) RoPE.
_ARCHITECTURES: dict[str, tuple[str, bool]] = {
    "LlamaForCausalLM": ("llama", True),
    "Qwen2ForCausalLM": ("qwen2", False),
}
SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(_ARCHITECTURES)
SUPPORTED_TYPES: tuple[str, ...] = ("f32", "f16", "bf16", "q8_0")

# Pre-tokenizer split regexes llama.cpp knows by name (``tokenizer.ggml.pre``).
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_KNOWN_SPLITS = {_QWEN2_SPLIT: "qwen2", _LLAMA3_SPLIT: "llama-bpe"}


class UnsupportedArchitecture(ValueError):
    """The folder's model architecture has no GGUF export here."""


def _types() -> dict[str, tuple[Any, Any]]:
    import gguf

    q = gguf.GGMLQuantizationType
    f = gguf.LlamaFileType
    return {
        "f32": (q.F32, f.ALL_F32),
        "f16": (q.F16, f.MOSTLY_F16),
        "bf16": (q.BF16, f.MOSTLY_BF16),
        "q8_0": (q.Q8_0, f.MOSTLY_Q8_0),
    }


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _architecture(config: dict[str, Any]) -> str:
    names = config.get("architectures") or []
    name = names[0] if names else f"(none; model_type {config.get('model_type')!r})"
    if name not in _ARCHITECTURES:
        raise UnsupportedArchitecture(
            f"cannot export architecture {name!r} to GGUF: supported are "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    return str(name)


def _rope(config: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope theta, rope scaling or None), from transformers 5's ``rope_parameters`` or the
    older ``rope_theta`` / ``rope_scaling`` keys."""
    parameters = dict(config.get("rope_parameters") or {})
    theta = float(parameters.get("rope_theta", config.get("rope_theta", 10000.0)))
    scaling = config.get("rope_scaling") or parameters
    kind = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
    return theta, (dict(scaling, rope_type=kind) if kind != "default" else None)


def _llama3_rope_factors(config: dict[str, Any], theta: float, scaling: dict[str, Any]) -> Any:
    """llama.cpp's ``rope_freqs`` tensor for Llama 3.1-style RoPE scaling."""
    dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    freqs = 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor = float(scaling.get("factor", 8.0))
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    old_context = float(scaling.get("original_max_position_embeddings", 8192))
    factors = []
    for freq in freqs:
        wavelength = 2 * math.pi / float(freq)
        if wavelength < old_context / high:
            factors.append(1.0)
        elif wavelength > old_context / low:
            factors.append(factor)
        else:
            smooth = (old_context / wavelength - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(factors, dtype=np.float32)


def _add_hyperparameters(writer: Any, config: dict[str, Any], arch: str) -> Any:
    """The architecture's keys; returns the extra ``rope_freqs`` tensor or None."""
    import gguf

    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or config["hidden_size"] // heads)
    writer.add_vocab_size(int(config["vocab_size"]))
    writer.add_context_length(int(config["max_position_embeddings"]))
    writer.add_embedding_length(int(config["hidden_size"]))
    writer.add_block_count(int(config["num_hidden_layers"]))
    writer.add_feed_forward_length(int(config["intermediate_size"]))
    writer.add_head_count(heads)
    writer.add_head_count_kv(int(config.get("num_key_value_heads") or heads))
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))
    writer.add_rope_dimension_count(head_dim)
    if head_dim * heads != int(config["hidden_size"]):
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    theta, scaling = _rope(config)
    writer.add_rope_freq_base(theta)
    if scaling is None:
        return None
    kind = str(scaling["rope_type"]).lower()
    if kind == "llama3" and arch == "llama":
        return _llama3_rope_factors(config, theta, scaling)
    if kind == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(scaling["factor"]))
    elif kind == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(float(scaling["factor"]))
        original = scaling.get("original_max_position_embeddings")
        if original:
            writer.add_rope_scaling_orig_ctx_len(int(original))
    else:
        raise UnsupportedArchitecture(
            f"RoPE scaling {kind!r} of this {arch} model has no GGUF export here"
        )
    return None


def _pre_tokenizer(tokenizer_json: dict[str, Any]) -> str:
    """llama.cpp's name for the tokenizer's pre-tokenizer (``tokenizer.ggml.pre``)."""
    pre = tokenizer_json.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    kinds = [step.get("type") for step in steps]
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True):
        return "gpt-2"
    if kinds == ["Split", "ByteLevel"]:
        pattern = steps[0].get("pattern", {})
        regex = pattern.get("Regex") or pattern.get("String")
        if regex in _KNOWN_SPLITS:
            return _KNOWN_SPLITS[regex]
    logger.warning("unknown pre-tokenizer %s: writing 'default' (llama.cpp's generic split)", pre)
    return "default"


def _add_tokenizer(writer: Any, folder: Path, vocab_size: int) -> list[str]:
    """The tokenizer and chat template keys; returns the stop token strings."""
    import gguf
    from transformers import AutoTokenizer

    tokenizer_json = _read_json(folder / "tokenizer.json")
    model = tokenizer_json.get("model") or {}
    decoder = tokenizer_json.get("decoder") or {}
    if model.get("type") != "BPE" or decoder.get("type") != "ByteLevel":
        raise ValueError(
            f"{folder}: only byte-level BPE tokenizers (tokenizer.json with a BPE model and a "
            f"ByteLevel decoder) are exported to GGUF; this one is {model.get('type')!r} / "
            f"{decoder.get('type')!r}"
        )
    tokenizer: Any = AutoTokenizer.from_pretrained(folder)
    vocab: dict[str, int] = tokenizer.get_vocab()
    added = tokenizer.added_tokens_decoder
    if len(vocab) > vocab_size:
        raise ValueError(
            f"{folder}: the tokenizer has {len(vocab)} tokens, more than the model's "
            f"vocab_size {vocab_size}"
        )
    by_id = {index: token for token, index in vocab.items()}
    tokens: list[str] = []
    types: list[int] = []
    for index in range(vocab_size):
        if index not in by_id:
            tokens.append(f"[PAD{index}]")
            types.append(gguf.TokenType.UNUSED)
        elif index in added:
            tokens.append(str(added[index].content))
            types.append(
                gguf.TokenType.CONTROL if added[index].special else gguf.TokenType.USER_DEFINED
            )
        else:
            tokens.append(by_id[index])
            types.append(gguf.TokenType.NORMAL)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(_pre_tokenizer(tokenizer_json))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    # Merges, special ids (tokenizer_config.json first, then config.json) and the chat template
    # (tokenizer_config.json's, else chat_template.jinja), as llama.cpp's converter reads them.
    special = gguf.SpecialVocab(folder, load_merges=True, n_vocab=vocab_size)
    # Whether plain encoding adds bos/eos, from the tokenizer itself (its post-processor).
    plain = tokenizer.encode("a", add_special_tokens=False)
    full = tokenizer.encode("a", add_special_tokens=True)
    special.add_special_token["bos"] = bool(
        tokenizer.bos_token_id is not None and full[:1] == [tokenizer.bos_token_id] != plain[:1]
    )
    special.add_special_token["eos"] = bool(
        tokenizer.eos_token_id is not None and full[-1:] == [tokenizer.eos_token_id] != plain[-1:]
    )
    if special.chat_template is None and tokenizer.chat_template:
        special.chat_template = tokenizer.chat_template
    special.add_to_gguf(writer, quiet=True)
    stop_ids = [tokenizer.eos_token_id]
    generation = _read_json(folder / "generation_config.json")
    eos = generation.get("eos_token_id")
    stop_ids += eos if isinstance(eos, list) else [eos]
    return list(dict.fromkeys(tokens[i] for i in stop_ids if isinstance(i, int) and i < vocab_size))


def _weights(folder: Path) -> Iterator[tuple[str, Any]]:
    """(HF name, float32 numpy array) for every tensor of the folder's safetensors files."""
    import torch
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{folder}: no *.safetensors weights")
    for file in files:
        with safe_open(str(file), framework="pt") as source:
            for name in source.keys():
                yield name, source.get_tensor(name).to(torch.float32).numpy()


def _permute(weights: Any, heads: int) -> Any:
    """llama.cpp's ``LlamaModel.permute``: rotary halves interleaved per head."""
    shape = weights.shape
    return (
        weights.reshape(heads, 2, shape[0] // heads // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)
    )


def _encode(weights: Any, qtype: Any) -> tuple[Any, Any]:
    """(data, ggml type) for one tensor: 1-D stays f32, q8_0 falls back to f16 on odd rows."""
    import gguf

    types = gguf.GGMLQuantizationType
    if weights.ndim <= 1 or qtype == types.F32:
        return np.ascontiguousarray(weights, dtype=np.float32), types.F32
    if qtype == types.F16:
        return np.ascontiguousarray(weights, dtype=np.float16), types.F16
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    if weights.shape[-1] % block:
        return np.ascontiguousarray(weights, dtype=np.float16), types.F16
    return gguf.quants.quantize(np.ascontiguousarray(weights), qtype), qtype


def _add_tensors(writer: Any, folder: Path, config: dict[str, Any], arch: str, qtype: Any) -> None:
    import gguf

    permute = _ARCHITECTURES[_architecture(config)][1]
    blocks = int(config["num_hidden_layers"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    tied = bool(config.get("tie_word_embeddings", False))
    model_arch = next(key for key, value in gguf.MODEL_ARCH_NAMES.items() if value == arch)
    names = gguf.get_tensor_name_map(model_arch, blocks)
    written = 0
    for name, weights in _weights(folder):
        if name.endswith(".rotary_emb.inv_freq") or (tied and name == "lm_head.weight"):
            continue
        base, dot, suffix = name.rpartition(".")
        if suffix not in ("weight", "bias"):
            base, dot, suffix = name, "", ""
        mapped = names.get_name(base)
        if mapped is None:
            raise ValueError(f"{folder}: tensor {name!r} has no GGUF name for {arch}")
        if permute and mapped.endswith(".attn_q"):
            weights = _permute(weights, heads)
        elif permute and mapped.endswith(".attn_k"):
            weights = _permute(weights, kv_heads)
        data, dtype = _encode(weights, qtype)
        writer.add_tensor(f"{mapped}{dot}{suffix}", data, raw_dtype=dtype)
        written += 1
    if not written:
        raise ValueError(f"{folder}: the safetensors files hold no tensors")


def _ollama_template(template: str) -> str | None:
    """Ollama's Go template for a chat template in a format it recognizes, else None."""
    if "<|im_start|>" in template and "<|im_end|>" in template:
        return (
            "{{- if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}"
            "{{- range .Messages }}"
            '{{- if ne .Role "system" }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n'
            "{{ end }}{{- end }}<|im_start|>assistant\n"
        )
    if "<|start_header_id|>" in template and "<|eot_id|>" in template:
        return (
            "{{- if .System }}<|start_header_id|>system<|end_header_id|>\n\n"
            "{{ .System }}<|eot_id|>{{ end }}"
            '{{- range .Messages }}{{- if ne .Role "system" }}'
            "<|start_header_id|>{{ .Role }}<|end_header_id|>\n\n{{ .Content }}<|eot_id|>"
            "{{- end }}{{- end }}<|start_header_id|>assistant<|end_header_id|>\n\n"
        )
    return None


def _modelfile(model_name: str, chat_template: str | None, stops: list[str]) -> str:
    lines = [f"FROM ./{model_name}.gguf", ""]
    translated = _ollama_template(chat_template) if chat_template else None
    if translated is not None:
        lines += [
            "# Translated from the model's chat template (plain turns; tool definitions and",
            "# tool calls are not rendered: delete TEMPLATE to let Ollama use the GGUF's own",
            "# tokenizer.chat_template instead).",
            f'TEMPLATE """{translated}"""',
        ]
    else:
        lines += [
            "# No TEMPLATE: the chat template could not be translated to Ollama's Go template;",
            "# Ollama uses the GGUF's own tokenizer.chat_template.",
        ]
    lines.append("")
    lines += [f"PARAMETER stop {json.dumps(stop)}" for stop in stops]
    return "\n".join(lines) + "\n"


def write_gguf(
    merged_folder: Path, out_dir: Path, *, gguf_type: str = "f16", model_name: str
) -> Path:
    """Write ``merged_folder`` as ``out_dir/{model_name}.gguf`` (and ``out_dir/Modelfile``).

    ``gguf_type``: one of ``SUPPORTED_TYPES`` (``f32``, ``f16``, ``bf16``, ``q8_0``). An
    architecture outside ``SUPPORTED_ARCHITECTURES`` raises ``UnsupportedArchitecture``;
    nothing is written before the folder has been checked, and the GGUF file appears only
    once complete.

    Example:
        >>> write_gguf(Path("merged"), Path("out"), gguf_type="q8_0", model_name="m")  # needs files: a merged model folder  # doctest: +SKIP
        PosixPath('out/m.gguf')
    """
    import gguf

    folder = Path(merged_folder)
    types = _types()
    if gguf_type not in types:
        raise ValueError(
            f"unsupported gguf_type {gguf_type!r}: use one of {', '.join(SUPPORTED_TYPES)}"
        )
    # A file name for the GGUF and Modelfile's FROM line: no folders, no spaces, no dotfile.
    if not re.fullmatch(r"[^./\\\s\x00][^/\\\s\x00]*", model_name or ""):
        raise ValueError(
            f"model_name {model_name!r} must be a file name: no '/', '\\', spaces or leading '.'"
        )
    qtype, file_type = types[gguf_type]
    config = _read_json(folder / "config.json")
    if not config:
        raise ValueError(f"{folder}: no config.json")
    arch = _ARCHITECTURES[_architecture(config)][0]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{model_name}.gguf"
    handle, staging = tempfile.mkstemp(prefix=f".{model_name}-", suffix=".gguf", dir=out_dir)
    os.close(handle)
    # Tensors spool to a temporary file as they are added: one in memory at a time.
    writer = gguf.GGUFWriter(staging, arch, use_temp_file=True)
    try:
        writer.add_name(model_name)
        writer.add_file_type(int(file_type))
        if gguf_type == "q8_0":
            writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        rope_factors = _add_hyperparameters(writer, config, arch)
        stops = _add_tokenizer(writer, folder, int(config["vocab_size"]))
        if rope_factors is not None:
            writer.add_tensor(
                gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", rope_factors
            )
        _add_tensors(writer, folder, config, arch, qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(staging, target)
    except BaseException:
        writer.close()
        Path(staging).unlink(missing_ok=True)
        raise
    template = _template(folder)
    (out_dir / "Modelfile").write_text(_modelfile(model_name, template, stops), encoding="utf-8")
    return target


def _template(folder: Path) -> str | None:
    config = _read_json(folder / "tokenizer_config.json")
    template = config.get("chat_template")
    if isinstance(template, str):
        return template
    jinja = folder / "chat_template.jinja"
    return jinja.read_text(encoding="utf-8") if jinja.is_file() else None


__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "SUPPORTED_TYPES",
    "UnsupportedArchitecture",
    "write_gguf",
]
