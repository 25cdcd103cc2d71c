"""A step's rollouts: the table of the step page, and one group read back for a rollout.

``trajectories/{split}/{step:04d}.jsonl`` holds one ``TrajectoryGroup`` per line. The step
page needs a summary of every rollout; the rollout page needs one group. ``StepIndex`` reads
a file once (orjson, off the event loop), keeps each line's byte offset and each rollout's
summary, and is cached by the file's size and modification time, so a rollout page reads
only its own line and a step still being appended to is read again when it grows.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from art_core.ui.folder import MAX_STEP_FILE_BYTES, NotFound, finite_number

# Step files whose index is kept in memory (least recently used beyond this are dropped).
CACHED_STEP_FILES = 256
# A group line longer than this is not parsed (a hostile or damaged file).
MAX_GROUP_LINE_BYTES = 256 * 1024 * 1024


def as_dict(value: Any) -> dict[str, Any]:
    """``value`` when it is a JSON object, else an empty one (damaged records)."""
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    """``value`` when it is a JSON array, else an empty one (damaged records)."""
    return value if isinstance(value, list) else []


def scenario_key(group: dict[str, Any]) -> str | None:
    """What identifies a group's scenario across steps (for comparing them).

    A recorded key (``scenario_key``, ``scenario_id``, ``scenario``) in the group's or its
    first trajectory's metadata, else the text of the first user message.
    """
    trajectories = group.get("trajectories") or [{}]
    for source in (group.get("metadata"), trajectories[0].get("metadata")):
        if isinstance(source, dict):
            for key in ("scenario_key", "scenario_id", "scenario"):
                value = source.get(key)
                if isinstance(value, str | int) and not isinstance(value, bool):
                    return str(value)
    for message in first_messages(trajectories[0]):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else orjson.dumps(content).decode()
    return None


def first_messages(trajectory: dict[str, Any]) -> list[Any]:
    """The messages a rollout started from (its first call's, or its own)."""
    calls = trajectory.get("calls") or []
    if calls and isinstance(calls[0], dict) and isinstance(calls[0].get("messages"), list):
        return list(calls[0]["messages"])
    messages = trajectory.get("messages_and_choices")
    return list(messages) if isinstance(messages, list) else []


def task_text(trajectory: dict[str, Any]) -> str:
    """A short label of what the rollout was asked (its first user message)."""
    metadata = trajectory.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("task"), str):
        return metadata["task"][:200]
    for message in first_messages(trajectory):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            text = content if isinstance(content, str) else orjson.dumps(content).decode()
            return text[:200]
    return ""


def rollout_summary(trajectory: dict[str, Any], group: int, index: int) -> dict[str, Any]:
    """One row of the step table."""
    calls = [c for c in trajectory.get("calls") or [] if isinstance(c, dict)]
    metadata = as_dict(trajectory.get("metadata"))
    metrics = as_dict(trajectory.get("metrics"))
    ruler = as_dict(metadata.get("ruler"))
    tool_calls = 0
    for call in calls:
        message = call.get("response_message")
        if isinstance(message, dict) and isinstance(message.get("tool_calls"), list):
            tool_calls += len(message["tool_calls"])
    logs = as_list(trajectory.get("logs"))
    error = metadata.get("error") or metadata.get("exception")
    return {
        "id": str(trajectory.get("id", "")),
        "group": group,
        "index": index,
        "task": task_text(trajectory),
        "reward": finite_number(trajectory.get("reward")),
        "ruler_score": finite_number(metrics.get("ruler_score")),
        "ruler_explanation": ruler.get("explanation"),
        "turns": len(calls) or finite_number(metrics.get("turns")),
        "tool_calls": tool_calls or finite_number(metrics.get("tool_calls")) or 0,
        "prompt_tokens": sum(len(c.get("prompt_token_ids") or []) for c in calls),
        "completion_tokens": sum(len(c.get("completion_token_ids") or []) for c in calls),
        "exception": str(error) if error else None,
        "finish_reasons": sorted({str(c.get("finish_reason")) for c in calls}),
        "replicas": sorted({c["replica"] for c in calls if isinstance(c.get("replica"), int)}),
        "adapter_steps": sorted(
            {c["adapter_step"] for c in calls if isinstance(c.get("adapter_step"), int)}
        ),
        "apis": sorted({str(c.get("api", "chat.completions")) for c in calls}),
        "logs": len(logs),
    }


