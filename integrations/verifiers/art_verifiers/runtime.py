"""The verifiers runtime: its own virtual environment, beside the project's.

verifiers' pins clash with the core's (0.2.1 wants ``mcp<2`` where art_mcp needs 2.3; 0.4.0
wants ``mcp==2.0.0`` and ``openai<3`` where openai-agents needs openai 3; 0.1.x pins
``regex<2026.4.4`` and ``datasets<4.7``), so it is never installed into the project's venv.
It gets a venv under the runtimes folder (``$ART_CORE_RUNTIMES_DIR``, default
``~/.cache/art_core/runtimes``), like vLLM's runtime and the tracing servers; environments run
there as a subprocess pointed at a rollout's base URL (plain HTTP, see ``art_verifiers.rollout``).

``art-core verifiers install`` creates it (idempotent: a marker holding the pins makes a
second run instant). ``ART_VERIFIERS_PYTHON`` points at another interpreter that has
verifiers (a venv of your own, with your environments installed) instead.

Example:
    >>> runtime_dir().name
    'verifiers'
    >>> PINS
    ('verifiers==0.2.1',)
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from art_core import venvs
from art_core.engines.vllm_runtime import runtimes_dir
from art_core.files import atomic_write_text

# The last release whose top-level API is the one verifiers' documentation and environments
# use (``vf.SingleTurnEnv``, ``vf.ToolEnv``, ``vf.Rubric``, ``load_environment``); 0.3+ moved
# to a new ``verifiers.v1`` stack.
PINS: tuple[str, ...] = ("verifiers==0.2.1",)
PYTHON_ENV = "ART_VERIFIERS_PYTHON"
MARKER = ".art-verifiers-runtime.json"


def runtime_dir() -> Path:
    """The folder of the verifiers venv this package installs."""
    return runtimes_dir() / "verifiers"


def is_installed() -> bool:
    """Whether the verifiers venv exists with the pinned versions (or ``ART_VERIFIERS_PYTHON``
    names an interpreter).

    Example:
        >>> isinstance(is_installed(), bool)
        True
    """
    if os.environ.get(PYTHON_ENV):
        return True
    pins = _installed_pins()
    return pins is not None and pins[: len(PINS)] == list(PINS)


def _installed_pins() -> list[str] | None:
    """What the venv was installed with (its marker), or None when there is none."""
    try:
        marker = json.loads((runtime_dir() / MARKER).read_text())
    except (OSError, ValueError):
        return None
    pins = marker.get("pins") if isinstance(marker, dict) else None
    return [str(p) for p in pins] if isinstance(pins, list) else None


def runtime_python() -> Path:
    """The interpreter that runs verifiers environments; raises ``RuntimeError`` saying how to
    install it when there is none.

    Example:
        >>> runtime_python()  # needs an install: the verifiers venv (else RuntimeError)  # doctest: +SKIP
        PosixPath('/root/.cache/art_core/runtimes/verifiers/bin/python')
    """
    override = os.environ.get(PYTHON_ENV)
    if override:
        path = Path(override)
        if not path.exists():
            raise RuntimeError(f"{PYTHON_ENV}={override!r} does not exist")
        return path
    if not is_installed():
        raise RuntimeError(
            "the verifiers runtime is not installed: run `art-core verifiers install` "
            f"(a venv with {', '.join(PINS)} under {runtime_dir()}), or set {PYTHON_ENV} to "
            "an interpreter that has verifiers"
        )
    return runtime_dir() / "bin" / "python"


def install_runtime(*, quiet: bool = True, extra: tuple[str, ...] = ()) -> Path:
    """Create the verifiers venv with its pins (and ``extra`` packages, e.g. your own
    environments); with the same verifiers pin already there, only ``extra`` packages not yet
    installed are added (a second call returns at once). Returns the folder.

    Example:
        >>> install_runtime()  # needs an install: this is the install (a venv from PyPI)  # doctest: +SKIP
        PosixPath('/root/.cache/art_core/runtimes/verifiers')
    """
    target = runtime_dir()
    python = str(target / "bin" / "python")
    installed = _installed_pins()
    if installed is not None and installed[: len(PINS)] == list(PINS):
        # The same verifiers: keep the venv (and the environments installed in it before);
        # only packages not installed yet are added.
        missing = [p for p in extra if p not in installed]
        if missing:
            venvs.install(python, missing, quiet=quiet)
            atomic_write_text(target / MARKER, json.dumps({"pins": [*installed, *missing]}))
        return target
    if target.exists():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    venvs.create_venv(target)
    pins = [*PINS, *extra]
    venvs.install(python, pins, quiet=quiet)
    atomic_write_text(target / MARKER, json.dumps({"pins": pins}))
    return target
