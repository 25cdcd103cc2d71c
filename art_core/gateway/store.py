"""The gateway's record of every call: in memory for live rollouts, in SQLite as it happens.

Each call is written (and committed) before its response is sent, so a rollout that crashes
keeps every call it completed. SQLite work runs on one dedicated thread: the event loop never
blocks on disk, and writes are serialized without extra locking. Requests that finish while
a write is under way are written together, in one transaction, by the next one. A commit
appends to the write-ahead log without waiting for the disk (``synchronous=NORMAL``: durable
across a crash of the process, not of the machine); copying the log into the database, which
waits for the disk, runs every ``CHECKPOINT_BYTES`` on a thread of its own, never delaying an
answer.

What a request's choices share (messages, tools, request parameters, prompt ids, metadata) is
stored once per request, in ``requests``; each choice's row in ``calls`` holds the rest and
points to it. Rows written before this layout hold the whole call and load as they are.

A rollout's calls stay in memory until it is released; one left unreleased for
``rollout_ttl_s``, or the least recently active ones once the calls held in memory pass
``max_memory_bytes`` (their size as recorded), are dropped from memory (their calls stay on
disk and are read back from there if the rollout goes on or is released later).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sqlite3
import threading
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pydantic_core

from art_core.model_folder import ModelFolder
from art_core.trajectories import LLMCall, new_id

logger = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
    id TEXT PRIMARY KEY,
    rollout_id TEXT,
    call_index INTEGER NOT NULL,
    created_at REAL NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS calls_by_rollout ON calls (rollout_id, call_index);
CREATE TABLE IF NOT EXISTS requests (
    id TEXT PRIMARY KEY,
    data TEXT NOT NULL
);
"""
# The fields every choice of one request shares: stored once, in its ``requests`` row.
SHARED_FIELDS = frozenset({"messages", "tools", "request_params", "prompt_token_ids"})
_SELECT = (
    "SELECT calls.data, requests.data FROM calls "
    "LEFT JOIN requests ON requests.id = calls.request_id "
)
# Written bytes between two checkpoints of the write-ahead log (SQLite's default is ~4 MB).
CHECKPOINT_BYTES = 4 * 1024 * 1024
# What the calls held in memory may take (their recorded JSON size), unless told otherwise.
DEFAULT_MAX_MEMORY_BYTES = 256 * 1024 * 1024
# Evicted rollouts remembered (to read them back from disk when they go on); beyond this,
# the oldest are forgotten: a rollout idle that long starts over from its next call.
_EVICTED_REMEMBERED = 65536


def request_rows(calls: list[LLMCall]) -> tuple[tuple[str, str], list[tuple[Any, ...]]]:
    """The ``requests`` row and the ``calls`` rows of one request's choices.

    Metadata keys whose value is the same object in every choice are the request's; the rest
    (a choice's ``top_logprobs``) stay with the choice.

    Example:
        >>> (request_id, data), rows = request_rows([call])  # fragment: a recorded `call`  # doctest: +SKIP
    """
    first = calls[0]
    shared_metadata = {
        key: value
        for key, value in first.metadata.items()
        if all(key in c.metadata and c.metadata[key] is value for c in calls[1:])
    }
    request_id = new_id("req")
    shared = {name: getattr(first, name) for name in SHARED_FIELDS}
    shared["metadata"] = shared_metadata
    rows = []
    for call in calls:
        own = call.model_dump(exclude=set(SHARED_FIELDS))
        own["metadata"] = {k: v for k, v in call.metadata.items() if k not in shared_metadata}
        rows.append(
            (
                call.id,
                call.rollout_id,
                call.index,
                call.created_at,
                pydantic_core.to_json(own).decode(),
                request_id,
            )
        )
    return (request_id, pydantic_core.to_json(shared).decode()), rows


SQLITE_MAGIC = b"SQLite format 3\x00"


def sqlite_damage(path: Path) -> str | None:
    """Why the SQLite file at ``path`` cannot be a whole database (None: it looks whole).

    Reads only its 100-byte header: a file cut short (a full disk, a copy interrupted) is
    smaller than the page count its header declares, which SQLite itself only notices when
    a query reaches a missing page, long after the model started serving.

    Example:
        >>> sqlite_damage(Path("/nonexistent.sqlite")) is None
        True
    """
    try:
        size = path.stat().st_size
        with path.open("rb") as file:
            header = file.read(100)
    except FileNotFoundError:
        return None
    if size == 0:
        return None  # created but never written: SQLite starts it afresh
    if len(header) < 100 or not header.startswith(SQLITE_MAGIC):
        return f"{path.name} is not an SQLite database ({size} bytes)"
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    if pages and size < pages * page_size:
        return (
            f"{path.name} is cut short: {size} bytes of the {pages * page_size} its header declares"
        )
    return None