@dataclass
class StepIndex:
    """What one step file holds: groups (offsets, scenario, rewards) and rollout rows."""

    path: Path
    stamp: tuple[int, int]
    offsets: list[tuple[int, int]] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    exceptions: list[dict[str, Any]] = field(default_factory=list)
    groups: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    by_id: dict[str, tuple[int, int]] = field(default_factory=dict)

    def group(self, number: int) -> dict[str, Any]:
        """Group ``number`` of the file, parsed from its own line only."""
        if not 0 <= number < len(self.offsets):
            raise NotFound(f"{self.path.name} has no group {number}")
        start, length = self.offsets[number]
        with self.path.open("rb") as file:
            file.seek(start)
            data = file.read(length)
        parsed = orjson.loads(data)
        if not isinstance(parsed, dict):
            raise NotFound(f"{self.path.name}: group {number} is damaged")
        return parsed

    def rollout(self, trajectory_id: str) -> tuple[dict[str, Any], dict[str, Any], int, int]:
        """``(trajectory, its group, group number, index in group)``."""
        if trajectory_id not in self.by_id:
            raise NotFound(f"{self.path.name} has no rollout {trajectory_id!r}")
        number, index = self.by_id[trajectory_id]
        group = self.group(number)
        return group["trajectories"][index], group, number, index


def _file_stamp(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


def build_index(path: Path) -> StepIndex:
    """Read a step file once: offsets, summaries and problems (blocking; run off the loop)."""
    try:
        stamp = _file_stamp(path)
    except FileNotFoundError:
        raise NotFound(f"no trajectories file {path.parent.name}/{path.name}") from None
    index = StepIndex(path=path, stamp=stamp)
    if stamp[0] > MAX_STEP_FILE_BYTES:
        index.problems.append(
            f"{path.name} is {stamp[0] / 2**20:.0f} MiB, more than the viewer reads "
            f"({MAX_STEP_FILE_BYTES / 2**20:.0f} MiB)"
        )
        return index
    with path.open("rb") as file:
        data = file.read(stamp[0])
    position = 0
    line_number = 0
    while position < len(data):
        end = data.find(b"\n", position)
        if end < 0:
            index.problems.append(
                f"{path.name}: the last line is cut short (being written, or a crash)"
            )
            break
        line = data[position:end]
        line_number += 1
        start = position
        position = end + 1
        if not line.strip():
            continue
        try:
            group = orjson.loads(line) if len(line) <= MAX_GROUP_LINE_BYTES else None
        except orjson.JSONDecodeError:
            group = None
        trajectories = group.get("trajectories") if isinstance(group, dict) else None
        if not isinstance(group, dict) or not isinstance(trajectories, list):
            index.problems.append(f"{path.name}: line {line_number} is not a trajectory group")
            continue
        number = len(index.offsets)
        index.offsets.append((start, end - start))
        rewards = []
        for position_in_group, trajectory in enumerate(trajectories):
            if not isinstance(trajectory, dict):
                index.problems.append(f"{path.name}: group {number} holds a non-object rollout")
                continue
            row = rollout_summary(trajectory, number, position_in_group)
            index.rows.append(row)
            index.by_id[row["id"]] = (number, position_in_group)
            if row["reward"] is not None:
                rewards.append(row["reward"])
        for exception in group.get("exceptions") or []:
            if isinstance(exception, dict):
                index.exceptions.append(
                    {
                        "group": number,
                        "type": str(exception.get("type", "")),
                        "message": str(exception.get("message", ""))[:2000],
                        "traceback": str(exception.get("traceback", ""))[-8000:],
                    }
                )
        index.groups.append(
            {
                "group": number,
                "ids": [str(t.get("id", "")) for t in trajectories if isinstance(t, dict)],
                "scenario": scenario_key(group),
                "task": task_text(trajectories[0]) if trajectories else "",
                "rollouts": len(trajectories),
                "exceptions": len(group.get("exceptions") or []),
                "rewards": rewards,
                "mean_reward": sum(rewards) / len(rewards) if rewards else None,
                "all_equal": len(rewards) >= 2 and max(rewards) - min(rewards) <= 1e-9,
            }
        )
    return index


class StepCache:
    """``StepIndex`` per file, rebuilt when the file changes; thread-safe, bounded.

    Example:
        >>> StepCache().get(Path("/nonexistent/0000.jsonl"))
        Traceback (most recent call last):
        art_core.ui.folder.NotFound: no trajectories file nonexistent/0000.jsonl
    """

    def __init__(self, capacity: int = CACHED_STEP_FILES) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[Path, StepIndex] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, path: Path) -> StepIndex:
        """The index of ``path`` (blocking when it must be read)."""
        try:
            stamp = _file_stamp(path)
        except FileNotFoundError:
            raise NotFound(f"no trajectories file {path.parent.name}/{path.name}") from None
        with self._lock:
            cached = self._entries.get(path)
            if cached is not None and cached.stamp == stamp:
                self._entries.move_to_end(path)
                return cached
        index = build_index(path)
        with self._lock:
            self._entries[path] = index
            self._entries.move_to_end(path)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        return index
