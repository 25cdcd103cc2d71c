"""The SDK's spans of one rollout, kept as plain JSON records.

The Agents SDK traces a run as spans (agent, turn, generation, function, handoff, guardrail,
MCP tool listing). ``SpanLog`` keeps the spans of the rollout being captured, as compact JSON
records: generation inputs/outputs are left out because the gateway already recorded every
call token-exactly. The log of the current rollout lives in a ContextVar, so concurrent
rollouts (each in its own task) never share one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from agents.tracing import Span
from pydantic import BaseModel, ConfigDict, Field

_current_log: ContextVar[SpanLog | None] = ContextVar("art_openai_agents_span_log", default=None)

# Span fields that duplicate what the gateway records (model inputs and outputs).
_DROPPED_FIELDS = {"generation": ("input", "output"), "response": ("response",)}
# Tool inputs/outputs are kept, but bounded: a log is metadata, not a copy of every payload.
MAX_TEXT = 4000


def current_span_log() -> SpanLog | None:
    """The span log of the rollout captured in this context, if any."""
    return _current_log.get()


@contextmanager
def span_log_scope(log: SpanLog) -> Iterator[SpanLog]:
    """Make ``log`` the current span log for the code (and tasks it starts) inside the block.

    Example:
        >>> with span_log_scope(SpanLog()) as log:
        ...     assert current_span_log() is log
    """
    token = _current_log.set(log)
    try:
        yield log
    finally:
        _current_log.reset(token)


def _json_safe(value: Any) -> Any:
    """Span data can hold arbitrary objects (tool outputs): keep JSON values, stringify others."""
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return str(value)


def _bounded(value: Any) -> Any:
    if isinstance(value, str) and len(value) > MAX_TEXT:
        return value[:MAX_TEXT] + f"... [{len(value) - MAX_TEXT} more characters]"
    return value


def span_type(span: Span[Any]) -> str:
    """The SDK's span type; ``task`` and ``turn`` spans export as ``custom`` with their own type."""
    data = span.span_data
    return str(data.type)


def span_data_record(span: Span[Any]) -> dict[str, Any]:
    """The span's exported data without model inputs/outputs, JSON-safe and bounded."""
    kind = span_type(span)
    exported = dict(span.span_data.export())
    if exported.get("type") == "custom" and isinstance(exported.get("data"), dict):
        exported = {**exported["data"], "name": exported["data"].get("name", kind)}
        exported.pop("sdk_span_type", None)
    exported.pop("type", None)
    for field in _DROPPED_FIELDS.get(kind, ()):
        exported.pop(field, None)
    return {key: _bounded(_json_safe(value)) for key, value in exported.items()}


class SpanRecord(BaseModel):
    """One SDK span of a rollout, as JSON.

    Example:
        >>> SpanRecord(span_id="s1", trace_id="t1", type="handoff",
        ...            data={"from_agent": "triage", "to_agent": "weather"}).name
        ''
    """

    model_config = ConfigDict(extra="forbid")

    span_id: str
    trace_id: str
    parent_id: str | None = None
    type: str
    name: str = ""
    started_at: str | None = None
    ended_at: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)
    error: dict[str, Any] | None = None

    @classmethod
    def from_span(cls, span: Span[Any]) -> SpanRecord:
        data = span_data_record(span)
        name = data.get("name") or data.get("agent_name") or ""
        return cls(
            span_id=span.span_id,
            trace_id=span.trace_id,
            parent_id=span.parent_id,
            type=span_type(span),
            name=str(name),
            started_at=span.started_at,
            ended_at=span.ended_at,
            data=data,
            error=_json_safe(span.error) if span.error else None,
        )


class SpanLog:
    """The spans of one rollout, by id, in start order.

    Example:
        >>> log = SpanLog()
        >>> log.records()
        []
    """

    def __init__(self) -> None:
        self._records: dict[str, SpanRecord] = {}
        self.trace_ids: list[str] = []

    def add_trace(self, trace_id: str) -> None:
        if trace_id not in self.trace_ids:
            self.trace_ids.append(trace_id)

    def update(self, span: Span[Any]) -> None:
        """Record a span when it starts and again (with its final data) when it ends."""
        self._records[span.span_id] = SpanRecord.from_span(span)

    def get(self, span_id: str | None) -> SpanRecord | None:
        return self._records.get(span_id) if span_id else None

    def ancestors(self, span_id: str | None) -> Iterator[SpanRecord]:
        """The span ``span_id`` and its recorded parents, innermost first."""
        seen: set[str] = set()
        record = self.get(span_id)
        while record is not None and record.span_id not in seen:
            seen.add(record.span_id)
            yield record
            record = self.get(record.parent_id)

    def children(self, span_id: str, kind: str | None = None) -> list[SpanRecord]:
        return [
            r
            for r in self._records.values()
            if r.parent_id == span_id and (kind is None or r.type == kind)
        ]

    def records(self, kind: str | None = None) -> list[SpanRecord]:
        """Every recorded span (optionally of one type), in start order."""
        return [r for r in self._records.values() if kind is None or r.type == kind]
