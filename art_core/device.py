"""The one decision of device and precision, shared by the engine and the trainer.

The sampler and the trainer must agree: importance ratios compare the trainer's logprobs
with the sampler's, so running them at silently different precisions on one machine is a
bug. Both ask this module, which decides once per process and logs what it decided.

Example:
    >>> choose_device("cpu")
    device(type='cpu')
    >>> autocast_dtype("fp32", torch.device("cpu")) is None
    True
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import torch

from art_core.cpu import CORE_USE, cpu_budget, free_cores

logger = logging.getLogger(__name__)
T = TypeVar("T")
# Each torch-calling thread's chosen thread count (OpenMP keeps one per calling thread).
_targets = threading.local()


def choose_device(device: str | torch.device | None = None) -> torch.device:
    """``device`` when given, else CUDA when available, else CPU."""
    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@functools.cache
def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AMX or AVX512-BF16), per ``/proc/cpuinfo``.

    Only then does bf16 pay on CPU: decoding SmolLM2-135M is 5-10x faster than fp32 on a
    Xeon with AMX, and a training step ~2x faster under autocast. Without those instructions
    (AVX2-only CPUs, AVX-512 without BF16), bf16 is emulated and slower than fp32. oneDNN's
    own probe also says yes on CPUs that only emulate it, so it is not asked.
    """
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        flags = ""
    native = "amx_bf16" in flags or "avx512_bf16" in flags
    logger.info(
        "CPU precision: %s (native bf16 %s per /proc/cpuinfo)",
        "bf16" if native else "fp32",
        "present" if native else "absent",
    )
    return native


def serving_dtype(device: str | torch.device) -> torch.dtype:
    """The dtype the engine keeps weights in: bf16 where the hardware does it, else fp16 on
    older GPUs and fp32 on CPUs without native bf16.

    Example:
        >>> serving_dtype("cpu") in (torch.bfloat16, torch.float32)
        True
    """
    if torch.device(device).type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_has_native_bf16() else torch.float32


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The trainer's autocast dtype for ``precision`` on ``device``, None for plain fp32.

    ``"auto"`` is bf16 wherever ``serving_dtype`` is bf16, so sampler and trainer agree.
    """
    if precision == "fp32":
        return None
    if precision == "bf16":
        return torch.bfloat16
    if precision != "auto":
        raise ValueError(f"precision must be 'auto', 'bf16' or 'fp32', got {precision!r}")
    if device.type in ("cuda", "cpu"):
        return torch.bfloat16 if serving_dtype(device) == torch.bfloat16 else None
    return None


def use_cpu_threads(threads: int | None = None) -> int:
    """Cap torch's CPU threads at the cores this process may use (``cpu.cpu_budget``), or
    set them to ``threads`` (capped the same way); returns the count now in use.

    torch's default is the machine's core count, which under a CPU quota or an affinity mask
    is more threads than cores: they then wait for each other. A smaller count set earlier
    (a data-parallel rank's thread budget, a user's choice) is kept. The count becomes the
    calling thread's target for ``follow_free_cores``.

    Example:
        >>> use_cpu_threads() >= 1
        True
    """
    budget = cpu_budget()
    current = torch.get_num_threads()
    if current == getattr(_targets, "applied", None):  # lowered by follow_free_cores
        current = _targets.threads
    wanted = max(1, min(current if threads is None else threads, budget))
    _targets.threads = _targets.applied = wanted
    if torch.get_num_threads() != wanted:
        torch.set_num_threads(wanted)
        logger.info("torch CPU threads: %d (this process may use %d cores)", wanted, budget)
    return wanted


def set_cpu_threads(pool: Executor, threads: int | None = None) -> int:
    """``use_cpu_threads(threads)`` on ``pool``'s thread, leaving the count new threads start
    on as it was; returns the count set.

    torch (2.13 with its OpenMP, Linux) starts every new thread on the count last set in any
    thread: the sampler's share of a sampling/training split became the count of every
    thread created after it, so a model registered later sampled and trained on one thread
    of two cores. The count new threads start on is read, and set back, in a thread of its
    own (setting it there changes no other thread's count).

    Example:
        >>> from concurrent.futures import ThreadPoolExecutor
        >>> with ThreadPoolExecutor(1) as pool:
        ...     set_cpu_threads(pool, 1)
        1
    """
    default = _in_a_new_thread(torch.get_num_threads)
    try:
        return pool.submit(use_cpu_threads, threads).result()
    finally:
        _in_a_new_thread(torch.set_num_threads, default)


def _in_a_new_thread(fn: Callable[..., T], *args: Any) -> T:
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="art-threads") as pool:
        return pool.submit(fn, *args).result()


def follow_free_cores() -> int:
    """Fit this thread's torch threads to the cores other processes leave free, up to its
    target (``use_cpu_threads``); returns the count now in use.

    OpenMP threads meet at a barrier after every parallel region: with more threads than
    free cores, every region waits for a thread the OS is not running (a step measured 3-16x
    slower beside one CPU-bound process). With one thread fewer, a competing process slows
    us in proportion. Cheap enough to call every decode step (one clock read between
    ``/proc/stat`` readings); a thread that never chose a target is left alone.

    Example:
        >>> follow_free_cores() >= 1
        True
    """
    target = getattr(_targets, "threads", None)
    current = torch.get_num_threads()
    if target is None or current != _targets.applied:  # no target, or the user set one since
        return current
    if target < 2:
        return current
    wanted = min(target, free_cores(CORE_USE.budget()))
    if current != wanted:
        torch.set_num_threads(wanted)
        _targets.applied = wanted
        logger.debug("torch CPU threads: %d of %d (other processes busy)", wanted, target)
    return wanted
