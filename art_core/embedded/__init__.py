"""Base models that resolve offline: embedded names, a GGUF file, or a local folder.

Names: ``smollm2-135m``; ``tiny-random`` and ``tiny-random-<seed>``; ``tiny-<family>`` and
``tiny-<family>-<seed>`` for each family in ``families.FAMILIES`` (``tiny-qwen3``,
``tiny-gpt-oss-3``, ...); the path of a ``.gguf`` file (dequantized once); or the path of a
Hugging Face folder holding ``config.json``.

Built models are cached under ``{art_path}/base_models/`` (or ``$ART_CORE_MODELS_DIR``), built
in a temporary folder and renamed into place, so a crash never leaves a half-written model
and concurrent processes wait for each other on a file lock.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

from filelock import FileLock

from art_core.embedded.families import FAMILIES, build_tiny_family, family_fingerprint
from art_core.embedded.gguf import (
    convert_gguf,
    gguf_model_name,
    is_gguf_name,
    read_gguf,
)
from art_core.embedded.smollm2 import convert_smollm2
from art_core.embedded.tiny_random import build_tiny_random
from art_core.memory import return_freed_pages

EMBEDDED_MODELS: dict[str, Callable[[Path], None]] = {
    "smollm2-135m": convert_smollm2,
    "tiny-random": lambda folder: build_tiny_random(folder, seed=0),
    **{f"tiny-{family}": partial(build_tiny_family, family=family) for family in FAMILIES},
}
_COMPLETE_MARKER = ".art-complete"


def models_dir(art_path: str | Path = ".art") -> Path:
    """Where built embedded models are cached."""
    override = os.environ.get("ART_CORE_MODELS_DIR")
    return Path(override) if override else Path(art_path) / "base_models"


def _seeded(name: str) -> Callable[[Path], None] | None:
    """The builder of ``tiny-random-<seed>`` or ``tiny-<family>-<seed>`` (ASCII digits)."""
    base, _, seed = name.rpartition("-")
    if not (seed.isascii() and seed.isdigit()):
        return None
    if base == "tiny-random":
        return lambda folder: build_tiny_random(folder, seed=int(seed))
    family = base.removeprefix("tiny-")
    if base.startswith("tiny-") and family in FAMILIES:
        return lambda folder: build_tiny_family(folder, family, seed=int(seed))
    return None


def is_embedded_name(name: str) -> bool:
    """Whether ``name`` is an embedded model (one built here, never a path), seeds of at
    most 9 digits.

    Example:
        >>> is_embedded_name("tiny-qwen3-7"), is_embedded_name("tiny-random-²"), is_embedded_name("/etc")
        (True, False, False)
    """
    if name in EMBEDDED_MODELS:
        return True
    return _seeded(name) is not None and len(name.rpartition("-")[2]) <= 9


def _is_complete(target: Path, fingerprint: str) -> bool:
    marker = target / _COMPLETE_MARKER
    return marker.is_file() and marker.read_text().strip() == fingerprint


def _fingerprint(name: str) -> str:
    """What the embedded model ``name`` is built from ("ok" for those that never change)."""
    if name.startswith("tiny-"):
        family = name.removeprefix("tiny-")
        if family not in FAMILIES:
            family = family.rpartition("-")[0]
        if family in FAMILIES:
            return family_fingerprint(family)
    return "ok"


def _build_once(target: Path, build: Callable[[Path], None], fingerprint: str = "ok") -> Path:
    """``target``, built by ``build`` in a staging folder unless already complete.

    The completion marker holds ``fingerprint`` (what the folder was built from): a folder
    built from something else is built again.
    """
    if _is_complete(target, fingerprint):
        return target.resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if _is_complete(target, fingerprint):
            return target.resolve()
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            build(staging)
            # A build holds whole models in memory (a GGUF conversion: the de-quantized one,
            # ~2 GB for a 0.5B); freed now, their pages go back rather than stay resident.
            return_freed_pages()
            (staging / _COMPLETE_MARKER).write_text(fingerprint + "\n")
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target.resolve()


class BaseModelError(ValueError):
    """A ``base_model`` that names nothing this machine can load (an unknown name, a bad GGUF
    file, a folder without a model): the caller's input is wrong, nothing was written."""


def resolve_base_model(name: str, art_path: str | Path = ".art") -> Path:
    """See ``_resolve``; every failure of the name itself is a ``BaseModelError``.

    Example:
        >>> path = resolve_base_model("tiny-qwen3", ".art")  # built once, then cached
        >>> path.name, (path / "config.json").is_file()
        ('tiny-qwen3', True)
    """
    try:
        return _resolve(name, art_path)
    except BaseModelError:
        raise
    except ValueError as exc:
        raise BaseModelError(str(exc)) from exc


def _resolve(name: str, art_path: str | Path = ".art") -> Path:
    """The local Hugging Face folder for ``name``, building an embedded model if needed.

    ``name`` is an embedded model (``smollm2-135m``, ``tiny-random``, ``tiny-<family>``),
    ``tiny-random-<seed>``, ``tiny-<family>-<seed>``, the path of a ``.gguf`` file, or the
    path of a folder holding ``config.json``.

    Example:
        >>> path = resolve_base_model("tiny-qwen3", ".art")  # built once, then cached
        >>> path.name, (path / "config.json").is_file()
        ('tiny-qwen3', True)
    """
    build = EMBEDDED_MODELS.get(name) or _seeded(name)
    if build is not None:
        return _build_once(models_dir(art_path) / name, build, _fingerprint(name))
    if is_gguf_name(name):
        source = Path(name).expanduser().resolve()
        if not source.is_file():
            raise ValueError(f"{source}: no such GGUF file")
        target = models_dir(art_path) / gguf_model_name(source)
        if _is_complete(target, "ok"):
            return target.resolve()
        # A bad file fails here, before any folder or lock is made; the conversion reuses
        # what was read (the header of a large vocabulary takes seconds to read).
        _, reader = read_gguf(source)

        def convert(folder: Path) -> None:
            convert_gguf(source, folder, reader=reader)

        return _build_once(target, convert)
    folder = Path(name).expanduser()
    if (folder / "config.json").is_file():
        return folder.resolve()
    raise ValueError(
        f"unknown base model {name!r}: use one of {sorted(EMBEDDED_MODELS)}, "
        "'tiny-random-<seed>', 'tiny-<family>-<seed>', the path of a .gguf file, or a local "
        "Hugging Face folder with a config.json (models are never downloaded at run time)"
    )


__all__ = [
    "EMBEDDED_MODELS",
    "FAMILIES",
    "BaseModelError",
    "is_embedded_name",
    "models_dir",
    "resolve_base_model",
]
