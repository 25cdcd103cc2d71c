"""What the RULER judge must answer, and the strict check of what it did answer.

The judge's reply is external input: it is parsed as JSON (bare, or in a fenced block, after
any ``<think>`` section), and every run must get exactly one finite score in [0, 1] under an
id that was shown to it. Anything else raises :class:`RulerReplyError` naming the problem.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

_FENCE_RE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.DOTALL)
_THINK_RE = re.compile(r"<think>.*?</think>", re.DOTALL)
_ID_KEYS = ("run_id", "id", "trajectory_id")
_MAX_EXCERPT = 200


class RulerScore(BaseModel):
    """The judge's verdict on one run: a score in [0, 1] and why.

    Example:
        >>> RulerScore(trajectory_id="1", score=0.75, explanation="found the answer").score
        0.75
    """

    model_config = ConfigDict(frozen=True)

    trajectory_id: str
    score: float
    explanation: str = ""


class RulerError(RuntimeError):
    """The judge could not score a group: unreachable, rejected the request, or kept replying
    with something that is not a valid set of scores. ``attempts`` holds one reason per try."""

    def __init__(self, message: str, attempts: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.attempts = list(attempts)


class RulerReplyError(ValueError):
    """One judge reply was malformed or incomplete (the reason is the message)."""


def response_format(run_ids: Sequence[str]) -> dict[str, Any]:
    """The ``response_format`` (JSON schema, strict) asking for one score per run id.

    ``explanation`` comes before ``score`` so a judge that decodes in order reasons first.

    Example:
        >>> response_format(["1", "2"])["json_schema"]["schema"]["properties"]["scores"]["minItems"]
        2
    """
    item = {
        "type": "object",
        "properties": {
            "run_id": {"type": "string", "enum": list(run_ids)},
            "explanation": {"type": "string"},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
        },
        "required": ["run_id", "explanation", "score"],
        "additionalProperties": False,
    }
    schema = {
        "type": "object",
        "properties": {
            "scores": {
                "type": "array",
                "items": item,
                "minItems": len(run_ids),
                "maxItems": len(run_ids),
            }
        },
        "required": ["scores"],
        "additionalProperties": False,
    }
    return {
        "type": "json_schema",
        "json_schema": {"name": "ruler_scores", "strict": True, "schema": schema},
    }


def _excerpt(text: str) -> str:
    text = text.strip()
    return repr(text if len(text) <= _MAX_EXCERPT else text[:_MAX_EXCERPT] + "...")


def extract_json(content: str) -> Any:
    """The JSON value in a judge reply: the whole text, a fenced block, or the outermost
    ``{...}`` / ``[...]`` span (models like to add a sentence around it).

    Example:
        >>> extract_json('Here you go:\\n```json\\n{"scores": []}\\n```')
        {'scores': []}
    """
    text = _THINK_RE.sub("", content).strip()
    candidates = [text, *(m.group(1).strip() for m in _FENCE_RE.finditer(text))]
    for open_, close in (("{", "}"), ("[", "]")):
        start, end = text.find(open_), text.rfind(close)
        if 0 <= start < end:
            candidates.append(text[start : end + 1])
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except ValueError:
            continue
    raise RulerReplyError(f"reply is not JSON: {_excerpt(content)}")


def _entry_id(entry: dict[str, Any]) -> str:
    for key in _ID_KEYS:
        if key in entry:
            value = entry[key]
            if isinstance(value, bool) or not isinstance(value, str | int):
                raise RulerReplyError(f"run id must be a string, got {value!r}")
            return str(value)
    raise RulerReplyError(f"a score entry has no run_id: {_excerpt(json.dumps(entry))}")


def _entry_score(run_id: str, entry: dict[str, Any]) -> float:
    value = entry.get("score")
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RulerReplyError(f"score of run {run_id} is not a number: {value!r}")
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise RulerReplyError(f"score of run {run_id} is {value}, outside [0, 1]")
    return float(value)


def parse_reply(content: str | None, run_ids: Sequence[str]) -> dict[str, RulerScore]:
    """Validate a judge reply and return the score of each run id.

    Accepts ``{"scores": [...]}`` or a bare list of entries; each entry needs a known
    ``run_id`` (``id`` and ``trajectory_id`` are accepted too) and a score in [0, 1].

    Example:
        >>> parse_reply('{"scores": [{"run_id": "1", "explanation": "ok", "score": 0.5}]}', ["1"])
        {'1': RulerScore(trajectory_id='1', score=0.5, explanation='ok')}
    """
    if content is None or not content.strip():
        raise RulerReplyError("reply is empty")
    data = extract_json(content)
    entries = data.get("scores") if isinstance(data, dict) else data
    if not isinstance(entries, list):
        raise RulerReplyError(
            f'reply JSON has no "scores" list: {_excerpt(json.dumps(data, default=str))}'
        )
    if len(entries) != len(run_ids):
        raise RulerReplyError(f"expected {len(run_ids)} scores, got {len(entries)}")
    known = set(run_ids)
    scores: dict[str, RulerScore] = {}
    for entry in entries:
        if not isinstance(entry, dict):
            raise RulerReplyError(f"a score entry is not an object: {entry!r}")
        run_id = _entry_id(entry)
        if run_id not in known:
            raise RulerReplyError(
                f"unknown run id {run_id!r} (expected one of {', '.join(run_ids)})"
            )
        if run_id in scores:
            raise RulerReplyError(f"run {run_id} was scored twice")
        explanation = entry.get("explanation", "")
        if not isinstance(explanation, str):
            explanation = json.dumps(explanation, default=str)
        scores[run_id] = RulerScore(
            trajectory_id=run_id, score=_entry_score(run_id, entry), explanation=explanation.strip()
        )
    return scores
