"""The gateway's record of every call: in memory for live rollouts, in SQLite as it happens.

Each call is written (and committed) before its response is sent, so a rollout that crashes
keeps every call it completed. SQLite work runs on one dedicated thread: the event loop never
blocks on disk, and writes are serialized without extra locking.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections import OrderedDict, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from art_core.trajectories import LLMCall

_SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
    id TEXT PRIMARY KEY,
    rollout_id TEXT,
    call_index INTEGER NOT NULL,
    created_at REAL NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS calls_by_rollout ON calls (rollout_id, call_index);
"""


class CallStore:
    """Recorded ``LLMCall``s of one model, keyed by rollout id.

    Example:
        >>> store = CallStore(Path(".art/demo/models/m/calls.sqlite"))  # doctest: +SKIP
        >>> await store.record(call)  # doctest: +SKIP
        >>> store.calls_for("rollout_1")  # doctest: +SKIP
    """

    def __init__(self, path: Path, *, recent_unscoped: int = 4096) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="art-call-store")
        self._db = self._executor.submit(self._open).result()
        self._lock = threading.Lock()
        self._rollouts: dict[str, list[LLMCall]] = defaultdict(list)
        self._next_index: dict[str, int] = defaultdict(int)
        self._recent: OrderedDict[str, LLMCall] = OrderedDict()
        self._recent_limit = recent_unscoped

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(_SCHEMA)
        return db

    def next_index(self, rollout_id: str | None) -> int:
        """Reserve the position of a new call in its rollout (the order calls were issued)."""
        if rollout_id is None:
            return 0
        with self._lock:
            index = self._next_index[rollout_id]
            self._next_index[rollout_id] = index + 1
            return index

    async def record(self, call: LLMCall) -> None:
        """Persist a completed call, then make it visible to its rollout."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._insert, call)
        with self._lock:
            if call.rollout_id is None:
                self._recent[call.id] = call
                while len(self._recent) > self._recent_limit:
                    self._recent.popitem(last=False)
            else:
                calls = self._rollouts[call.rollout_id]
                calls.append(call)
                calls.sort(key=lambda c: (c.index, c.choice_index))

    def _insert(self, call: LLMCall) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO calls (id, rollout_id, call_index, created_at, data) "
            "VALUES (?, ?, ?, ?, ?)",
            (call.id, call.rollout_id, call.index, call.created_at, call.model_dump_json()),
        )
        self._db.commit()

    def calls_for(self, rollout_id: str) -> list[LLMCall]:
        """The calls of a live rollout, in the order they were issued."""
        with self._lock:
            return list(self._rollouts.get(rollout_id, ()))

    def release(self, rollout_id: str) -> list[LLMCall]:
        """Forget a finished rollout in memory (it stays on disk) and return its calls."""
        with self._lock:
            self._next_index.pop(rollout_id, None)
            return self._rollouts.pop(rollout_id, [])

    def recent_unscoped(self) -> list[LLMCall]:
        """Recent calls made outside any rollout (plain ``/v1``), newest last."""
        with self._lock:
            return list(self._recent.values())

    def load_rollout(self, rollout_id: str) -> list[LLMCall]:
        """Read a rollout's calls back from disk (e.g. after a crash)."""
        rows = self._executor.submit(
            lambda: self._db.execute(
                "SELECT data FROM calls WHERE rollout_id = ? ORDER BY call_index, created_at",
                (rollout_id,),
            ).fetchall()
        ).result()
        return [LLMCall.model_validate_json(row[0]) for row in rows]

    def get(self, call_id: str) -> LLMCall | None:
        """A call by id, from memory or disk."""
        with self._lock:
            if call_id in self._recent:
                return self._recent[call_id]
            for calls in self._rollouts.values():
                for call in calls:
                    if call.id == call_id:
                        return call
        row = self._executor.submit(
            lambda: self._db.execute("SELECT data FROM calls WHERE id = ?", (call_id,)).fetchone()
        ).result()
        return LLMCall.model_validate_json(row[0]) if row else None

    def count(self) -> int:
        return int(
            self._executor.submit(
                lambda: self._db.execute("SELECT COUNT(*) FROM calls").fetchone()[0]
            ).result()
        )

    def close(self) -> None:
        self._executor.submit(self._db.close).result()
        self._executor.shutdown(wait=True)
