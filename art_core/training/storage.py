"""Crash-safe files of a model folder: ``history.jsonl`` and the trajectory logs.

Whole files are written to a temporary name in the same folder and renamed over the target
(``os.replace``, atomic on POSIX and Windows), so a reader or a crash never sees half a file.
The history is append-only and shared with other writers, so it is appended line by line.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from art_core.files import append_line, atomic_write_text
from art_core.trajectories import TrajectoryGroup

__all__ = [
    "append_jsonl",
    "atomic_write_text",
    "read_jsonl",
    "read_trajectory_groups",
    "write_trajectory_groups",
]


def append_jsonl(path: Path, records: Iterable[Mapping[str, Any]]) -> None:
    """Append JSON records to ``path``, one line each, never rewriting earlier lines.

    Each line goes out in one ``O_APPEND`` write (``art_core.files.append_line``): other
    writers of the same history (the backend logging validation metrics) may append at the
    same moment, and a rewrite-and-rename would drop their lines.

    Example:
        >>> append_jsonl(Path("/tmp/history.jsonl"), [{"step": 1, "train/loss": 0.5}])  # doctest: +SKIP
    """
    for record in records:
        append_line(path, json.dumps(dict(record), allow_nan=False))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """All records of a JSONL file ([] when it does not exist); blank lines are skipped."""
    if not path.exists():
        return []
    return [
        json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
    ]


def write_trajectory_groups(path: Path, groups: Iterable[TrajectoryGroup]) -> None:
    """Save groups as JSONL, one ``TrajectoryGroup`` JSON per line (loadable without pickle).

    Example:
        >>> write_trajectory_groups(Path("/tmp/0000.jsonl"), [TrajectoryGroup()])  # doctest: +SKIP
    """
    atomic_write_text(path, "".join(group.model_dump_json() + "\n" for group in groups))


def read_trajectory_groups(path: Path) -> list[TrajectoryGroup]:
    """Load groups written by ``write_trajectory_groups``."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [TrajectoryGroup.model_validate_json(line) for line in lines if line.strip()]
