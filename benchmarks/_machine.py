"""The machine a benchmark ran on, in one line every script prints above its table.

Figures depend on the CPU (its matrix extensions decide whether bf16 pays, its core count
whether overlap does): a row of the benchmarks page (docs/benchmarks.md) names the machine its
figures came from, and this line is where that name comes from.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

# The extensions that change which dtype and kernels a CPU run uses.
EXTENSIONS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def cpu_model() -> str:
    """The CPU's model name and the matrix extensions it has, e.g.
    ``AMD EPYC (avx2, avx512f, avx512_bf16)``.

    Example:
        >>> cpu_model() != ""
        True
    """
    name, flags = platform.processor() or platform.machine() or "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                name = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass
    found = [f for f in EXTENSIONS if f in flags]
    return f"{name} ({', '.join(found) if found else 'no AVX2'})"


def machine_line() -> str:
    """``machine: <CPU>, <n> cores usable of <m>, GPU: <name or none>``: the first line of a
    benchmark's output.

    Example:
        >>> machine_line().startswith("machine: ")
        True
    """
    from art_core.cpu import cpu_budget

    gpu = "none"
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return f"machine: {cpu_model()}, {cpu_budget()} cores usable of {os.cpu_count()}, GPU: {gpu}"
