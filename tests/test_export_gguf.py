"""``art_core.export.gguf``: merged Hugging Face folders written as GGUF, read back by
transformers' own GGUF loader (weights, greedy tokens, tokenizer, chat template), plus the
Ollama Modelfile and the refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from art_core.embedded import resolve_base_model
from art_core.export.gguf import (
    SUPPORTED_ARCHITECTURES,
    SUPPORTED_TYPES,
    UnsupportedArchitecture,
    write_gguf,
)

TEXTS = [
    "hello world",
    "<|im_start|>user\nHé, ça va? 日本語 🙂<|im_end|>",
    "  two spaces\n\n\tand tabs",
    "plain<tool_call>x</tool_call>",
]
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Say something about the weather."},
]


def _perturbed(name: str, target: Path, art_path: Path) -> Path:
    """``name``'s tiny model with seeded noise on every weight (norms included), saved to
    ``target`` with the source's tokenizer and chat template files."""
    from transformers import AutoModelForCausalLM

    source = resolve_base_model(name, art_path)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            parameter.add_(noise * 0.3)
    model.save_pretrained(target)
    for file in source.iterdir():
        if file.name.startswith(("tokenizer", "chat_template")):
            shutil.copy(file, target / file.name)
    return target


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("export-gguf")
    return {
        name: _perturbed(name, root / name, root / "art")
        for name in ("tiny-random", "tiny-qwen2.5", "tiny-llama3")
    }


def _load(out_dir: Path, file: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out_dir, gguf_file=file.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(out_dir, gguf_file=file.name)
    return model.eval(), tokenizer


def _greedy(model: Any, ids: Any) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            ids, do_sample=False, max_new_tokens=12, min_new_tokens=12, pad_token_id=0
        )
    return [int(token) for token in out[0, ids.shape[1] :]]


