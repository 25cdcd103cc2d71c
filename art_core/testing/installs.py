"""Installs that run in the background while the tests run, and the wait for one of them.

``bash run.sh test`` starts the installs only some tests need (the vLLM runtime, the tracing
servers, the command-line agents, Chromium) in the background and runs the tests at once.
Each install writes ``NAME.log`` in the folder ``$ART_TEST_INSTALLS_DIR`` names, and
``NAME.status`` with its exit code when it ends. A test that needs one carries
``@pytest.mark.needs_install("NAME")``: it waits (up to ``ART_TEST_INSTALL_WAIT_S``, 1200 s by
default) before its setup, and fails naming the install and the end of its log if the install
failed or did not end in time. An install that was not started (Chromium already on the
machine) is not waited for: the test's own check says what is missing. Without ``ART_TEST_INSTALLS_DIR`` (a developer's own pytest run,
the installs done beforehand) there is nothing to wait for.

Example:
    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = (folder / "mlflow.status").write_text("0\\n")
    >>> wait_for_install("mlflow", folder, timeout_s=1.0) is None
    True
    >>> _ = (folder / "vllm.status").write_text("1\\n")
    >>> _ = (folder / "vllm.log").write_text("no space left on device\\n")
    >>> print(wait_for_install("vllm", folder, timeout_s=1.0))
    the background install 'vllm' failed (exit code 1); the end of its log:
    no space left on device
"""

from __future__ import annotations

import os
import time
from pathlib import Path

INSTALLS_DIR_ENV = "ART_TEST_INSTALLS_DIR"
WAIT_ENV = "ART_TEST_INSTALL_WAIT_S"
DEFAULT_WAIT_S = 1200.0
NEEDS_INSTALL_MARKER = (
    "needs_install(name, ...): waits for run.sh's background install of each name before setup"
)
_POLL_S = 0.5
_LOG_TAIL_CHARS = 3000


def installs_dir() -> Path | None:
    """The folder of this run's background installs, or None when nothing installs beside."""
    value = os.environ.get(INSTALLS_DIR_ENV)
    return Path(value) if value else None


def wait_s() -> float:
    """How long a test waits for one install (``ART_TEST_INSTALL_WAIT_S``)."""
    value = os.environ.get(WAIT_ENV, "")
    try:
        return float(value) if value else DEFAULT_WAIT_S
    except ValueError as error:
        raise ValueError(f"{WAIT_ENV} must be a number of seconds, got {value!r}") from error


def _log_tail(folder: Path, name: str) -> str:
    try:
        return (folder / f"{name}.log").read_text(errors="replace")[-_LOG_TAIL_CHARS:].strip()
    except OSError:
        return "(no log)"


def wait_for_install(name: str, folder: Path, timeout_s: float) -> str | None:
    """Wait until background install ``name`` in ``folder`` has ended; None if it succeeded or
    was never started, else why not (failed, with its log's end, or still running after
    ``timeout_s``)."""
    status = folder / f"{name}.status"
    deadline = time.monotonic() + timeout_s
    while not status.exists():
        if not (folder / f"{name}.log").exists():
            return None  # not installing here: the test's own check says what is missing
        if time.monotonic() >= deadline:
            return (
                f"the background install {name!r} did not end within {timeout_s:.0f} s "
                f"({WAIT_ENV}); the end of its log:\n{_log_tail(folder, name)}"
            )
        time.sleep(_POLL_S)
    code = status.read_text().strip()
    if code == "0":
        return None
    return (
        f"the background install {name!r} failed (exit code {code}); the end of its log:\n"
        f"{_log_tail(folder, name)}"
    )
