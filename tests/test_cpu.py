"""CPU threads follow the cores the process may use, and OpenMP waits passively."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from art_core import cpu


def _env_after(code: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def test_import_art_core_makes_openmp_wait_passively() -> None:
    assert _env_after("import art_core, os; print(os.environ['OMP_WAIT_POLICY'])") == "PASSIVE"


def test_a_policy_the_user_chose_is_kept() -> None:
    code = "import art_core, os; print(os.environ['OMP_WAIT_POLICY'])"
    assert _env_after(code, OMP_WAIT_POLICY="ACTIVE") == "ACTIVE"


def test_torch_imported_first_is_left_alone_and_reported() -> None:
    code = (
        "import torch, art_core, os; from art_core.cpu import prefer_passive_openmp; "
        "print(os.environ.get('OMP_WAIT_POLICY', 'unset'), prefer_passive_openmp())"
    )
    assert _env_after(code) == "unset False"


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
