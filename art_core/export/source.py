"""The model an export reads: its folder, its ``model.json`` and its base model."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from art_core.embedded import resolve_base_model
from art_core.model_folder import ModelFolder

# Embedded base models that are a published Hugging Face model: an adapter exported from one
# names the hub id, so it loads anywhere without shipping the base. (smollm2-135m is built
# from the Q4_1 GGUF of that model, dequantized: close to, not bit-equal with, the hub's
# weights.)
HUB_IDS: dict[str, str] = {"smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct"}


@dataclass(frozen=True)
class SourceModel:
    """A trained model's folder and what ``model.json`` says of it.

    ``base_path`` is the resolved local Hugging Face folder of the base model (built when an
    embedded one is not cached yet); ``hub_id`` the base's Hugging Face id when it has one.
    """

    folder: ModelFolder
    project: str
    name: str
    base_model: str
    base_path: Path
    hub_id: str | None

    def as_json(self) -> dict[str, Any]:
        return {"project": self.project, "name": self.name, "folder": str(self.folder.root)}

    def base_json(self) -> dict[str, Any]:
        return {"name": self.base_model, "path": str(self.base_path), "hub_id": self.hub_id}


def default_art_path(folder: ModelFolder) -> Path:
    """The art folder a model folder lives in (``{art_path}/{project}/models/{name}``)."""
    return folder.root.parent.parent.parent


def open_source(model_dir: str | Path | ModelFolder) -> tuple[ModelFolder, dict[str, Any]]:
    """The model folder and its ``model.json``; ``FileNotFoundError`` when it is not one."""
    folder = model_dir if isinstance(model_dir, ModelFolder) else ModelFolder(Path(model_dir))
    folder = ModelFolder(folder.root.expanduser().resolve())
    if not folder.root.is_dir():
        raise FileNotFoundError(f"{folder.root}: no such model folder")
    if not folder.model_json.is_file():
        raise FileNotFoundError(
            f"{folder.root} is not a model folder (no model.json): give "
            "{art_path}/{project}/models/{name}"
        )
    try:
        meta = json.loads(folder.model_json.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{folder.model_json} is not readable JSON ({exc})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("base_model"), str):
        raise ValueError(f"{folder.model_json} names no base_model")
    return folder, meta


def resolve_source(folder: ModelFolder, meta: dict[str, Any], art_path: Path) -> SourceModel:
    """Resolve the base model of ``folder`` (as the backend that trained it did)."""
    base_model = str(meta["base_model"])
    base_path = resolve_base_model(base_model, art_path)
    return SourceModel(
        folder=folder,
        project=str(meta.get("project") or folder.root.parent.parent.name),
        name=str(meta.get("name") or folder.root.name),
        base_model=base_model,
        base_path=Path(base_path),
        hub_id=HUB_IDS.get(base_model),
    )
