"""``bash run.sh gpu-bundle`` and the CPU side of ``bash run.sh gpu-check`` (issue 36).

The bundle is what a GPU machine without network installs beside its own torch: every wheel
pinned, one version of each, binary ones for CPython 3.12 on manylinux x86_64, well under the
64 MiB the lending tool carries. Without CUDA, gpu-check still runs its checks, collects the
CUDA tests (they skip) and the benchmark at tiny size, and says that CUDA was not found.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_bundle import LIMIT_MIB, check, needed  # noqa: E402


def run_sh(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(ROOT / "run.sh"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_the_bundle_pins_what_the_gpu_image_lacks() -> None:
    pins = needed()
    # art_core's own needs the image lacks, the tests' plugin, and no package of the image
    # beyond the two bundled on purpose (see gpu_bundle.ALWAYS).
    assert {"pydantic", "pydantic-core", "llguidance", "openai", "starlette", "uvicorn"} <= set(
        pins
    )
    assert "pytest-asyncio" in pins
    assert not {"torch", "numpy", "tokenizers", "safetensors", "peft", "pytest"} & set(pins)
    assert pins["transformers"] == __import__("transformers").__version__


@pytest.mark.slow
def test_gpu_bundle_downloads_every_pinned_wheel_under_the_limit(tmp_path: Path) -> None:
    folder = tmp_path / "whl"
    done = run_sh("gpu-bundle", str(folder))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert check(folder, needed()) == []
    names = sorted(p.name for p in folder.glob("*.whl"))
    size = sum(p.stat().st_size for p in folder.glob("*.whl")) / 2**20
    assert size < LIMIT_MIB and f"{size:.2f} MiB" in done.stdout
    binary = [n for n in names if not n.endswith("-none-any.whl")]
    assert binary and all("manylinux" in n and "x86_64" in n for n in binary), binary
    assert all("cp312" in n or "abi3" in n for n in binary), binary
    assert any(n.startswith("llguidance-") for n in names)


@pytest.mark.slow
def test_gpu_check_runs_its_cpu_side_without_cuda(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: gpu-check would run the GPU side")
    out = tmp_path / "out"
    done = run_sh("gpu-check", str(out), env={"ART_GPU_WORK": str(tmp_path / "work")})
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    summary = (out / "summary.txt").read_text()
    assert "CUDA NOT FOUND" in summary and "FAILED" not in summary, summary
    assert "skipped" in (out / "pytest.log").read_text()  # collected, and skipped
    assert "art_core's requirements" in (out / "env.txt").read_text()
    report = json.loads((out / "bench.json").read_text())
    assert report["device"] == "cpu"
    assert all(row["gateway"] > 0 and row["generate"] > 0 for row in report["decode"])
    assert {row["model"] for row in report["grpo"]} == {"qwen2.5-0.5b", "qwen2.5-7b"}
    assert all(row["trained"] for row in report["grpo"])
    assert "gateway tok/s" in (out / "bench.txt").read_text()
    # The benchmarks of its CPU side (test_benchmarks_smoke leaves them to this test): each
    # names the machine its figures depend on (a log holds stderr too: warnings may come first).
    for log in ("bench.log", "decode_overhead.txt", "prefix_cache.txt"):
        text = (out / log).read_text()
        assert re.search(r"^machine: ", text, re.MULTILINE), (
            f"{log} names no machine:\n{text[-3000:]}"
        )
