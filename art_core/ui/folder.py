"""What the viewer reads of an art folder: its models, their history, their steps.

Read-only by construction: nothing here opens a file for writing, creates a folder or
resolves a base model (which could build one). Every name that comes from a URL is looked up
among the folders that exist (``ArtFolder.model``), never joined into a path unchecked.

Damage is reported, not raised: a ``model.json`` that does not parse, history lines cut short,
a trajectories file with a broken line each become a ``problems`` entry next to whatever
could be read.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from art_core.model_folder import ModelFolder

# A model counts as "training now" while its records changed this recently.
ACTIVE_WITHIN_S = 60.0
# Names of projects and models the viewer lists (what a model folder may be named).
# (never "." or "..", nor hidden names: a URL's name is joined into a path only after this).
_NAME = re.compile(r"[A-Za-z0-9_@+=-][A-Za-z0-9._@+=-]{0,199}")
_STEP_FILE = re.compile(r"([0-9]{1,9})\.jsonl")
# A step file read at most this far: a damaged or hostile folder cannot exhaust memory.
MAX_STEP_FILE_BYTES = 1 << 30


class NotFound(LookupError):
    """A project, model, step or rollout that the folder does not hold (404)."""


@dataclass(frozen=True)
class ModelRef:
    """One model folder of the art folder."""

    project: str
    name: str
    folder: ModelFolder

    @property
    def key(self) -> str:
        return f"{self.project}/{self.name}"


@dataclass
class History:
    """``history.jsonl`` as read: its records and what could not be read."""

    records: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    size: int = 0


def finite_number(value: Any) -> float | None:
    """``value`` as a float when it is a finite JSON number (not a bool), else None: what
    every reader of a record's numbers here takes a value through.

    Example:
        >>> finite_number(3), finite_number(True), finite_number(float("nan")), finite_number("1")
        (3.0, None, None, None)
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def read_history(path: Path, *, start: int = 0) -> History:
    """The records of a history file from byte ``start`` on, skipping (and naming) lines that
    are not JSON objects; a last line without its newline is being written and is left for
    the next read.

    Example:
        >>> read_history(Path("/nonexistent/history.jsonl")).records
        []
    """
    history = History()
    try:
        with path.open("rb") as file:
            file.seek(start)
            data = file.read()
    except FileNotFoundError:
        return history
    except OSError as exc:
        history.problems.append(f"history.jsonl cannot be read: {exc}")
        return history
    complete = data[: data.rfind(b"\n") + 1]
    history.size = start + len(complete)
    for number, line in enumerate(complete.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            history.records.append(record)
        else:
            history.problems.append(
                f"history.jsonl: a line ({len(line)} bytes) is not a JSON record with a step"
                + ("" if start else f" (line {number})")
            )
    return history


def step_files(folder: ModelFolder) -> dict[str, list[int]]:
    """The steps with a trajectories file, per split (``{"train": [0, 1, ...], "val": ...}``)."""
    root = folder / "trajectories"
    found: dict[str, list[int]] = {}
    try:
        splits = sorted(entry for entry in root.iterdir() if entry.is_dir())
    except OSError:
        return found
    for split in splits:
        if not _NAME.fullmatch(split.name):
            continue
        steps = []
        with os.scandir(split) as entries:
            for entry in entries:
                match = _STEP_FILE.fullmatch(entry.name)
                if match and entry.is_file():
                    steps.append(int(match.group(1)))
        found[split.name] = sorted(steps)
    return found


def last_activity(folder: ModelFolder) -> float | None:
    """When the model's records last changed (history, calls, trajectories, checkpoints)."""
    paths = [
        folder.history,
        folder.calls_db,
        folder.calls_db.with_name("calls.sqlite-wal"),
        folder.checkpoints,
        folder / "trajectories",
    ]
    paths += [entry for entry in paths[-1].glob("*") if entry.is_dir()]
    times = []
    for path in paths:
        try:
            times.append(path.stat().st_mtime)
        except OSError:
            continue
    return max(times) if times else None


class ArtFolder:
    """The models of one art folder (``{path}/{project}/models/{name}/``).

    Example:
        >>> ArtFolder(Path("/nonexistent")).models()
        []
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def models(self) -> list[ModelRef]:
        """Every model folder (one with a ``model.json``, a history or trajectories)."""
        found = []
        try:
            projects = sorted(entry for entry in self.path.iterdir() if entry.is_dir())
        except OSError:
            return []
        for project in projects:
            models = project / "models"
            if not _NAME.fullmatch(project.name) or not models.is_dir():
                continue
            for entry in sorted(models.iterdir()):
                if not (entry.is_dir() and _NAME.fullmatch(entry.name)):
                    continue
                folder = ModelFolder(entry)
                if any(
                    path.exists()
                    for path in (folder.model_json, folder.history, entry / "trajectories")
                ):
                    found.append(ModelRef(project.name, entry.name, folder))
        return found

    def model(self, project: str, name: str) -> ModelRef:
        """The model ``project/name`` if the folder holds it, else ``NotFound``."""
        if _NAME.fullmatch(project) and _NAME.fullmatch(name):
            entry = self.path / project / "models" / name
            if entry.is_dir():
                return ModelRef(project, name, ModelFolder(entry))
        raise NotFound(f"no model {project}/{name} in {self.path}")


def model_info(model: ModelRef) -> tuple[dict[str, Any], list[str]]:
    """``model.json`` as a dict (empty when missing) and what was wrong with it."""
    try:
        text = model.folder.model_json.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}, ["model.json is missing: the model was never registered here"]
    except (OSError, UnicodeDecodeError) as exc:
        return {}, [f"model.json cannot be read: {exc}"]
    try:
        info = json.loads(text)
    except ValueError as exc:
        return {}, [f"model.json is not JSON ({exc})"]
    if not isinstance(info, dict):
        return {}, ["model.json is not a JSON object"]
    return info, []


def _last_value(records: list[dict[str, Any]], key: str) -> float | None:
    """The last finite value of ``key`` in ``records`` (None when none has one)."""
    values = (finite_number(record.get(key)) for record in reversed(records))
    return next((value for value in values if value is not None), None)


def run_summary(model: ModelRef, history: History) -> dict[str, Any]:
    """One line of the runs page: latest step and reward, whether it is training now."""
    info, problems = model_info(model)
    trained = [r for r in history.records if r.get("split") == "train"]
    latest = max((r["step"] for r in history.records), default=None)
    reward = _last_value(trained, "train/reward")
    val_reward = _last_value(history.records, "val/reward")
    activity = last_activity(model.folder)
    return {
        "project": model.project,
        "name": model.name,
        "base_model": info.get("base_model") if isinstance(info.get("base_model"), str) else None,
        "latest_step": latest,
        "checkpoint_step": model.folder.latest_step(),
        "train_reward": reward,
        "val_reward": val_reward,
        "steps_recorded": len({r["step"] for r in trained}),
        "last_activity": activity,
        "training_now": activity is not None and time.time() - activity < ACTIVE_WITHIN_S,
        "problems": problems + history.problems,
    }
