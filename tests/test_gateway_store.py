"""The call store: requests stored once, old files still readable, idle rollouts leave
memory but not the disk; and the one JSON parser for what callers send."""

from __future__ import annotations

import math
import sqlite3
import types
from pathlib import Path

import pytest

import art_core.gateway.store as store_module
from art_core.gateway.body import InvalidJSON, parse_json
from art_core.gateway.schemas import (
    MAX_SCHEMA_DEPTH,
    MAX_SCHEMA_NODES,
    SchemaChecks,
    check_json_schema,
    schema_key,
)
from art_core.gateway.store import CallStore
from art_core.trajectories import LLMCall


def _choices(rollout_id: str | None, index: int, n: int, metadata: dict) -> list[LLMCall]:
    messages = [{"role": "user", "content": f"question {index}"}]
    params = {"model": "m", "n": n}
    return [
        LLMCall(
            rollout_id=rollout_id,
            index=index,
            choice_index=i,
            model="m",
            messages=messages,
            request_params=params,
            prompt_token_ids=[1, 2, 3],
            completion_token_ids=[4 + i, 5],
            logprobs=[-0.5, -1.0],
            metadata={**metadata, "top_logprobs": [[[4, -0.5]], [[5, -1.0 - i]]]},
        )
        for i in range(n)
    ]


def _shared_metadata_choices(rollout_id: str, index: int, n: int) -> list[LLMCall]:
    """Choices of one request as the gateway builds them: shared values are one object."""
    shared = {"node": "agent", "blob": "b" * 1000}
    calls = _choices(rollout_id, index, n, {})
    for call in calls:
        own = call.metadata["top_logprobs"]
        call.metadata.clear()
        call.metadata.update(shared)
        call.metadata["top_logprobs"] = own
    return calls


async def test_choices_round_trip_and_share_one_request_row(tmp_path: Path) -> None:
    store = CallStore(tmp_path / "calls.sqlite")
    try:
        calls = _shared_metadata_choices("r1", 0, 4)
        await store.record_request(calls)
        loaded = store.load_rollout("r1")
        assert [c.model_dump() for c in loaded] == [c.model_dump() for c in calls]
        assert store.get(calls[2].id) == calls[2]
    finally:
        store.close()
    with sqlite3.connect(tmp_path / "calls.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM requests").fetchone()[0] == 1
        (request,) = db.execute("SELECT data FROM requests").fetchone()
        rows = [r[0] for r in db.execute("SELECT data FROM calls")]
    assert request.count("b" * 1000) == 1
    assert not any("b" * 1000 in row or "question 0" in row for row in rows)


async def test_files_of_the_old_layout_still_load(tmp_path: Path) -> None:
    path = tmp_path / "calls.sqlite"
    old = _choices("r1", 0, 1, {"k": "v"})[0]
    with sqlite3.connect(path) as db:  # the layout before `requests`: one full call per row
        db.executescript(
            "CREATE TABLE calls (id TEXT PRIMARY KEY, rollout_id TEXT, call_index INTEGER NOT "
            "NULL, created_at REAL NOT NULL, data TEXT NOT NULL);"
        )
        db.execute(
            "INSERT INTO calls VALUES (?, ?, ?, ?, ?)",
            (old.id, old.rollout_id, old.index, old.created_at, old.model_dump_json()),
        )
    store = CallStore(path)
    try:
        new = _choices("r1", 1, 2, {"k": "w"})
        await store.record_request(new)
        assert [c.model_dump() for c in store.load_rollout("r1")] == [
            c.model_dump() for c in [old, *new]
        ]
        assert store.get(old.id) == old
        assert store.count() == 3
    finally:
        store.close()


async def test_idle_unreleased_rollouts_leave_memory_not_the_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    monkeypatch.setattr(store_module, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    store = CallStore(tmp_path / "calls.sqlite", rollout_ttl_s=60)
    try:
        assert store.next_index("idle") == 0
        idle = _choices("idle", 0, 2, {})
        await store.record_request(idle)
        now[0] += 600  # ten minutes later, another rollout records a call
        store.next_index("busy")
        await store.record_request(_choices("busy", 0, 1, {}))
        assert store.live_rollouts() == 1 and store.evicted("idle")
        # The idle rollout goes on: its calls come back from disk, its order is kept.
        assert [c.id for c in store.calls_for("idle")] == [c.id for c in idle]
        assert store.next_index("idle") == 1
        assert [c.id for c in store.release("idle")] == [c.id for c in idle]
        assert store.live_rollouts() == 1
    finally:
        store.close()


async def test_the_log_is_checkpointed_off_the_write_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Commits only append to the write-ahead log; a thread of its own copies it into the
    database file (waiting for the disk there, not in an answer)."""
    monkeypatch.setattr(store_module, "CHECKPOINT_BYTES", 50_000)
    path = tmp_path / "calls.sqlite"
    store = CallStore(path)
    try:
        calls = _choices("r", 0, 1, {"blob": "z" * 40_000})
        await store.record_request(calls)
        empty = path.stat().st_size
        assert empty < 40_000  # committed, in the log only
        await store.record_request(_choices("r", 1, 1, {"blob": "y" * 40_000}))
        store._checkpointer.submit(lambda: None).result()  # the checkpoint it started is done
        assert path.stat().st_size > 80_000
    finally:
        store.close()
    reopened = CallStore(path)
    try:
        assert len(reopened.load_rollout("r")) == 2
    finally:
        reopened.close()


def test_parse_json_refuses_what_would_fail_later() -> None:
    assert parse_json(b'{"logprob": -Infinity}') == {"logprob": -math.inf}
    for raw in (
        b'{"a": "\\ud800"}',  # a lone surrogate (strict parser)
        b'{"a": NaN, "b": "\\udc00"}',  # ... and through the NaN fallback
        b"[" * 5000 + b"]" * 5000,
        b'{"a": NaN, "b": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        b"{not json",
    ):
        with pytest.raises(InvalidJSON):
            parse_json(raw)


def test_json_schemas_are_bounded_and_remembered() -> None:
    deep: dict = {"type": "object"}
    for _ in range(MAX_SCHEMA_DEPTH):
        deep = {"type": "object", "properties": {"x": deep}}
    wide = {"anyOf": [{"type": "string"}] * (MAX_SCHEMA_NODES + 1)}
    huge = {"description": "x" * 70_000}
    for schema, needle in ((deep, "deeper"), (wide, "more than"), (huge, "bytes")):
        with pytest.raises(ValueError, match=needle):
            check_json_schema(schema)
    fine = {"type": "object", "properties": {"city": {"type": "string"}}}
    checks = SchemaChecks()
    check_json_schema(fine, checks)
    assert schema_key(dict(reversed(fine.items()))) in checks
