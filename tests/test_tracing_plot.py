"""``art-core plot``: reward, loss and judge curves from history.jsonl, as PNG files and an HTML
page; and W&B logging of the same history (offline mode)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from matplotlib.image import imread
from tracing_support import wait_for_wandb_history

from art_core import metrics, tracing
from art_core.cli import main
from art_core.metrics import hooks as metric_hooks
from art_core.metrics.plot import metric_series, plot_history
from art_core.metrics.wandb import WandbLogger


def write_history(folder: Path, steps: int = 6) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for step in range(steps):
        lines.append(
            {
                "step": step,
                "split": "train",
                "train/reward": 0.1 + 0.1 * step,
                "train/loss": 0.5 - 0.05 * step,
                "train/ruler_score": 0.2 + 0.1 * step,
                "train/independent_reward": 0.05 * step,
                "checkpoint_step": step + 1,
            }
        )
        if step % 2 == 0:
            lines.append({"step": step, "split": "val", "val/reward": 0.1 * step, "time": 1.0})
    lines.append({"step": 5, "split": "train", "train/loss": None})  # a diverged step: null
    (folder / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines) + "\n")
    return folder


def test_plot_writes_png_curves_and_an_html_page(tmp_path: Path) -> None:
    model_dir = write_history(tmp_path / "model")
    result = plot_history(model_dir)
    assert [f.name for f in result.files] == ["reward.png", "loss.png", "judge.png", "index.html"]
    for png in result.files[:3]:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert imread(png).shape[:2] == (400, 700)
    rewards = [v for _, v in result.series["train/reward"]]
    assert rewards == sorted(rewards) and rewards[-1] > rewards[0]
    assert result.series["val/reward"] == [(0, 0.0), (2, 0.2), (4, 0.4)]
    page = (model_dir / "plots" / "index.html").read_text()
    assert page.count("<img") == 3 and "train/ruler_score" in page


def test_plot_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model_dir = write_history(tmp_path / "model")
    assert main(["plot", str(model_dir), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert str(tmp_path / "out" / "reward.png") in out
    assert "train/reward: 0.100 (step 0) -> 0.600 (step 5)" in out
    assert main(["plot", str(tmp_path / "empty")]) == 2
    assert "no history" in capsys.readouterr().err


def test_metric_series_averages_records_of_a_step() -> None:
    series = metric_series(
        [
            {"step": 1, "val/reward": 0.2},
            {"step": 1, "val/reward": 0.4},
            {"step": "x", "val/reward": 9},
        ]
    )
    assert series == {"val/reward": [(1, pytest.approx(0.3))]}


def test_wandb_logs_the_history_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    logger = WandbLogger(mode="offline", dir=str(tmp_path))
    model = SimpleNamespace(name="agent-001", project="wandb-test", base_model="tiny-random")
    for step in range(3):
        logger.log(model, {"train/reward": 0.25 * step, "train/loss": 1.0 - step / 10}, step=step)
    logger.log(model, {"val/reward": 0.5}, step=2)
    assert logger.flush(60)
    logger.close(60)
    rows = wait_for_wandb_history(tmp_path, lambda rows: any("val/reward" in r for r in rows))
    assert [float(r["train/reward"]) for r in rows if "train/reward" in r] == [0.0, 0.25, 0.5]
    assert [r["_step"] for r in rows if "val/reward" in r] == ["2"]


def test_the_metrics_hooks_log_train_steps_and_model_log_records_to_wandb(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_CONSOLE": "off",
    }.items():
        monkeypatch.setenv(name, value)
    model = SimpleNamespace(name="hooked", project="wandb-hooks", base_model="tiny-random")
    metric_hooks.train_step_finished(model, {"train/reward": 0.5}, step=1)  # off: nothing
    metrics.enable_wandb(mode="offline", dir=str(tmp_path))
    try:
        # a train step that produced adapter 2 trained on rollouts of adapter 1: history step 1
        metric_hooks.train_step_finished(model, {"train/reward": 0.75, "note": "x"}, step=2)
        metric_hooks.history_logged(model, {"step": 2, "split": "val", "val/reward": 0.25})
        assert metrics.flush(60)
    finally:
        metrics.disable_wandb(60)
    assert metrics.flush(1.0)  # off again: nothing to wait for
    rows = wait_for_wandb_history(tmp_path, lambda rows: any("val/reward" in r for r in rows))
    assert [(r["_step"], float(r["train/reward"])) for r in rows if "train/reward" in r] == [
        ("1", 0.75)
    ]
    assert [(r["_step"], float(r["val/reward"])) for r in rows if "val/reward" in r] == [
        ("2", 0.25)
    ]


def test_the_wandb_switch_keeps_its_old_names_in_tracing() -> None:
    assert tracing.enable_wandb is metrics.enable_wandb
    assert tracing.disable_wandb is metrics.disable_wandb
    with pytest.raises(AttributeError, match="no attribute 'plot_history'"):
        tracing.plot_history  # noqa: B018
