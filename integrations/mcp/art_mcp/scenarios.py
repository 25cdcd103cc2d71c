"""``Scenario``: one task for the agent, and JSONL files of them that people can edit."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from art_core.files import jsonl_lines

MAX_TASK_CHARS = 2000


def normalize_task(task: str) -> str:
    """The form used to spot duplicate tasks: lower case, sentence punctuation and extra
    spaces gone. Symbols that change a task's meaning stay: ``-3 - 6`` and ``3 * 6`` are
    different tasks, not one.

    Example:
        >>> normalize_task("  What time is it in Tokyo?? ")
        'what time is it in tokyo'
        >>> normalize_task("Calculate -3 - 6."), normalize_task("Calculate -( -( 3 * 6 ) ).")
        ('calculate -3 - 6', 'calculate -( -( 3 * 6 ) )')
    """
    return " ".join(re.sub(r"[.,;:!?\"'`]", " ", task.lower()).split())


class Scenario(BaseModel):
    """A task the agent should solve with the server's tools.

    ``difficulty`` runs from 1 (one obvious tool call) to 5 (several dependent calls).
    ``answer`` is the expected answer when the task can be checked programmatically; ``id`` is
    derived from the task when not given. ``answer_tool`` names the server tool whose call
    gives the answer (a server's own ``submit``, say): calling it ends the run, its arguments
    are the final answer. Without it the run answers through ``complete_task`` (or in plain
    text). Either way the trajectory's ``metadata["answer_tool"]`` names it, so the
    diagnoses (``art_core.diagnoses``) can tell an answer given before a lookup's result came
    back.

    Example:
        >>> s = Scenario(task="What time is it in Tokyo?", difficulty=1)
        >>> s.id.startswith("scn_"), Scenario.model_validate_json(s.model_dump_json()) == s
        (True, True)
    """

    model_config = ConfigDict(extra="forbid")

    task: str = Field(min_length=1, max_length=MAX_TASK_CHARS)
    difficulty: int = Field(default=3, ge=1, le=5)
    answer: str | None = None
    answer_tool: str | None = Field(default=None, min_length=1, max_length=64)
    id: str = ""
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("task")
    @classmethod
    def _strip(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError("the task is empty")
        return value

    @model_validator(mode="after")
    def _default_id(self) -> Scenario:
        if not self.id:
            digest = hashlib.sha1(normalize_task(self.task).encode()).hexdigest()[:12]
            self.id = f"scn_{digest}"
        return self


def as_scenario(value: Scenario | str | dict[str, Any]) -> Scenario:
    """A ``Scenario`` from a scenario, a task string or a dict."""
    if isinstance(value, Scenario):
        return value
    if isinstance(value, str):
        return Scenario(task=value)
    return Scenario.model_validate(value)


def dedupe(scenarios: Iterable[Scenario]) -> list[Scenario]:
    """The scenarios without repeated tasks (same normalized text), first one kept.

    Example:
        >>> [s.task for s in dedupe([Scenario(task="Add 1 and 2"), Scenario(task="add 1 and 2!")])]
        ['Add 1 and 2']
    """
    seen: set[str] = set()
    out = []
    for scenario in scenarios:
        key = normalize_task(scenario.task)
        if key not in seen:
            seen.add(key)
            out.append(scenario)
    return out


def save_scenarios(scenarios: Iterable[Scenario], path: str | Path) -> Path:
    """Write scenarios as JSONL (one JSON object per line); returns the path.

    Example:
        >>> save_scenarios([Scenario(task="What time is it in Lima?")], "scenarios.jsonl")
        PosixPath('scenarios.jsonl')
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    lines = [s.model_dump_json(exclude_defaults=False) for s in scenarios]
    target.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return target


def load_scenarios(path: str | Path) -> list[Scenario]:
    """Read scenarios from JSONL; a bad line is reported with its number and what is wrong.

    Blank lines and lines starting with ``#`` are skipped; a line may also be a bare JSON
    string (the task).

    Example:
        >>> _ = save_scenarios([Scenario(task="What time is it in Lima?")], "scenarios.jsonl")
        >>> load_scenarios("scenarios.jsonl")[0].task
        'What time is it in Lima?'
    """
    source = Path(path)
    if not source.is_file():
        raise FileNotFoundError(f"no scenario file at {source}")
    scenarios: list[Scenario] = []
    ids: dict[str, int] = {}
    for number, line in enumerate(jsonl_lines(source.read_text(encoding="utf-8")), start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        try:
            value = json.loads(text)
            if not isinstance(value, str | dict):
                raise ValueError(f"expected a JSON object or string, got {type(value).__name__}")
            scenario = as_scenario(value)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in error['loc']) or 'scenario'}: {error['msg']}"
                for error in exc.errors()
            )
            raise ValueError(f"{source}:{number}: not a valid scenario: {problems}") from None
        except ValueError as exc:
            raise ValueError(f"{source}:{number}: not a valid scenario: {exc}") from None
        if scenario.id in ids:
            raise ValueError(
                f"{source}:{number}: scenario id {scenario.id!r} repeats line {ids[scenario.id]}"
            )
        ids[scenario.id] = number
        scenarios.append(scenario)
    if not scenarios:
        raise ValueError(f"{source} holds no scenarios")
    return scenarios
