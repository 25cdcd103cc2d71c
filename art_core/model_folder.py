"""``ModelFolder``: the one owner of a model's folder on disk.

``{art_path}/{project}/models/{name}/`` holds:

- ``model.json``;
- ``history.jsonl``: one JSON record per line, append-only;
- ``checkpoints/{step:04d}/``: a PEFT adapter plus optimizer and trainer state;
- ``trajectories/{split}/{step:04d}.jsonl``: the groups a step trained on (one per line);
- ``signals/{split}/{step:04d}.jsonl``: the training signal each rollout of a GRPO step that
  trained got, one JSON line per rollout (``art_core.training.training_signal``)::

      {"trajectory_id": str, "advantage": float, "token_weight": float,
       "sequences": [{"call_ids": [str, ...], "trained_tokens": int,
                      "trainer_logprobs": [float | null, ...] | null}, ...]}

  the advantage and loss weight of each of its trained tokens, and per training sequence
  (the calls merged into it) the trainer's logprob of each trained token in sequence order
  (``exp(trainer - sampler logprob)`` is the importance ratio it saw), 6 significant digits;
- ``calls.sqlite``: the gateway's record;
- ``logs/``.

Everything that needs a path in it, or needs to know which checkpoint is the latest complete
one, asks this class: the engine that serves the model and the trainer that resumes it
always agree.

A checkpoint is complete when its folder (named by the step, ASCII digits) holds the
adapter's config and weights and the trainer's state; the trainer writes it under a hidden
temporary name and renames it into place, so a crash leaves no half-written folder with a
step's name. A folder with a step's name that is not complete (a file deleted or truncated
by hand, a disk that filled) is never served, never resumed from and never overwritten:
``set_aside_incomplete`` renames it out of the way and reports it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from art_core.files import append_line, jsonl_lines
from art_core.trajectories import TrajectoryGroup

ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
TRAINER_STATE_FILE = "trainer_state.json"
OPTIMIZER_STATE_FILE = "optimizer.safetensors"
# The files without which a checkpoint cannot be served (adapter) or resumed (state).
CHECKPOINT_FILES = (ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, TRAINER_STATE_FILE)
_STEP_NAME = re.compile(r"[0-9]{1,9}")
logger = logging.getLogger(__name__)


def _safetensors_damage(path: Path) -> str | None:
    """Why a safetensors file is not whole (None: its header parses and its tensors' data
    ends where the file ends)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as file:
            length = int.from_bytes(file.read(8), "little")
            if length <= 0 or 8 + length > size:
                return f"{path.name} has no valid header ({size} bytes)"
            header = json.loads(file.read(length))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return f"{path.name} has no valid header ({exc})"
    if not isinstance(header, dict):
        return f"{path.name} has no valid header"
    ends = [
        entry["data_offsets"][1]
        for key, entry in header.items()
        if key != "__metadata__" and isinstance(entry, dict) and "data_offsets" in entry
    ]
    data = size - 8 - length
    if max(ends, default=0) > data:
        return f"{path.name} is cut short: {data} bytes of tensor data, {max(ends)} expected"
    return None


