"""Token text for the token view: the base model's own tokenizer, found without building it.

The viewer never resolves a base model (that may build or convert one): it looks for a
``tokenizer.json`` where one already is: the base model folder recorded in the latest
checkpoint's trainer state, the art folder's built embedded models, or a local path named in
``model.json``. It loads it with the ``tokenizers`` library (no transformers import, a few
milliseconds), once per file.
"""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path
from typing import Any

from art_core.embedded import models_dir
from art_core.ui.folder import ModelRef, model_info

logger = logging.getLogger(__name__)


def _stamp(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def tokenizer_candidates(model: ModelRef, art_path: Path) -> list[Path]:
    """Folders that may hold the model's ``tokenizer.json``, most specific first (looked up
    again only when the checkpoints folder or ``model.json`` changed: finding the latest
    checkpoint checks every checkpoint folder's files)."""
    stamps = (_stamp(model.folder.checkpoints), _stamp(model.folder.model_json))
    return list(_candidates(model, art_path, stamps))


@functools.lru_cache(maxsize=64)
def _candidates(model: ModelRef, art_path: Path, stamps: tuple[int, int]) -> tuple[Path, ...]:
    candidates: list[Path] = []
    latest = model.folder.latest_checkpoint()
    if latest is not None:
        try:
            state = json.loads((latest[1] / "trainer_state.json").read_text(encoding="utf-8"))
            if isinstance(state, dict) and isinstance(state.get("base_model"), str):
                candidates.append(Path(state["base_model"]))
        except (OSError, ValueError):
            pass
    info, _ = model_info(model)
    name = info.get("base_model")
    if isinstance(name, str) and name and "\x00" not in name:
        for root in (models_dir(art_path), art_path / "base_models"):
            if "/" not in name and name not in (".", ".."):
                candidates.append(root / name)
        candidates.append(Path(name).expanduser())
    return tuple(candidates)


@functools.lru_cache(maxsize=16)
def _load(path: str, stamp: float) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)


def find_tokenizer(model: ModelRef, art_path: Path) -> tuple[Any | None, str]:
    """``(tokenizer, where)`` or ``(None, why not)``; blocking, run it off the event loop."""
    tried = []
    for folder in tokenizer_candidates(model, art_path):
        path = folder / "tokenizer.json"
        tried.append(str(folder))
        try:
            stamp = path.stat().st_mtime
        except OSError:
            continue
        try:
            return _load(str(path), stamp), str(path)
        except Exception as exc:  # a damaged tokenizer file: say so, show ids instead
            logger.warning("cannot load %s: %s", path, exc)
            return None, f"{path} cannot be loaded ({exc})"
    where = ", ".join(tried) if tried else "no base model is recorded"
    return None, f"no tokenizer.json found (looked in: {where}); token ids are shown instead"


def token_texts(tokenizer: Any | None, ids: list[int]) -> list[str]:
    """Each id's own text (special tokens included), or ``#id`` without a tokenizer."""
    if tokenizer is None:
        return [f"#{i}" for i in ids]
    return list(tokenizer.decode_batch([[i] for i in ids], skip_special_tokens=False))


def text_of(tokenizer: Any | None, ids: list[int]) -> str:
    """The text of a run of ids, or a count of them without a tokenizer."""
    if tokenizer is None:
        return f"[{len(ids)} tokens]"
    return str(tokenizer.decode(ids, skip_special_tokens=False))