def open_call_store(
    folder: ModelFolder,
    *,
    rollout_ttl_s: float = 1800.0,
    max_memory_bytes: int = DEFAULT_MAX_MEMORY_BYTES,
) -> CallStore:
    """The model's ``CallStore``. A damaged ``calls.sqlite`` (cut short, not a database) is
    set aside with a warning naming where it went, and a new one is started: the model
    serves again, and the damaged record stays on disk for whoever wants to salvage it.

    Example:
        >>> store = open_call_store(ModelFolder.of(".art", "demo", "m"))
        >>> store.calls_for("rollout_1")
        []
    """
    damage = sqlite_damage(folder.calls_db)
    limits = functools.partial(
        CallStore, rollout_ttl_s=rollout_ttl_s, max_memory_bytes=max_memory_bytes
    )
    if damage is None:
        try:
            return limits(folder.calls_db)
        except sqlite3.DatabaseError as exc:
            damage = f"{folder.calls_db.name} cannot be read: {exc}"
    moved = folder.set_aside_calls_db()
    logger.warning("%s; set aside as %s, recording to a new one", damage, moved)
    return limits(folder.calls_db)


def load_call(data: str, request: str | None) -> LLMCall:
    """A call from its ``calls`` row and its request's row (None for rows of the old layout)."""
    if request is None:
        return LLMCall.model_validate_json(data)
    own = pydantic_core.from_json(data)
    shared = pydantic_core.from_json(request)
    own["metadata"] = {**shared.pop("metadata", {}), **own.get("metadata", {})}
    return LLMCall.model_validate({**own, **shared})


