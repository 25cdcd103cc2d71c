"""Atomic writes: a reader (or a crash) never sees a half-written file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same folder and ``os.replace``.

    Example:
        >>> atomic_write_text(Path("art-example.json"), "{}")
        >>> Path("art-example.json").read_text()
        '{}'
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def append_line(path: Path, line: str) -> None:
    """Append one line (e.g. a JSONL record) with a single write, flushed to disk."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(line.rstrip("\n") + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def jsonl_lines(text: str) -> list[str]:
    r"""The lines of a JSONL text, split at ``\n`` only: a JSON string may hold U+2028, U+2029
    or U+0085 unescaped (JSON escapes only the characters below U+0020), and
    ``str.splitlines()`` would cut a record there (a model's sampled text holds any of them).

    Example:
        >>> jsonl_lines('{"text": "a\u2028b"}\n{"n": 2}\n')
        ['{"text": "a\u2028b"}', '{"n": 2}']
        >>> len('{"text": "a\u2028b"}\n'.splitlines())  # what it replaces
        2
    """
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def cache_dir() -> Path:
    """art_core's cache folder: ``$ART_CORE_CACHE_DIR`` when set, else
    ``$XDG_CACHE_HOME/art_core`` (``~/.cache/art_core``).

    Example:
        >>> os.environ["ART_CORE_CACHE_DIR"] = "/data/cache"
        >>> cache_dir()
        PosixPath('/data/cache')
        >>> del os.environ["ART_CORE_CACHE_DIR"]
        >>> os.environ["XDG_CACHE_HOME"] = "/home/me/.cache"
        >>> cache_dir()
        PosixPath('/home/me/.cache/art_core')
    """
    override = os.environ.get("ART_CORE_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "art_core"
