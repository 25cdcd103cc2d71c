"""Base models that resolve offline: ``smollm2-135m``, ``tiny-random`` or a local folder.

Built models are cached under ``{art_path}/base_models/`` (or ``$ART_CORE_MODELS_DIR``), built
in a temporary folder and renamed into place, so a crash never leaves a half-written model
and concurrent processes wait for each other on a file lock.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

from art_core.embedded.smollm2 import convert_smollm2
from art_core.embedded.tiny_random import build_tiny_random

EMBEDDED_MODELS: dict[str, Callable[[Path], None]] = {
    "smollm2-135m": convert_smollm2,
    "tiny-random": lambda folder: build_tiny_random(folder, seed=0),
}
_COMPLETE_MARKER = ".art-complete"


def models_dir(art_path: str | Path = ".art") -> Path:
    """Where built embedded models are cached."""
    override = os.environ.get("ART_CORE_MODELS_DIR")
    return Path(override) if override else Path(art_path) / "base_models"


def resolve_base_model(name: str, art_path: str | Path = ".art") -> Path:
    """The local Hugging Face folder for ``name``, building an embedded model if needed.

    ``name`` is an embedded model (``smollm2-135m``, ``tiny-random``), ``tiny-random-<seed>``,
    or the path of a folder holding ``config.json``.

    Example:
        >>> resolve_base_model("tiny-random", "/tmp/art")  # doctest: +SKIP
        PosixPath('/tmp/art/base_models/tiny-random')
    """
    build = EMBEDDED_MODELS.get(name)
    if (
        build is None
        and name.startswith("tiny-random-")
        and name.removeprefix("tiny-random-").isdigit()
    ):
        seed = int(name.removeprefix("tiny-random-"))

        def build(folder: Path) -> None:
            build_tiny_random(folder, seed=seed)

    if build is None:
        folder = Path(name).expanduser()
        if (folder / "config.json").is_file():
            return folder.resolve()
        raise ValueError(
            f"unknown base model {name!r}: use one of {sorted(EMBEDDED_MODELS)}, "
            "'tiny-random-<seed>', or a local Hugging Face folder with a config.json "
            "(models are never downloaded at run time)"
        )
    target = models_dir(art_path) / name
    if (target / _COMPLETE_MARKER).exists():
        return target.resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / _COMPLETE_MARKER).exists():
            return target.resolve()
        staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
        try:
            build(staging)
            (staging / _COMPLETE_MARKER).write_text("ok\n")
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target.resolve()


__all__ = ["EMBEDDED_MODELS", "models_dir", "resolve_base_model"]
