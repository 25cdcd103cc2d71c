"""Every script under ``benchmarks/`` runs with ``--smoke`` and prints its table: here, or,
for the steps of ``bash run.sh gpu-check``'s CPU side, in ``tests/test_gpu_check.py``.

A benchmark is a README command: a change in what ``train`` returns, or in an engine's
metrics, must fail here and not on a user's fresh clone. ``--smoke`` runs each script on
tiny-random (or the fewest steps) through every code path it has, including a step that
trains nothing, a failed group and a missing baseline, and prints the same table.

Each script runs in its own process, as ``bash run.sh bench NAME --smoke`` runs it (``python
benchmarks/NAME.py --smoke``), with the test session's models folder (the embedded models are
built once) and its art_core cache (``shared_cache_home``: nothing is written to the user's
``~/.cache``): forked from one that has already imported torch, transformers and art_core
(``fork_support``), so no run pays those imports again.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fork_support import ForkServer

ROOT = Path(__file__).resolve().parent.parent
ALL_SCRIPTS = sorted(
    p.stem for p in (ROOT / "benchmarks").glob("*.py") if not p.stem.startswith("_")
)
# The steps of `bash run.sh gpu-check` without CUDA (its CPU side), with the arguments that
# command gives them: tests/test_gpu_check.py runs that command and checks each step's exit
# status and its output (the machine named). Run here again, they would only do the
# same work twice (about 20 s of a CI run).
RUN_BY_GPU_CHECK = {"gpu", "decode_overhead", "prefix_cache", "gpu_env"}
SCRIPTS = [s for s in ALL_SCRIPTS if s not in RUN_BY_GPU_CHECK]
# The GPU machine's setup steps (versions, shapes, wheels): they measure nothing.
NOT_MEASURING = {"gpu_bundle", "gpu_env", "gpu_models"}
# What a script's smoke output holds beyond its table: cli_agents (a stand-in agent on
# tiny-qwen2.5, ~20 s) prints the README table read back from the JSON line it wrote.
EXPECTED = {"cli_agents": ("=== stand-in ===", "appended to ", "| stand-in | tiny-qwen2.5 ")}
# One smoke run on 2 busy cores: tiny-random models, a step or two. A run past this is a
# hang, not a slow machine.
TIMEOUT_S = 600


def test_every_benchmark_is_covered() -> None:
    """A new script under benchmarks/ is picked up by the glob; none may lack --smoke; the
    ones left to gpu-check are still steps of its CPU side."""
    missing = [
        s for s in ALL_SCRIPTS if "--smoke" not in (ROOT / "benchmarks" / f"{s}.py").read_text()
    ]
    assert not missing, f"benchmarks without a --smoke flag: {missing}"
    run_sh = (ROOT / "run.sh").read_text()
    gpu_check = run_sh[run_sh.index("gpu_check() {") : run_sh.index('echo "gpu-check: ')]
    # the steps it runs everywhere, then the branch it runs without CUDA
    everywhere, _, branches = gpu_check.partition('if [ "$cuda" = 1 ]')
    cpu_side = everywhere + branches[branches.index("CUDA NOT FOUND") :]
    not_run = [s for s in sorted(RUN_BY_GPU_CHECK) if f"benchmarks/{s}.py" not in cpu_side]
    assert not not_run, f"left to gpu-check, but not among its CPU-side steps: {not_run}"


@pytest.fixture(scope="module")
def fork_server(shared_cache_home: Path) -> Iterator[ForkServer]:
    # The run's art_core cache, not the user's: what a script caches (RULER's judgments, its
    # compiled steps) stays in the run's temporary folder.
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "ART_CORE_CACHE_DIR": str(shared_cache_home)}
    # As a user runs them: torch threads follow the free cores (the test session fixes them
    # for bit-exact comparisons, which on a busy machine makes each step 10-50x slower).
    env.pop("ART_CORE_FOLLOW_FREE_CORES", None)
    server = ForkServer([sys.executable, str(Path(__file__).parent / "fork_support.py")], env)
    try:
        assert server.ready, "the fork server did not start (a thread after its imports?)"
        yield server
    finally:
        server.close()


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_smoke(script: str, tmp_path: Path, fork_server: ForkServer) -> None:
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    returncode = fork_server.run(
        {
            "argv": [str(ROOT / "benchmarks" / f"{script}.py"), "--smoke"],
            # anything a script writes beside its table stays in the test's folder
            "cwd": str(tmp_path),
            "out": str(out),
            "err": str(err),
        },
        TIMEOUT_S,
    )
    stdout, stderr = out.read_text(), err.read_text()
    tail = (stdout[-4000:] + "\n--- stderr ---\n" + stderr[-4000:]).strip()
    assert returncode == 0, f"{script} --smoke exited {returncode}:\n{tail}"
    assert stdout.strip(), f"{script} --smoke printed no table:\n{tail}"
    if script not in NOT_MEASURING:  # its figures depend on the machine: it names it
        assert stdout.startswith("machine: "), f"{script} does not name the machine:\n{tail}"
    missing = [text for text in EXPECTED.get(script, ()) if text not in stdout]
    assert not missing, f"{script} --smoke printed no {missing}:\n{tail}"
