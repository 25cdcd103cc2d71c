"""CPU threads follow the cores the process may use and the cores other processes leave free."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from art_core import cpu


def test_import_art_core_leaves_the_openmp_wait_policy_to_the_user() -> None:
    clean = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run(
        [sys.executable, "-c", "import art_core, os; print(os.environ.get('OMP_WAIT_POLICY'))"],
        env=clean,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "None"


def test_a_cpu_bound_process_shows_as_a_busy_core() -> None:
    use = cpu.CoreUse(interval_s=0.0)
    if use.others_busy() is None and not use._usable:
        pytest.skip("no /proc/stat view of this process's cores (not Linux, or a cgroup quota)")
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        use.others_busy()  # the reading the next one is compared with
        time.sleep(1.0)
        busy = use.others_busy()
    finally:
        burner.kill()
        burner.wait()
    # The competitor used about one whole core; this process almost none.
    assert busy is not None and busy >= 0.6


def test_torch_threads_follow_the_cores_other_processes_leave_free(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    from art_core import device

    others = {"busy": 0.0}
    monkeypatch.setattr(device, "cpu_budget", lambda: 2)
    monkeypatch.setattr(cpu.CORE_USE, "budget", lambda: 2)
    monkeypatch.setattr(cpu.CORE_USE, "others_busy", lambda: others["busy"])
    monkeypatch.delenv(cpu.ADAPT_ENV, raising=False)

    def in_a_thread() -> list[int]:
        seen = [device.use_cpu_threads(2)]
        for busy in (1.0, 0.4, 1.6, 0.0):
            others["busy"] = busy
            seen.append(device.follow_free_cores())
            assert torch.get_num_threads() == seen[-1]
        torch.set_num_threads(1)  # the user's own choice is kept from now on
        others["busy"] = 0.0
        seen.append(device.follow_free_cores())
        seen.append(device.use_cpu_threads())
        return seen

    with ThreadPoolExecutor(1) as pool:  # a thread of its own: torch threads are per thread
        # busy 1.0 -> one core taken; 0.4 -> less than half a core: both free; 1.6 -> at
        # least one thread always; then the user's 1 is kept by both calls.
        assert pool.submit(in_a_thread).result() == [2, 1, 2, 1, 2, 1, 1]
    monkeypatch.setenv(cpu.ADAPT_ENV, "0")
    others["busy"] = 1.0
    assert cpu.free_cores(2) == 2  # turned off: the whole budget


def test_the_budget_asked_every_decode_step_is_read_once_an_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reads = []
    monkeypatch.setattr(cpu, "cpu_budget", lambda: reads.append(1) or 3)
    use = cpu.CoreUse(interval_s=3600)
    assert [use.budget() for _ in range(100)] == [3] * 100
    assert len(reads) == 1
    use = cpu.CoreUse(interval_s=0)  # every call reads again
    assert [use.budget() for _ in range(3)] == [3] * 3 and len(reads) == 4


def test_the_cpu_budget_is_the_affinity_mask_capped_by_a_cgroup_quota(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cores = len(os.sched_getaffinity(0))
    monkeypatch.setattr(cpu, "_cgroup_cpu_limit", lambda: None)
    assert cpu.cpu_budget() == cores
    monkeypatch.setattr(cpu, "_cgroup_cpu_limit", lambda: 0.5)  # half a CPU: still one thread
    assert cpu.cpu_budget() == 1


def test_torch_threads_are_capped_at_the_budget_and_never_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    from art_core import device

    before = torch.get_num_threads()
    try:
        monkeypatch.setattr(device, "cpu_budget", lambda: 1)
        torch.set_num_threads(2)
        assert device.use_cpu_threads() == 1 and torch.get_num_threads() == 1
        monkeypatch.setattr(device, "cpu_budget", lambda: 8)
        assert device.use_cpu_threads() == 1  # a smaller count set before is kept
        assert device.use_cpu_threads(3) == 3
    finally:
        torch.set_num_threads(before)


def test_a_threads_count_is_set_without_changing_the_one_new_threads_start_on() -> None:
    """torch starts a new thread on the count last set in any thread; ``set_cpu_threads``
    sets one thread's count (one side of a sampling/training split) and leaves that."""
    import torch

    from art_core import device

    def new_thread_count() -> int:
        with ThreadPoolExecutor(1) as fresh:
            return fresh.submit(torch.get_num_threads).result()

    default = new_thread_count()
    with ThreadPoolExecutor(1) as sampler:
        assert device.set_cpu_threads(sampler, 1) == 1
        assert sampler.submit(torch.get_num_threads).result() == 1
        assert new_thread_count() == default
