"""``export.json``: what an export is and where it came from.

Written into every export folder::

    {"format_version": 1, "format": "peft" | "merged" | "gguf", "gguf_type": str (gguf only),
     "source": {"project", "name", "folder", "checkpoint"},
     "step": int, "selected_by": {"how": "step" | "best" | "latest", ...},
     "base_model": {"name", "path", "hub_id", "referenced_as"},
     "metrics": {name: value}, "history": [the history records stored under step],
     "files": [names], "art_core_version": str, "exported_at": ISO 8601 UTC}

Paths: a local export (``art-core export``, ``LocalBackend.export``) names absolute paths of
this machine (``source.folder``, ``source.checkpoint``, ``base_model.path``, and
``base_model.referenced_as`` when the base is copied into ``base/``). A downloaded export
(``RemoteBackend.export``; the server builds it ``portable``) names none of the server's:
``source.folder`` and ``base_model.path`` are relative to the server's art folder (null when
outside it), ``source.checkpoint`` to ``source.folder`` (``checkpoints/0003``), and
``referenced_as`` is ``base``, which the client rewrites to where the export landed.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
from pathlib import Path
from typing import Any

from art_core.files import atomic_write_text

MANIFEST_FILE = "export.json"
FORMAT_VERSION = 1


def library_version() -> str:
    """The installed ``art-core`` version ("unknown" when not installed as a package)."""
    try:
        return importlib.metadata.version("art-core")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def write_manifest(folder: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Complete ``manifest`` (version, time, the folder's files) and write it to
    ``folder/export.json``; return what was written."""
    full = {
        "format_version": FORMAT_VERSION,
        **manifest,
        "files": [
            *sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")),
            MANIFEST_FILE,
        ],
        "art_core_version": library_version(),
        "exported_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    atomic_write_text(folder / MANIFEST_FILE, json.dumps(full, indent=2, allow_nan=False) + "\n")
    return full