def _read_records(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file, one per line ([] when there is no file); blank
    lines are skipped, damaged ones with a warning naming the line."""
    if not path.exists():
        return []
    records = []
    text = path.read_text(encoding="utf-8", errors="replace")
    for number, line in enumerate(jsonl_lines(text), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict):
            records.append(record)
        else:
            logger.warning("%s:%d is not a JSON record; skipped", path, number)
    return records


@dataclass(frozen=True)
class ModelFolder:
    """Paths and records of one model's folder.

    ``folder / "x"`` and ``os.fspath(folder)`` work as on the folder's ``Path``.

    Example:
        >>> folder = ModelFolder.of(Path(".art"), "demo", "agent-001")
        >>> folder.checkpoint(3).as_posix()
        '.art/demo/models/agent-001/checkpoints/0003'
        >>> folder.latest_step()
        0
    """

    root: Path

    @classmethod
    def of(cls, art_path: str | Path, project: str, name: str) -> ModelFolder:
        """The folder of model ``name`` of ``project`` under ``art_path``."""
        return cls(Path(art_path) / project / "models" / name)

    def __truediv__(self, other: str) -> Path:
        return self.root / other

    def __fspath__(self) -> str:
        return os.fspath(self.root)

    def __str__(self) -> str:
        return str(self.root)

    # ------------------------------------------------------------------------------ paths
    @property
    def model_json(self) -> Path:
        return self.root / "model.json"

    @property
    def history(self) -> Path:
        return self.root / "history.jsonl"

    @property
    def calls_db(self) -> Path:
        return self.root / "calls.sqlite"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pipeline_state(self) -> Path:
        """Where ``PipelineTrainer`` keeps its position (scenarios used, counters)."""
        return self.root / "pipeline_state.json"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def checkpoint(self, step: int) -> Path:
        """``checkpoints/{step:04d}`` (whether or not it exists)."""
        return self.checkpoints / f"{step:04d}"

    def trajectories(self, split: str, step: int) -> Path:
        """``trajectories/{split}/{step:04d}.jsonl``."""
        return self.root / "trajectories" / split / f"{step:04d}.jsonl"

    def training_signal(self, split: str, step: int) -> Path:
        """``signals/{split}/{step:04d}.jsonl``."""
        return self.root / "signals" / split / f"{step:04d}.jsonl"

    # ------------------------------------------------------------------------------ checkpoints
    @staticmethod
    def is_complete(checkpoint: Path) -> bool:
        """Whether a checkpoint folder holds everything needed to serve and resume it."""
        return all((checkpoint / name).is_file() for name in CHECKPOINT_FILES)

    def _step_folders(self) -> list[tuple[int, Path]]:
        if not self.checkpoints.is_dir():
            return []
        return sorted(
            (int(entry.name), entry)
            for entry in self.checkpoints.iterdir()
            if _STEP_NAME.fullmatch(entry.name) and entry.is_dir()
        )

    def checkpoint_steps(self) -> list[int]:
        """Steps with a complete checkpoint, ascending."""
        return [step for step, path in self._step_folders() if self.is_complete(path)]

    def latest_checkpoint(self) -> tuple[int, Path] | None:
        """The newest complete checkpoint as ``(step, folder)``, or None."""
        complete = [(s, p) for s, p in self._step_folders() if self.is_complete(p)]
        return complete[-1] if complete else None

    def latest_step(self) -> int:
        """The step of the newest complete checkpoint (0: the base model)."""
        latest = self.latest_checkpoint()
        return latest[0] if latest else 0

    @staticmethod
    def checkpoint_damage(checkpoint: Path) -> str | None:
        """Why a checkpoint folder cannot be served or resumed (None: it is whole).

        Deeper than ``is_complete`` (which only sees that the files exist, and is asked on
        every step lookup): the JSON files parse to objects, and the adapter's safetensors
        header parses and accounts for the file's size. Reads headers only; run when a model
        is loaded, so a damaged checkpoint is set aside before anything serves it.

        Example:
            >>> ModelFolder.checkpoint_damage(Path("/nonexistent"))
            'adapter_config.json is missing'
        """
        for name in CHECKPOINT_FILES:
            if not (checkpoint / name).is_file():
                return f"{name} is missing"
        for name in (ADAPTER_CONFIG_FILE, TRAINER_STATE_FILE):
            try:
                parsed = json.loads((checkpoint / name).read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, ValueError) as exc:
                return f"{name} is not readable JSON ({exc})"
            if not isinstance(parsed, dict):
                return f"{name} is not a JSON object"
        return _safetensors_damage(checkpoint / ADAPTER_WEIGHTS_FILE)

    def incomplete_checkpoints(self) -> list[Path]:
        """Folders named by a step that lack a checkpoint file or hold a damaged one."""
        return [path for _, path in self._step_folders() if self.checkpoint_damage(path)]

    def set_aside_incomplete(self) -> list[tuple[Path, Path]]:
        """Rename every incomplete or damaged checkpoint folder to ``.incomplete-{name}-{time}``
        so no step is served, resumed or overwritten from it; returns ``(old, new)`` pairs."""
        moved = []
        for path in self.incomplete_checkpoints():
            target = path.with_name(f".incomplete-{path.name}-{time.time_ns()}")
            path.rename(target)
            moved.append((path, target))
        return moved

    def set_aside_calls_db(self) -> Path:
        """Rename a damaged ``calls.sqlite`` (and its ``-wal`` / ``-shm``) to
        ``.damaged-calls.sqlite-{time}`` so a new record starts; returns the new name."""
        stamp = time.time_ns()
        target = self.root / f".damaged-{self.calls_db.name}-{stamp}"
        for suffix in ("-wal", "-shm"):
            side = self.calls_db.with_name(self.calls_db.name + suffix)
            if side.exists():
                side.rename(target.with_name(target.name + suffix))
        self.calls_db.rename(target)
        return target

    # ------------------------------------------------------------------------------ records
    def append_history(self, record: Mapping[str, Any]) -> None:
        """Append one record to ``history.jsonl`` (one ``O_APPEND`` write: other writers of
        the same history may append at the same moment)."""
        append_line(self.history, json.dumps(dict(record), allow_nan=False))

    def read_history(self) -> list[dict[str, Any]]:
        """Every record of ``history.jsonl`` ([] when there is none).

        Blank lines and lines that are not a JSON object (a write cut short by a crash, the
        last line of a full disk) are skipped with a warning naming the line: one damaged
        record must not hide the rest of the history.
        """
        return _read_records(self.history)

    def append_training_signal(
        self, split: str, step: int, records: Iterable[Mapping[str, Any]]
    ) -> Path:
        """Append ``records`` (one line each, one write per line) to
        ``signals/{split}/{step:04d}.jsonl``."""
        path = self.training_signal(split, step)
        for record in records:
            append_line(path, json.dumps(dict(record), allow_nan=False))
        return path

    def read_training_signal(self, split: str, step: int) -> dict[str, dict[str, Any]]:
        """The records of ``signals/{split}/{step:04d}.jsonl`` by trajectory id ({} when
        there is none; damaged lines are skipped with a warning, as ``read_history`` does).

        Example:
            >>> ModelFolder(Path("/nonexistent")).read_training_signal("train", 0)
            {}
        """
        path = self.training_signal(split, step)
        signal: dict[str, dict[str, Any]] = {}
        for record in _read_records(path):
            trajectory_id = record.get("trajectory_id")
            if isinstance(trajectory_id, str):
                signal[trajectory_id] = record
            else:
                logger.warning("%s: a record without a trajectory_id; skipped", path)
        return signal

    def read_trajectories(self, split: str, step: int) -> list[TrajectoryGroup]:
        """The groups saved in ``trajectories/{split}/{step:04d}.jsonl`` (one per line)."""
        lines = jsonl_lines(self.trajectories(split, step).read_text(encoding="utf-8"))
        return [TrajectoryGroup.model_validate_json(line) for line in lines if line.strip()]

    def append_trajectories(self, split: str, step: int, lines: Iterable[str]) -> Path:
        """Append ``lines`` to ``trajectories/{split}/{step:04d}.jsonl``."""
        path = self.trajectories(split, step)
        for line in lines:
            append_line(path, line)
        return path