class CallStore:
    """Recorded ``LLMCall``s of one model, keyed by rollout id.

    Example:
        >>> Path(".art/demo/models/m").mkdir(parents=True, exist_ok=True)
        >>> store = CallStore(Path(".art/demo/models/m/calls.sqlite"))
        >>> await store.record_request([call])  # fragment: a recorded `call`  # doctest: +SKIP
        >>> store.calls_for("rollout_1")  # fragment  # doctest: +SKIP
    """

    def __init__(
        self,
        path: Path,
        *,
        recent_unscoped: int = 4096,
        rollout_ttl_s: float = 1800.0,
        max_memory_bytes: int = DEFAULT_MAX_MEMORY_BYTES,
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="art-call-store")
        try:
            self._db = self._executor.submit(self._open).result()
        except BaseException:
            self._executor.shutdown(wait=False)  # no thread left behind by a failed open
            raise
        self._lock = threading.Lock()
        self._rollouts: dict[str, list[LLMCall]] = defaultdict(list)
        self._next_index: dict[str, int] = defaultdict(int)
        self._recent: OrderedDict[str, LLMCall] = OrderedDict()
        self._recent_limit = recent_unscoped
        self.rollout_ttl_s = rollout_ttl_s
        # Bytes of the calls held in memory (their recorded JSON), per rollout and in all.
        self.max_memory_bytes = max_memory_bytes
        self._rollout_bytes: dict[str, int] = defaultdict(int)
        self._recent_bytes: dict[str, int] = {}
        self.memory_bytes = 0
        # Live rollouts by last activity (oldest first), and evicted ones (their next index).
        self._active: OrderedDict[str, float] = OrderedDict()
        self._evicted: OrderedDict[str, int] = OrderedDict()
        self._swept = time.monotonic()
        # Writes waiting for the writer thread: (rows of one request, its future, its loop).
        self._queued: list[tuple[list[LLMCall], asyncio.Future[int]]] = []
        self._writing = False
        self._checkpointer = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="art-call-store-checkpoint"
        )
        self._checkpoint_db: sqlite3.Connection | None = None
        self._unsaved_bytes = 0
        self._checkpointing = False
        # Called with a rollout's id once it is released (the gateway forgets its sampling
        # settings then); from whichever thread releases it.
        self.release_listeners: list[Callable[[str], None]] = []

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA wal_autocheckpoint=0")  # see _checkpoint
        db.executescript(_SCHEMA)
        columns = {row[1] for row in db.execute("PRAGMA table_info(calls)")}
        if "request_id" not in columns:  # a calls.sqlite of the layout before `requests`
            db.execute("ALTER TABLE calls ADD COLUMN request_id TEXT")
            db.commit()
        return db

    # ------------------------------------------------------------------------------ writing
    def next_index(self, rollout_id: str | None) -> int:
        """Reserve the position of a new call in its rollout (the order calls were issued)."""
        if rollout_id is None:
            return 0
        self._revive(rollout_id)
        with self._lock:
            index = self._next_index[rollout_id]
            self._next_index[rollout_id] = index + 1
            self._touch(rollout_id)
            return index

    async def record(self, call: LLMCall) -> None:
        """Persist one completed call, then make it visible to its rollout."""
        await self.record_request([call])

    async def record_request(self, calls: list[LLMCall]) -> None:
        """Persist the choices of one request (its shared part once), then make them visible.

        Committed before this returns; requests recorded at the same time share a commit.
        """
        if not calls:
            return
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        with self._lock:
            self._queued.append((calls, future))
            start = not self._writing
            self._writing = True
        if start:
            self._executor.submit(self._write_queued)
        size = await future
        with self._lock:
            for call in calls:
                self._remember(call, size // len(calls))
            self._sweep()
            self._bound_memory()

    def _write_queued(self) -> None:
        """On the writer thread: write everything queued, one transaction per round."""
        while True:
            with self._lock:
                batch, self._queued = self._queued, []
                if not batch:
                    self._writing = False
                    return
            # Each request's outcome: the bytes it was written as, or why it was not.
            outcomes: list[BaseException | int] = []
            requests, rows = [], []
            for calls, _ in batch:
                try:  # a request that cannot be written fails alone
                    request, own = request_rows(calls)
                    requests.append(request)
                    rows += own
                    outcomes.append(len(request[1]) + sum(len(row[4]) for row in own))
                except Exception as exc:
                    outcomes.append(exc)
            try:
                with self._db:  # one transaction, committed on leaving
                    self._db.executemany(
                        "INSERT OR REPLACE INTO requests (id, data) VALUES (?, ?)", requests
                    )
                    self._db.executemany(
                        "INSERT OR REPLACE INTO calls "
                        "(id, rollout_id, call_index, created_at, data, request_id) "
                        "VALUES (?, ?, ?, ?, ?, ?)",
                        rows,
                    )
            except Exception as exc:  # disk full, I/O error: nothing of this round is kept
                outcomes = [o if isinstance(o, BaseException) else exc for o in outcomes]
            self._unsaved_bytes += sum(len(r[1]) for r in requests) + sum(len(r[4]) for r in rows)
            if self._unsaved_bytes >= CHECKPOINT_BYTES and not self._checkpointing:
                self._checkpointing = True
                self._unsaved_bytes = 0
                self._checkpointer.submit(self._checkpoint)
            for (_, future), outcome in zip(batch, outcomes, strict=True):
                future.get_loop().call_soon_threadsafe(_settle, future, outcome)

    def _checkpoint(self) -> None:
        """On the checkpoint thread: copy the write-ahead log into the database (waits for
        the disk; writers go on meanwhile: PASSIVE)."""
        try:
            if self._checkpoint_db is None:
                self._checkpoint_db = sqlite3.connect(self.path, check_same_thread=False)
            self._checkpoint_db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error as exc:
            logger.warning("checkpoint of %s failed (retried later): %s", self.path.name, exc)
        finally:
            self._checkpointing = False

    # ------------------------------------------------------------------------------ memory
    def _remember(self, call: LLMCall, size: int) -> None:
        if call.rollout_id is None:
            self._recent[call.id] = call
            self._recent_bytes[call.id] = size
            self.memory_bytes += size
            while len(self._recent) > self._recent_limit or (
                len(self._recent) > 1 and self.memory_bytes > self.max_memory_bytes
            ):
                gone, _ = self._recent.popitem(last=False)
                self.memory_bytes -= self._recent_bytes.pop(gone, 0)
            return
        if call.rollout_id in self._evicted:
            return  # dropped from memory meanwhile: read back from disk with the rest
        self._rollout_bytes[call.rollout_id] += size
        self.memory_bytes += size
        calls = self._rollouts[call.rollout_id]
        calls.append(call)
        if len(calls) > 1 and (calls[-2].index, calls[-2].choice_index) > (
            call.index,
            call.choice_index,
        ):
            calls.sort(key=lambda c: (c.index, c.choice_index))
        self._touch(call.rollout_id)

    def _touch(self, rollout_id: str) -> None:
        self._active[rollout_id] = time.monotonic()
        self._active.move_to_end(rollout_id)

    def _sweep(self) -> None:
        """Drop rollouts idle for ``rollout_ttl_s`` from memory (checked now and then)."""
        now = time.monotonic()
        if now - self._swept < min(60.0, self.rollout_ttl_s / 4):
            return
        self._swept = now
        while self._active:
            rollout_id, seen = next(iter(self._active.items()))
            if now - seen < self.rollout_ttl_s:
                break
            self._evict(rollout_id)
            logger.info(
                "rollout %s idle for %.0f s: its calls stay on disk only", rollout_id, now - seen
            )

    def _bound_memory(self) -> None:
        """Drop the least recently active rollouts from memory while the calls held pass
        ``max_memory_bytes`` (a caller that never releases its rollouts holds at most that)."""
        while self.memory_bytes > self.max_memory_bytes and self._active:
            rollout_id = next(iter(self._active))
            self._evict(rollout_id)
            logger.info(
                "calls in memory over %d bytes: rollout %s is kept on disk only",
                self.max_memory_bytes,
                rollout_id,
            )

    def _evict(self, rollout_id: str) -> None:
        """Forget a live rollout in memory; its calls stay on disk (under ``_lock``)."""
        self._active.pop(rollout_id, None)
        self._rollouts.pop(rollout_id, None)
        self.memory_bytes -= self._rollout_bytes.pop(rollout_id, 0)
        self._evicted[rollout_id] = self._next_index.pop(rollout_id, 0)
        while len(self._evicted) > _EVICTED_REMEMBERED:
            self._evicted.popitem(last=False)

    def evicted(self, rollout_id: str) -> bool:
        """Whether the rollout was dropped from memory (using it reads its calls from disk)."""
        return rollout_id in self._evicted

    def _revive(self, rollout_id: str) -> None:
        """Read an evicted rollout back from disk (not under ``_lock``: the writer thread,
        which reads, takes it too)."""
        with self._lock:
            if rollout_id not in self._evicted:
                return
            next_index = self._evicted[rollout_id]
        calls = self._read(rollout_id)
        size = sum(len(pydantic_core.to_json(call)) for call in calls)
        with self._lock:
            if self._evicted.pop(rollout_id, None) is None:
                return  # revived by another thread meanwhile
            self._rollouts[rollout_id] = calls
            self._rollout_bytes[rollout_id] = size
            self.memory_bytes += size
            self._next_index[rollout_id] = max([next_index, *(c.index + 1 for c in calls)])
            self._touch(rollout_id)

    # ------------------------------------------------------------------------------ reading
    def calls_for(self, rollout_id: str) -> list[LLMCall]:
        """The calls of a live rollout, in the order they were issued."""
        self._revive(rollout_id)
        with self._lock:
            return list(self._rollouts.get(rollout_id, ()))

    def release(self, rollout_id: str) -> list[LLMCall]:
        """Forget a finished rollout in memory (it stays on disk) and return its calls."""
        self._revive(rollout_id)
        with self._lock:
            self._next_index.pop(rollout_id, None)
            self._active.pop(rollout_id, None)
            self.memory_bytes -= self._rollout_bytes.pop(rollout_id, 0)
            calls = self._rollouts.pop(rollout_id, [])
        for listener in self.release_listeners:
            listener(rollout_id)
        return calls

    def live_rollouts(self) -> int:
        """How many rollouts have calls held in memory."""
        with self._lock:
            return len(self._rollouts)

    def recent_unscoped(self) -> list[LLMCall]:
        """Recent calls made outside any rollout (plain ``/v1``), newest last."""
        with self._lock:
            return list(self._recent.values())

    def _read(self, rollout_id: str) -> list[LLMCall]:
        rows = self._on_writer(
            lambda: self._db.execute(
                _SELECT + "WHERE calls.rollout_id = ? ORDER BY calls.call_index, calls.created_at",
                (rollout_id,),
            ).fetchall()
        )
        calls = [load_call(data, request) for data, request in rows]
        calls.sort(key=lambda c: (c.index, c.choice_index))
        return calls

    def _on_writer(self, fn: Any) -> Any:
        if threading.current_thread().name.startswith("art-call-store"):
            return fn()
        return self._executor.submit(fn).result()

    def load_rollout(self, rollout_id: str) -> list[LLMCall]:
        """Read a rollout's calls back from disk (e.g. after a crash)."""
        return self._read(rollout_id)

    def get(self, call_id: str) -> LLMCall | None:
        """A call by id, from memory or disk."""
        with self._lock:
            if call_id in self._recent:
                return self._recent[call_id]
            for calls in self._rollouts.values():
                for call in calls:
                    if call.id == call_id:
                        return call
        row = self._on_writer(
            lambda: self._db.execute(_SELECT + "WHERE calls.id = ?", (call_id,)).fetchone()
        )
        return load_call(row[0], row[1]) if row else None

    def count(self) -> int:
        return int(
            self._on_writer(lambda: self._db.execute("SELECT COUNT(*) FROM calls").fetchone()[0])
        )

    def close(self) -> None:
        self._checkpointer.shutdown(wait=True)
        if self._checkpoint_db is not None:
            self._checkpoint_db.close()
        # The last connection to close checkpoints the log into the database and removes it.
        self._executor.submit(self._db.close).result()
        self._executor.shutdown(wait=True)


def _settle(future: asyncio.Future[int], outcome: BaseException | int) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
