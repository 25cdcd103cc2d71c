"""Any GGUF file as a base model: checked, dequantized once, saved as a Hugging Face folder.

``resolve_base_model("/models/qwen.gguf")`` lands here. Loading a GGUF file with transformers
dequantizes every tensor (tens of seconds for a 0.5B model), so it is done once and the result
is cached under the models folder, in a folder named after the file's stem and a hash of its
resolved path, size and modification time (a changed file gets a new folder). The folder holds
plain float weights (bf16 above ~300M parameters, else fp32), the tokenizer and chat template
the GGUF file carries, and ``gguf_source.json`` (path, size, mtime, sha256 of the file).

A file that cannot be used (not GGUF, truncated, an architecture transformers cannot load)
raises ``ValueError`` naming the file and the problem, before anything is written.

Example:
    >>> convert_gguf(Path("/models/qwen.gguf"), Path("/tmp/qwen-hf"))  # needs files: a GGUF file  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

MAGIC = b"GGUF"
# Above this many parameters the folder is saved in bf16 (half the disk and load time; the
# quantized source had less precision than bf16 anyway); small models stay fp32.
BF16_ABOVE_PARAMETERS = 300_000_000
SOURCE_FILE = "gguf_source.json"
# llama.cpp spells some architectures differently from transformers' GGUF loader.
_ARCHITECTURE_ALIASES = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss"}


def is_gguf_name(name: str) -> bool:
    """Whether ``name`` asks for a GGUF file (by its suffix)."""
    return name.lower().endswith(".gguf")


def gguf_model_name(path: Path) -> str:
    """The cache folder's name for ``path``: its stem and a hash of path, size and mtime.

    Example:
        >>> _ = Path("Qwen 0.5B.gguf").write_bytes(b"GGUF")
        >>> gguf_model_name(Path("Qwen 0.5B.gguf"))
        'Qwen_0.5B-...'
    """
    resolved = Path(path).expanduser().resolve()
    stat = resolved.stat()
    key = f"{resolved}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", resolved.stem).strip(".") or "model"
    return f"{stem}-{hashlib.sha256(key).hexdigest()[:12]}"


def check_gguf(path: Path) -> str:
    """The architecture of a complete GGUF file transformers can load; ``ValueError`` if not.

    Reads only the header and tensor index (memory-mapped), though a tokenizer's vocabulary in
    the header takes seconds to read for a large vocabulary (13 s on one core for Qwen2.5's
    151k tokens).
    """
    return read_gguf(path)[0]


def read_gguf(path: Path) -> tuple[str, Any]:
    """``check_gguf``'s architecture and the ``gguf.GGUFReader`` that read the file, for
    ``convert_gguf(reader=...)`` to reuse; ``ValueError`` as ``check_gguf``."""
    from gguf import GGUFReader
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such GGUF file")
    with path.open("rb") as source:
        magic = source.read(4)
    if magic != MAGIC:
        raise ValueError(f"{path} is not a GGUF file: it starts with {magic!r}, not {MAGIC!r}")
    try:
        reader = GGUFReader(path)
    except Exception as exc:  # the reader raises many kinds of errors on damaged files
        # In practice a cut-off file: the reader maps each tensor and finds too few bytes.
        raise ValueError(
            f"{path} is truncated or damaged: reading it as GGUF failed: {exc}"
        ) from exc
    size = path.stat().st_size
    end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    if not reader.tensors or end > size:
        raise ValueError(
            f"{path} is truncated: its tensors need {end} bytes, the file has {size}"
            if reader.tensors
            else f"{path} holds no tensors"
        )
    field = reader.fields.get("general.architecture")
    if field is None:
        raise ValueError(f"{path} has no general.architecture: not a model GGUF file")
    architecture = str(field.contents())
    normalized = _ARCHITECTURE_ALIASES.get(architecture, architecture)
    if normalized not in GGUF_SUPPORTED_ARCHITECTURES:
        supported = sorted(set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"})
        raise ValueError(
            f"{path}: architecture {architecture!r} cannot be loaded by transformers' GGUF "
            f"support (supported: {', '.join(supported)})"
        )
    return architecture, reader


@contextlib.contextmanager
def _one_reader(path: Path, reader: Any) -> Iterator[None]:
    """While inside, ``gguf.GGUFReader(path)`` answers ``reader`` (other files: a new reader).

    transformers reads a GGUF file once for the config, once for the tokenizer and once for
    the weights (``load_gguf_checkpoint`` imports ``gguf.GGUFReader`` at each call), and
    reading the header is most of a conversion: 13 of the 24 s that dequantizing and saving
    Qwen2.5-0.5B takes on one core, 4 reads of it 53 s. The reader is read-only (a memory map
    and the parsed header), so sharing it changes nothing transformers sees.
    """
    import gguf

    real = gguf.GGUFReader

    def shared(file: Any, mode: Any = "r") -> Any:
        if mode == "r" and Path(file).resolve() == path:
            return reader
        return real(file, mode)

    gguf.GGUFReader = shared  # type: ignore[misc,assignment]
    try:
        yield
    finally:
        gguf.GGUFReader = real  # type: ignore[misc]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as source:
        while chunk := source.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _drop_quantization(model: Any) -> None:
    # transformers keeps a GGUF-loaded model tagged as quantized (hf_quantizer and a
    # quantization_config with quant_method "gguf"); its weights are already dequantized
    # floats, and save_pretrained would otherwise go through the quantizer and write the tag.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def convert_gguf(source: Path, folder: Path, reader: Any | None = None) -> None:
    """Dequantize the GGUF file ``source`` and save model + tokenizer to ``folder``;
    ``reader``: ``read_gguf(source)``'s, when the caller already read the file.

    Example:
        >>> convert_gguf(Path("qwen.gguf"), Path(".art/base_models/qwen-1a2b3c4d5e6f"))  # needs files: a GGUF file  # doctest: +SKIP
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = Path(source).expanduser().resolve()
    if reader is None:
        architecture, reader = read_gguf(source)
    else:
        architecture = str(reader.fields["general.architecture"].contents())
    stat = source.stat()
    logger.warning("converting %s (%s) to %s (once)", source, architecture, folder)
    try:
        with _one_reader(source, reader):
            tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
            model: Any = AutoModelForCausalLM.from_pretrained(
                source.parent, gguf_file=source.name, dtype=torch.float32
            )
    except Exception as exc:
        raise ValueError(
            f"{source}: transformers could not load it ({architecture}): {exc}"
        ) from exc
    _drop_quantization(model)
    parameters = sum(p.numel() for p in model.parameters())
    dtype = torch.bfloat16 if parameters > BF16_ABOVE_PARAMETERS else torch.float32
    model.to(dtype)
    model.config.dtype = dtype
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    record = {
        "source": str(source),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "sha256": sha256_of(source),
        "architecture": architecture,
        "parameters": parameters,
        "dtype": str(dtype).removeprefix("torch."),
    }
    (Path(folder) / SOURCE_FILE).write_text(json.dumps(record, indent=2) + "\n")


__all__ = ["check_gguf", "convert_gguf", "gguf_model_name", "is_gguf_name", "read_gguf"]
