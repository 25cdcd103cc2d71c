"""``format="peft"``: a clean PEFT adapter folder.

``adapter_model.safetensors`` and ``adapter_config.json`` from the checkpoint (no optimizer
or trainer state), plus the gateway's tokenizer and chat template. ``base_model_name_or_path``
is the base's Hugging Face id when it has one; otherwise the base is copied into
``{out}/base/`` and named by the absolute path it will have once the export is in place, so
``PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), out)`` loads it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from art_core.export.source import SourceModel
from art_core.export.tokenizer import save_gateway_tokenizer
from art_core.files import atomic_write_text
from art_core.model_folder import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE

BASE_FOLDER = "base"
# Files of a cached embedded base that are bookkeeping of the cache, not of the model.
NOT_COPIED = (".art-complete", "*.lock")
# The files of a model folder that hold its weights.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def write_peft(
    checkpoint: Path, source: SourceModel, staging: Path, final_out: Path, *, portable: bool = False
) -> str:
    """Write the adapter export of ``checkpoint`` into ``staging`` (to be renamed to
    ``final_out``); return the ``base_model_name_or_path`` it names. ``portable``: a copied
    base is named ``base`` (relative to the export; ``archive.relocate`` names it by its
    absolute path where the export lands), not by ``final_out``."""
    config = json.loads((checkpoint / ADAPTER_CONFIG_FILE).read_text(encoding="utf-8"))
    if source.hub_id is not None:
        base_ref = source.hub_id
    else:
        shutil.copytree(
            source.base_path,
            staging / BASE_FOLDER,
            ignore=shutil.ignore_patterns(*NOT_COPIED),
        )
        base_ref = BASE_FOLDER if portable else str(final_out / BASE_FOLDER)
    config["base_model_name_or_path"] = base_ref
    shutil.copyfile(checkpoint / ADAPTER_WEIGHTS_FILE, staging / ADAPTER_WEIGHTS_FILE)
    atomic_write_text(staging / ADAPTER_CONFIG_FILE, json.dumps(config, indent=2) + "\n")
    save_gateway_tokenizer(source.base_path, staging)
    return base_ref
