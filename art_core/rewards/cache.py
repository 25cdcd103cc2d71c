"""A SQLite disk cache of validated RULER verdicts, so re-scoring a group costs no judge call.

The key is a SHA-256 over the judge model's name, the rubric and the exact judge request
(prompt messages, response format, extra parameters): anything that could change the verdict
changes the key. Only replies that passed validation are stored.

Safe for concurrent use by many coroutines and processes: every operation opens its own
connection (in a worker thread, so the event loop never waits on disk), the database runs in
WAL mode with a busy timeout, and each write is one transaction. A cache that cannot be read
or written (read-only disk, corrupt file) is skipped with a warning: it is an optimization,
never a reason to fail a training run.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Mapping
from contextlib import closing
from pathlib import Path
from typing import Any

from art_core.files import cache_dir as art_core_cache_dir

logger = logging.getLogger(__name__)

# Bump when the prompt or the stored value changes meaning: old entries then simply miss.
CACHE_VERSION = 1
_BUSY_TIMEOUT_S = 30.0
_SCHEMA = """
CREATE TABLE IF NOT EXISTS ruler_cache (
    key TEXT PRIMARY KEY,
    judge_model TEXT NOT NULL,
    value TEXT NOT NULL,
    created_at REAL NOT NULL
)
"""
_initialized: set[Path] = set()
_init_lock = threading.Lock()


def default_cache_path() -> Path:
    """``$ART_CORE_CACHE_DIR/ruler.sqlite``, else ``~/.cache/art_core/ruler.sqlite``
    (``$XDG_CACHE_HOME`` is honoured).

    Example:
        >>> default_cache_path().name
        'ruler.sqlite'
    """
    return art_core_cache_dir() / "ruler.sqlite"


def cache_key(*, judge_model: str, rubric: str, request: Mapping[str, Any]) -> str:
    """A hex SHA-256 of the judge model, the rubric and the judge request (canonical JSON).

    Example:
        >>> k = cache_key(judge_model="m", rubric="r", request={"messages": []})
        >>> len(k), k == cache_key(judge_model="m2", rubric="r", request={"messages": []})
        (64, False)
    """
    payload = {
        "version": CACHE_VERSION,
        "judge_model": judge_model,
        "rubric": rubric,
        "request": request,
    }
    canonical = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class RulerCache:
    """Validated judge verdicts on disk, keyed by :func:`cache_key`.

    Example:
        >>> import asyncio, tempfile
        >>> cache = RulerCache(Path(tempfile.mkdtemp()) / "ruler.sqlite")
        >>> asyncio.run(cache.put("k", "judge", {"scores": []}))
        >>> asyncio.run(cache.get("k"))
        {'scores': []}
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path).expanduser() if path is not None else default_cache_path()

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT_S, isolation_level=None)
        try:
            resolved = self.path.resolve()
            with _init_lock:
                if resolved not in _initialized:
                    # WAL is persistent in the file (set once): readers never block the writer.
                    conn.execute("PRAGMA journal_mode=WAL")
                    _initialized.add(resolved)
            conn.execute(_SCHEMA)  # cheap no-op once the table exists; survives a deleted file
        except BaseException:
            conn.close()
            raise
        return conn

    def _get_sync(self, key: str) -> dict[str, Any] | None:
        with closing(self._connect()) as conn:
            row = conn.execute("SELECT value FROM ruler_cache WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        value = json.loads(row[0])
        return value if isinstance(value, dict) else None

    def _put_sync(self, key: str, judge_model: str, value: Mapping[str, Any]) -> None:
        encoded = json.dumps(value, ensure_ascii=False)
        with closing(self._connect()) as conn:
            conn.execute(
                "INSERT OR REPLACE INTO ruler_cache (key, judge_model, value, created_at) "
                "VALUES (?, ?, ?, ?)",
                (key, judge_model, encoded, time.time()),
            )

    async def get(self, key: str) -> dict[str, Any] | None:
        """The stored value for ``key``, or None (missing, or the cache is unusable)."""
        try:
            return await asyncio.to_thread(self._get_sync, key)
        except (sqlite3.Error, OSError, ValueError) as exc:
            logger.warning("RULER cache %s is unreadable, ignoring it: %s", self.path, exc)
            return None

    async def put(self, key: str, judge_model: str, value: Mapping[str, Any]) -> None:
        """Store ``value`` (JSON-serializable) under ``key``, replacing any older value."""
        try:
            await asyncio.to_thread(self._put_sync, key, judge_model, value)
        except (sqlite3.Error, OSError) as exc:
            logger.warning("RULER cache %s is not writable, not caching: %s", self.path, exc)