def _source(folder: Path, rounding: Any = None) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    if rounding is not None:  # what the GGUF stores: 2-D weights rounded, 1-D kept f32
        with torch.no_grad():
            for parameter in model.parameters():
                if parameter.ndim == 2:
                    parameter.copy_(parameter.to(rounding).to(torch.float32))
    return model, AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize(
    ("name", "gguf_type"),
    [
        ("tiny-random", "f32"),
        ("tiny-random", "f16"),
        ("tiny-random", "bf16"),
        ("tiny-qwen2.5", "f32"),
        ("tiny-llama3", "f32"),
    ],
)
def test_round_trip_through_transformers(
    folders: dict[str, Path], tmp_path: Path, name: str, gguf_type: str
) -> None:
    folder = folders[name]
    path = write_gguf(folder, tmp_path, gguf_type=gguf_type, model_name=f"{name}-{gguf_type}")
    assert path == tmp_path / f"{name}-{gguf_type}.gguf" and path.is_file()
    rounding = {"f32": None, "f16": torch.float16, "bf16": torch.bfloat16}[gguf_type]
    source, source_tokenizer = _source(folder, rounding)
    model, tokenizer = _load(tmp_path, path)

    # Weights: bit-exact against the source (2-D weights rounded as the file stores them).
    expected, actual = source.state_dict(), model.state_dict()
    assert sorted(actual) == sorted(expected)
    for key, value in expected.items():
        assert torch.equal(actual[key], value), key
    assert model.config.tie_word_embeddings == source.config.tie_word_embeddings

    # Tokenizer: same ids (special tokens, non-ASCII, whitespace), same chat template.
    # The family's own special tokens, as text. (Not "<|endoftext|>" where the vocabulary has
    # none: transformers' GGUF tokenizer then adds it as an extra special token, GPT2Tokenizer's
    # default unk/bos/eos, whatever the file says.)
    specials = [source_tokenizer.eos_token, source_tokenizer.pad_token, source_tokenizer.bos_token]
    for text in [*TEXTS, "".join(f"{token} x" for token in specials if token)]:
        assert tokenizer.encode(text) == source_tokenizer.encode(text), text
    assert tokenizer.chat_template == source_tokenizer.chat_template
    assert tokenizer.eos_token == source_tokenizer.eos_token

    # Greedy generation on a chat-templated prompt: the same tokens.
    ids = source_tokenizer.apply_chat_template(
        MESSAGES, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    assert _greedy(model, ids) == _greedy(source, ids)


def test_f16_weights_close_to_unrounded_source(folders: dict[str, Path], tmp_path: Path) -> None:
    folder = folders["tiny-random"]
    path = write_gguf(folder, tmp_path, model_name="half")  # f16 is the default
    source, _ = _source(folder)
    model, _ = _load(tmp_path, path)
    for key, value in source.state_dict().items():
        torch.testing.assert_close(model.state_dict()[key], value, rtol=1e-3, atol=1e-3)


def test_q8_0_loads_and_generates(folders: dict[str, Path], tmp_path: Path) -> None:
    folder = folders["tiny-random"]
    path = write_gguf(folder, tmp_path, gguf_type="q8_0", model_name="q8")
    assert path.stat().st_size < write_gguf(folder, tmp_path, model_name="f16").stat().st_size
    source, source_tokenizer = _source(folder)
    model, _ = _load(tmp_path, path)
    for key, value in source.state_dict().items():  # 8-bit blocks: within ~1% of each row's max
        scale = value.abs().max().item()
        torch.testing.assert_close(model.state_dict()[key], value, rtol=0, atol=0.01 * scale)
    ids = source_tokenizer.apply_chat_template(
        MESSAGES, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    assert len(_greedy(model, ids)) == 12


def test_metadata_for_llama_cpp(folders: dict[str, Path], tmp_path: Path) -> None:
    from gguf import GGUFReader, TokenType

    folder = folders["tiny-llama3"]
    path = write_gguf(folder, tmp_path, gguf_type="f32", model_name="meta")
    reader = GGUFReader(path)

    def field(key: str) -> Any:
        return reader.fields[key].contents()

    config = json.loads((folder / "config.json").read_text())
    assert field("general.architecture") == "llama"
    assert field("general.name") == "meta"
    assert field("llama.context_length") == config["max_position_embeddings"]
    assert field("llama.embedding_length") == config["hidden_size"]
    assert field("llama.block_count") == config["num_hidden_layers"]
    assert field("llama.feed_forward_length") == config["intermediate_size"]
    assert field("llama.attention.head_count") == config["num_attention_heads"]
    assert field("llama.attention.head_count_kv") == config["num_key_value_heads"]
    assert field("llama.vocab_size") == config["vocab_size"]
    assert field("tokenizer.ggml.model") == "gpt2"
    assert field("tokenizer.ggml.pre") == "gpt-2"
    assert field("tokenizer.ggml.add_bos_token") is True  # Llama 3 adds <|begin_of_text|>
    tokens = field("tokenizer.ggml.tokens")
    assert len(tokens) == config["vocab_size"]
    assert tokens[field("tokenizer.ggml.bos_token_id")] == "<|begin_of_text|>"
    assert tokens[field("tokenizer.ggml.eos_token_id")] == "<|eot_id|>"
    types = field("tokenizer.ggml.token_type")
    assert types[tokens.index("<|eot_id|>")] == TokenType.CONTROL
    assert field("tokenizer.ggml.merges")
    names = {tensor.name for tensor in reader.tensors}
    assert "token_embd.weight" in names and "output.weight" not in names  # tied
    assert "blk.1.attn_q.weight" in names and "blk.1.ffn_down.weight" in names

    modelfile = (tmp_path / "Modelfile").read_text()
    assert modelfile.startswith("FROM ./meta.gguf\n")
    assert "<|start_header_id|>" in modelfile
    for stop in ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"):
        assert f'PARAMETER stop "{stop}"' in modelfile


def test_qwen2_biases_and_chatml_modelfile(folders: dict[str, Path], tmp_path: Path) -> None:
    from gguf import GGUFReader

    path = write_gguf(folders["tiny-qwen2.5"], tmp_path, model_name="qwen")
    reader = GGUFReader(path)
    names = {tensor.name for tensor in reader.tensors}
    assert {"blk.0.attn_q.bias", "blk.0.attn_k.bias", "blk.0.attn_v.bias"} <= names
    assert reader.fields["general.architecture"].contents() == "qwen2"
    assert reader.fields["tokenizer.ggml.add_bos_token"].contents() is False
    modelfile = (tmp_path / "Modelfile").read_text()
    assert modelfile.startswith("FROM ./qwen.gguf\n")
    assert 'TEMPLATE """' in modelfile and "<|im_start|>" in modelfile
    assert 'PARAMETER stop "<|im_end|>"' in modelfile
    assert 'PARAMETER stop "<|endoftext|>"' in modelfile


def test_untranslatable_template_leaves_a_comment(folders: dict[str, Path], tmp_path: Path) -> None:
    folder = tmp_path / "odd"
    shutil.copytree(folders["tiny-random"], folder)
    (folder / "chat_template.jinja").write_text(
        "{% for m in messages %}### {{ m.role }}: {{ m.content }}\n{% endfor %}"
    )
    out = tmp_path / "out"
    write_gguf(folder, out, model_name="odd")
    modelfile = (out / "Modelfile").read_text()
    assert "TEMPLATE" not in modelfile.replace("# No TEMPLATE", "")
    assert "tokenizer.chat_template" in modelfile
    assert (out / "odd.gguf").is_file()


def test_unsupported_architecture(folders: dict[str, Path], tmp_path: Path) -> None:
    folder = tmp_path / "gemma"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["Gemma3ForCausalLM"]}))
    with pytest.raises(UnsupportedArchitecture, match="Gemma3ForCausalLM") as caught:
        write_gguf(folder, tmp_path / "out", model_name="g")
    assert all(name in str(caught.value) for name in SUPPORTED_ARCHITECTURES)
    assert isinstance(caught.value, ValueError)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("gguf_type", ["q4_k_m", "F16", "fp16", ""])
def test_bad_gguf_type(folders: dict[str, Path], tmp_path: Path, gguf_type: str) -> None:
    with pytest.raises(ValueError, match="q8_0") as caught:
        write_gguf(folders["tiny-random"], tmp_path, gguf_type=gguf_type, model_name="m")
    assert all(name in str(caught.value) for name in SUPPORTED_TYPES)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("model_name", ["", "a b", "../up", ".hidden", "dir/name"])
def test_bad_model_name(folders: dict[str, Path], tmp_path: Path, model_name: str) -> None:
    with pytest.raises(ValueError, match="must be a file name"):
        write_gguf(folders["tiny-random"], tmp_path / "out", model_name=model_name)
    assert not (tmp_path / "out").exists()
