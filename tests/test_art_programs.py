"""Programs written in OpenPipe ART's style run against art-core as a user would.

Each program in ``tests/art_programs`` imports ``art`` (the opt-in alias that
``art-core art-alias install`` puts in a site folder), builds trajectories by hand from the
openai client's ``Choice`` objects, gathers groups and trains: the patterns of ART's
examples/2048, examples/tic_tac_toe and its client docs. Each runs in a fresh process and
folder, as ``python train.py`` would; the checks read what it left on disk: every trajectory
matched to its recorded calls, and a step whose rewards differed wrote a checkpoint whose
adapter differs from the one before it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from art_program_support import (
    PROGRAMS,
    build_stand_in,
    conversations_2048,
    conversations_tic_tac_toe,
)
from safetensors.numpy import load_file

from art_core.cli import main

pytestmark = pytest.mark.slow


# `python SCRIPT ARGS...` in an interpreter whose site folder holds the `import art` hook.
RUN_AS_SCRIPT = (
    "import runpy, site, sys; site.addsitedir(sys.argv[1]); script = sys.argv[2]; "
    "sys.argv = sys.argv[2:]; sys.path.insert(0, str(__import__('pathlib').Path(script).parent)); "
    "runpy.run_path(script, run_name='__main__')"
)


def run_program(script: Path, folder: Path, env: dict[str, str], *args: str) -> str:
    """Run one program in ``folder`` (its ``.art`` lands there); its output."""
    site_dir = folder / "site-packages"
    assert main(["art-alias", "install", "--site", str(site_dir)]) == 0
    done = subprocess.run(
        [sys.executable, "-c", RUN_AS_SCRIPT, str(site_dir), str(script), *args],
        cwd=folder,
        env={**os.environ, "TQDM_DISABLE": "1", **env},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-6000:]
    return done.stdout


def adapter(model_dir: Path, step: int) -> dict[str, np.ndarray]:
    return load_file(model_dir / "checkpoints" / f"{step:04d}" / "adapter_model.safetensors")


def check_trained(model_dir: Path, steps: int) -> list[dict[str, float]]:
    """Every train step matched all its trajectories; each step whose rewards differed
    changed the adapter (LoRA B starts at zero, so step 1 changes it from zero)."""
    records = [json.loads(line) for line in (model_dir / "history.jsonl").read_text().splitlines()]
    train = [
        r for r in records if "train/trajectories_without_calls" in r and "checkpoint_step" in r
    ]
    assert len(train) == steps, records
    for record in train:
        assert record["train/trajectories_without_calls"] == 0, record
        assert record["train/num_trainable_tokens"] > 0, record
    trained = [r for r in train if r["train/reward_std"] > 0]
    assert trained, "no step had rewards that differ"
    for record in trained:
        step = record["checkpoint_step"]
        after = adapter(model_dir, step)
        before = (
            adapter(model_dir, step - 1)
            if step > 1
            else {k: np.zeros_like(v) if "lora_B" in k else v for k, v in after.items()}
        )
        assert any(not np.array_equal(after[k], before[k]) for k in after), step
    return train


def test_2048(tmp_path: Path) -> None:
    stand_in = build_stand_in(
        "stand-in-2048-v2", conversations_2048(16, seed=0), steps=500, learning_rate=1e-2
    )
    run_program(
        PROGRAMS / "game_2048" / "train.py",
        tmp_path,
        {
            "ART_PROGRAM_BASE_MODEL": str(stand_in),
            "ART_PROGRAM_STEPS": "1",
            "ART_PROGRAM_ROLLOUTS": "6",
        },
    )
    model_dir = tmp_path / ".art" / "2048" / "models" / "agent-2048"
    [step] = check_trained(model_dir, steps=1)
    assert step["train/num_trajectories"] == 6


def test_tic_tac_toe(tmp_path: Path) -> None:
    stand_in = build_stand_in(
        "stand-in-tic-tac-toe-v2",
        conversations_tic_tac_toe(40, seed=0),
        steps=200,
        learning_rate=1e-2,
    )
    out = run_program(
        PROGRAMS / "tic_tac_toe" / "train.py",
        tmp_path,
        {
            "ART_PROGRAM_BASE_MODEL": str(stand_in),
            "ART_PROGRAM_STEPS": "1",
            "ART_PROGRAM_ROLLOUTS": "8",
        },
        "--backend",
        "local",
    )
    assert "registering" in out and "training" in out
    check_trained(tmp_path / ".art" / "tic-tac-toe" / "models" / "ttt-agent", steps=1)


def test_client_loop(tmp_path: Path) -> None:
    # its rewards come from the answer's length: tiny-random will do
    out = run_program(
        PROGRAMS / "client_loop" / "client.py",
        tmp_path,
        {"ART_PROGRAM_BASE_MODEL": "tiny-random", "ART_PROGRAM_STEPS": "1"},
    )
    assert "num train groups: 2" in out and "length of each train group: 8" in out
    model_dir = tmp_path / ".art" / "my-agentic-task" / "models" / "agent-001"
    # one step through model.train, one through ART 0.5's backend.train + model.log
    _, second = check_trained(model_dir, steps=2)
    records = [json.loads(line) for line in (model_dir / "history.jsonl").read_text().splitlines()]
    logged = records[-1]  # model.log(train_groups, metrics=result.metrics, step=result.step)
    assert logged["step"] == second["checkpoint_step"] == 2 and logged["split"] == "train"
