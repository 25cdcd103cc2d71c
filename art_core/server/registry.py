"""The models a service has registered, persisted so a restarted server can load them again.

Stored as ``{art_path}/.server/models.json``; the folder name starts with a dot, which no
model or project name can, so it never collides with a project folder.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from art_core.files import atomic_write_text

logger = logging.getLogger(__name__)


class ModelRecord(BaseModel):
    """What is needed to register a model again: its names, base model and chat format."""

    model_config = ConfigDict(extra="forbid")

    name: str
    project: str
    base_model: str
    config: dict[str, object] = {}
    # tool_call_parser / reasoning_parser when named at registration (see chat_formats).
    chat_format: dict[str, str] = {}


class ModelRegistry:
    """Name -> ``ModelRecord``, written atomically after each change.

    Example:
        >>> registry = ModelRegistry(Path(".art"))
        >>> registry.add(ModelRecord(name="m", project="p", base_model="tiny-random"))
        >>> registry.get("m").project
        'p'
    """

    def __init__(self, art_path: Path) -> None:
        self.file = Path(art_path) / ".server" / "models.json"
        self._records: dict[str, ModelRecord] = {}
        if self.file.is_file():
            try:
                raw = json.loads(self.file.read_text(encoding="utf-8"))
                for item in raw.get("models", []):
                    record = ModelRecord.model_validate(item)
                    self._records[record.name] = record
            except (json.JSONDecodeError, ValidationError, AttributeError) as exc:
                # A damaged registry must not keep the server down: clients re-register.
                logger.warning("ignoring the unreadable model registry %s: %s", self.file, exc)

    def get(self, name: str) -> ModelRecord | None:
        return self._records.get(name)

    def names(self) -> list[str]:
        return sorted(self._records)

    def add(self, record: ModelRecord) -> None:
        if self._records.get(record.name) == record:
            return
        self._records[record.name] = record
        payload = {"models": [r.model_dump(mode="json") for r in self._records.values()]}
        atomic_write_text(self.file, json.dumps(payload, indent=2))
