"""``art-core mcp ...`` through the real console script (entry-point plugin)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mcp_support import FAULTY_STDIO, REPO, generator_reply

from art_core.cli import build_parser
from art_core.testing.judge import StandInJudge

ART_CORE = str(Path(sys.executable).with_name("art-core"))


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ART_CORE, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
    )


def test_the_mcp_subcommands_are_registered_through_the_entry_point() -> None:
    parser = build_parser()
    args = parser.parse_args(
        ["mcp", "train", "--server", "mcp-server-time", "--scenarios", "s.jsonl"]
    )
    assert args.mcp_command == "train" and callable(args.func)
    assert args.steps == 10 and args.base_model == "smollm2-135m"


def test_tools_lists_the_converted_tools() -> None:
    result = run_cli("mcp", "tools", "--server", FAULTY_STDIO, "--server-log", os.devnull)
    assert result.returncode == 0, result.stderr
    definitions = json.loads(result.stdout[: result.stdout.rindex("]") + 1])
    assert [d["function"]["name"] for d in definitions][:2] == ["lookup", "add"]
    assert "resource notes://readme: What this server is for" in result.stdout


def test_scenarios_writes_a_jsonl_file(tmp_path: Path) -> None:
    with StandInJudge() as generator:
        generator.script = [generator_reply()]
        out = tmp_path / "s.jsonl"
        result = run_cli(
            "mcp",
            "scenarios",
            "--server",
            FAULTY_STDIO,
            "-n",
            "3",
            "--generator-model",
            "gen",
            "--generator-base-url",
            generator.base_url,
            "-o",
            str(out),
        )
    assert result.returncode == 0, result.stderr
    assert f"wrote 3 scenarios to {out}" in result.stdout
    assert len(out.read_text().splitlines()) == 3


def test_errors_are_reported_without_a_traceback(tmp_path: Path) -> None:
    result = run_cli(
        "mcp", "train", "--server", FAULTY_STDIO, "--scenarios", str(tmp_path / "missing.jsonl")
    )
    assert result.returncode == 1
    assert "art-core mcp: error: no scenario file at" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_demo_runs_end_to_end_on_tiny_random(tmp_path: Path) -> None:
    result = run_cli(
        "mcp",
        "demo",
        "--base-model",
        "tiny-random",
        "--path",
        str(tmp_path),
        "--steps",
        "1",
        "--groups-per-step",
        "2",
        "--rollouts-per-group",
        "2",
        "--val-rollouts",
        "1",
        timeout=600,
    )
    # exit code 0 = the trained model scored higher; with a random model either can happen
    assert result.returncode in (0, 1), result.stderr[-3000:]
    assert "art-mcp demo: 32 training / 8 validation tasks" in result.stdout
    assert "validation, before vs after" in result.stdout
    # Sampling is not seeded: the step's groups may all come back with equal rewards, and
    # then nothing is trained and no checkpoint written (and the demo says so).
    after = re.search(r"after \(step ([01])\)", result.stdout)
    assert after is not None, result.stdout
    checkpoint = next(iter((tmp_path / "mcp-demo" / "models").iterdir())) / "checkpoints" / "0001"
    if after.group(1) == "1":
        assert checkpoint.is_dir()
        assert "The trained model's mean validation reward is" in result.stdout
    else:
        assert not checkpoint.exists()
        assert "No step trained anything" in result.stdout
    # The closing line says how to open the viewer on the model it just trained.
    name = checkpoint.parent.parent.name
    assert f"art-core ui {tmp_path}, then open http://127.0.0.1:7998/run/mcp-demo/{name}" in (
        result.stdout
    )


@pytest.mark.slow
def test_demo_with_a_warm_start_compares_at_the_same_wall_time(tmp_path: Path) -> None:
    result = run_cli(
        "mcp",
        "demo",
        "--base-model",
        "tiny-random",
        "--path",
        str(tmp_path),
        "--steps",
        "2",
        "--groups-per-step",
        "2",
        "--rollouts-per-group",
        "2",
        "--val-rollouts",
        "1",
        "--warm-start",
        "2",
        "--warm-start-min-reward",
        "0",
        "--sft-epochs",
        "1",
        timeout=900,
    )
    assert result.returncode in (0, 1), result.stderr[-3000:]
    out = result.stdout
    assert "warm start on 2 traces, then GRPO" in out and "GRPO alone for the same" in out
    assert "Same training time (" in out and "validation excluded), tiny-random" in out
    assert "with --warm-start 2:" in out and "without:" in out
    assert "warm start: 2 traces from the model itself" in out
    models = {p.name for p in (tmp_path / "mcp-demo" / "models").iterdir()}
    assert {n.rsplit("-", 1)[1] for n in models} == {"warm", "plain"}
