"""The step page's table query: filter, sort and one page of rows, done by the server so a
step of thousands of rollouts sends only the rows shown.

Example:
    >>> rows = [{"id": "a", "group": 0, "index": 0, "reward": 1.0},
    ...         {"id": "b", "group": 0, "index": 1, "reward": 0.0}]
    >>> query = TableQuery.parse({"sort": "reward", "limit": "1"})
    >>> page, total = query.apply(rows)
    >>> [r["id"] for r in page], total
    (['b'], 2)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

# Columns a table may be sorted by (what the step page shows).
SORTABLE = frozenset(
    {
        "group",
        "index",
        "reward",
        "advantage",
        "ruler_score",
        "turns",
        "tool_calls",
        "prompt_tokens",
        "completion_tokens",
        "finish_reasons",
        "replicas",
        "adapter_steps",
        "apis",
        "task",
        "ruler_explanation",
        "exception",
    }
)
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
MAX_QUERY_CHARS = 200


class TableQueryError(ValueError):
    """A table parameter out of bounds (the route answers 400 with this message)."""


def _key(value: Any) -> tuple[int, Any]:
    """Sort key: numbers before text, missing values last (whatever the direction)."""
    if isinstance(value, list):
        value = ",".join(str(v) for v in value)
    if value is None or value == "":
        return (2, 0)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (0, float(value))
    return (1, str(value).lower())


def _int(params: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    text = params.get(name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise TableQueryError(f"{name} must be a whole number, got {text[:40]!r}") from None
    if not low <= value <= high:
        raise TableQueryError(f"{name} must be between {low} and {high}, got {value}")
    return value


@dataclass(frozen=True)
class TableQuery:
    """What the table shows: a text filter, a group, a sort column and direction, a page."""

    text: str = ""
    group: int | None = None
    sort: str = "group"
    descending: bool = False
    offset: int = 0
    limit: int = DEFAULT_LIMIT

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> TableQuery:
        """From query parameters (``q``, ``group``, ``sort``, ``desc``, ``offset``,
        ``limit``); a value out of bounds raises ``TableQueryError`` naming it."""
        sort = params.get("sort") or "group"
        if sort not in SORTABLE:
            raise TableQueryError(f"sort must be one of {sorted(SORTABLE)}, got {sort[:40]!r}")
        text = params.get("q", "")
        if len(text) > MAX_QUERY_CHARS:
            raise TableQueryError(f"q is longer than {MAX_QUERY_CHARS} characters")
        group_text = params.get("group")
        group = None if not group_text else _int(params, "group", 0, 0, 10**9)
        return cls(
            text=text.lower(),
            group=group,
            sort=sort,
            descending=params.get("desc", "") in ("1", "true"),
            offset=_int(params, "offset", 0, 0, 10**9),
            limit=_int(params, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT),
        )

    def apply(self, rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
        """``(the page of rows, how many rows matched)``."""
        matched = [
            row
            for row in rows
            if (self.group is None or row.get("group") == self.group)
            and (not self.text or self.text in orjson.dumps(row).decode().lower())
        ]
        present = [r for r in matched if _key(r.get(self.sort))[0] < 2]
        missing = [r for r in matched if _key(r.get(self.sort))[0] == 2]
        present.sort(
            key=lambda r: (_key(r.get(self.sort)), r.get("group", 0), r.get("index", 0)),
            reverse=self.descending,
        )
        ordered = present + missing
        return ordered[self.offset : self.offset + self.limit], len(matched)
