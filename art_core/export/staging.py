"""Writing an export folder atomically: build it under a hidden name beside ``out`` (same
filesystem), then rename it into place. A failure leaves nothing at ``out`` and no
temporary folder; an existing ``out`` is only replaced when asked."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def final_path(out: str | Path) -> Path:
    """The absolute path ``out`` will have once renamed into place (its parent resolved)."""
    out = Path(out).expanduser()
    return out.parent.resolve() / out.name


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def check_out(out: Path, overwrite: bool) -> None:
    """Refuse an existing ``out`` unless ``overwrite``."""
    if (out.exists() or out.is_symlink()) and not overwrite:
        raise FileExistsError(
            f"{out} exists already; pass overwrite=True (--overwrite) to replace it"
        )


def build_atomically(out: Path, build: Callable[[Path], None], *, overwrite: bool) -> Path:
    """Run ``build(staging)`` in a new hidden folder beside ``out``, then rename it to ``out``.

    With ``overwrite``, an existing ``out`` is renamed aside, the new folder renamed in and
    the old one deleted (restored if the rename in fails).

    Example:
        >>> build_atomically(Path("x"), lambda d: (d / "a").write_text("1"), overwrite=True)
        PosixPath('x')
        >>> (Path("x") / "a").read_text()
        '1'
    """
    check_out(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", dir=out.parent))
    try:
        build(staging)
        if out.exists() or out.is_symlink():
            check_out(out, overwrite)  # it may have appeared while building
            old = out.with_name(f".{out.name}.old-{time.time_ns()}")
            os.rename(out, old)
            try:
                os.rename(staging, out)
            except BaseException:
                os.rename(old, out)
                raise
            _remove(old)
        else:
            os.rename(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def scratch_dir(out: Path, label: str) -> Path:
    """A hidden temporary folder beside ``out`` (the caller removes it)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.{label}-", dir=out.parent))
