"""The machine a benchmark ran on, in one line every script prints above its table.

Figures depend on the CPU (its matrix extensions decide whether bf16 pays, its core count
whether overlap does): a row of the benchmarks page (docs/benchmarks.md) names the machine its
figures came from, and this line is where that name comes from (``art_core.cpu.cpu_model``,
which the test calibration's line names too).
"""

from __future__ import annotations

import os

from art_core.cpu import cpu_budget, cpu_model


def machine_line() -> str:
    """``machine: <CPU>, <n> cores usable of <m>, GPU: <name or none>``: the first line of a
    benchmark's output.

    Example:
        >>> machine_line().startswith("machine: ")
        True
    """
    gpu = "none"
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return f"machine: {cpu_model()}, {cpu_budget()} cores usable of {os.cpu_count()}, GPU: {gpu}"
