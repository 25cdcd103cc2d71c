"""An export folder as one uncompressed tar, for ``RemoteBackend.export``: the server packs
the folder it built, the client unpacks it beside its ``out`` and renames it into place.

Unpacking trusts nothing in the archive: only regular files and folders, relative names
without ``..``, no links or devices, and at most ``max_bytes`` in all (checked before a byte
is written, from the members' headers, and by Python's ``data`` extraction filter).
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path, PurePosixPath

from art_core.export.manifest import MANIFEST_FILE
from art_core.export.peft_export import BASE_FOLDER
from art_core.files import atomic_write_text
from art_core.model_folder import ADAPTER_CONFIG_FILE


def pack(folder: Path, archive: Path) -> int:
    """Write ``folder``'s files into the tar ``archive`` (names relative to ``folder``);
    return its size in bytes.

    Example:
        >>> Path("exports/agent").mkdir(parents=True)
        >>> _ = Path("exports/agent/export.json").write_text("{}")
        >>> pack(Path("exports/agent"), Path("agent.tar"))  # a 10 KiB tar: headers and padding
        10240
    """
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(folder.rglob("*")):
            if path.is_symlink() or not (path.is_file() or path.is_dir()):
                continue
            tar.add(path, arcname=path.relative_to(folder).as_posix(), recursive=False)
    return archive.stat().st_size


def unpack(archive: Path, target: Path, *, max_bytes: int) -> None:
    """Extract ``archive`` into the (new, empty) folder ``target`` after checking every
    member; ``ValueError`` naming the first member that is not allowed.

    Example:
        >>> Path("exports/agent").mkdir(parents=True, exist_ok=True)
        >>> _ = Path("exports/agent/export.json").write_text("{}")
        >>> _ = pack(Path("exports/agent"), Path("agent.tar"))
        >>> unpack(Path("agent.tar"), Path("agent"), max_bytes=2**30)
        >>> sorted(p.name for p in Path("agent").iterdir())
        ['export.json']
    """
    with tarfile.open(archive, "r:") as tar:
        members = tar.getmembers()
        total = 0
        for member in members:
            name = PurePosixPath(member.name)
            if name.is_absolute() or ".." in name.parts or not name.parts:
                raise ValueError(
                    f"the export archive holds a path outside its folder: {member.name!r}"
                )
            if not (member.isfile() or member.isdir()):
                raise ValueError(f"the export archive holds {member.name!r}, which is not a file")
            total += member.size
            if total > max_bytes:
                raise ValueError(
                    f"the export archive unpacks to more than max_bytes={max_bytes} bytes"
                )
        if not any(m.name == MANIFEST_FILE for m in members):
            raise ValueError(f"the export archive has no {MANIFEST_FILE}: not an export")
        tar.extractall(target, members=members, filter="data")


def relocate(folder: Path, final: Path) -> None:
    """After an export folder moved (downloaded from a server): a PEFT adapter whose base
    was copied into ``base/`` names that folder by its new absolute path ``final / base``."""
    config_path = folder / ADAPTER_CONFIG_FILE
    if not (folder / BASE_FOLDER).is_dir() or not config_path.is_file():
        return
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["base_model_name_or_path"] = str(final / BASE_FOLDER)
    atomic_write_text(config_path, json.dumps(config, indent=2) + "\n")
    manifest_path = folder / MANIFEST_FILE
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    if isinstance(manifest.get("base_model"), dict):
        manifest["base_model"]["referenced_as"] = str(final / BASE_FOLDER)
    atomic_write_text(manifest_path, json.dumps(manifest, indent=2, allow_nan=False) + "\n")
