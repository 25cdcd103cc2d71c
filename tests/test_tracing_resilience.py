"""Tracing never blocks or fails a rollout: a dead endpoint, a full queue and a broken exporter
cost nothing but dropped spans; ``import art_core`` does not load OpenTelemetry; the
environment switch turns tracing on."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from tracing_support import closed_port, tool_rollout

import art_core as art
from art_core import tracing
from art_core.tracing import state
from art_core.tracing.tree import ScoreUpdate, SpanNode


async def test_rollouts_finish_with_the_otlp_endpoint_down(tiny_model: art.TrainableModel) -> None:
    tracing.enable("otlp", endpoint=f"http://127.0.0.1:{closed_port()}/v1/traces")
    try:
        groups = await art.gather_trajectory_groups(
            [
                art.TrajectoryGroup(tool_rollout(tiny_model, 0.5) for _ in range(4))
                for _ in range(2)
            ],
            pbar_desc=None,
        )
        assert sum(len(g.trajectories) for g in groups) == 8
        assert not any(g.exceptions for g in groups)
        started = time.perf_counter()
        tracing.flush(10)  # False or True: the point is that it returns, and quickly
        flushed_in = time.perf_counter() - started
        stats = tracing.stats()
    finally:
        started = time.perf_counter()
        tracing.disable(timeout_s=5)
        disabled_in = time.perf_counter() - started
    assert stats["submitted"] == 8 and stats["dropped"] == 0 and stats["failed"] == 0
    assert stats["otlp"]["exported"] == 0 and stats["otlp"]["failed"] > 0
    assert flushed_in < 8 and disabled_in < 6


class _StuckSink:
    """A sink whose export hangs until released: a backend that stopped answering."""

    name = "stuck"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.emitted: list[str] = []

    def capture_parent(self) -> Any:
        return None

    def emit(self, node: SpanNode, parent: Any) -> None:
        self.release.wait(30)
        self.emitted.append(node.name)

    def update_scores(self, update: ScoreUpdate) -> None:
        pass

    def flush(self, timeout_s: float) -> bool:
        return True

    def shutdown(self, timeout_s: float) -> None:
        pass


async def test_a_full_queue_drops_traces_instead_of_waiting(tiny_model: art.TrainableModel) -> None:
    sink = _StuckSink()
    tracing.enable(sink, max_queue_size=2)
    try:
        started = time.perf_counter()
        trajectories = [await tool_rollout(tiny_model, 0.5) for _ in range(5)]
        elapsed = time.perf_counter() - started
        stats = tracing.stats()
        sink.release.set()
        assert tracing.flush(10)
    finally:
        sink.release.set()
        tracing.disable()
    assert len(trajectories) == 5 and elapsed < 20
    # One export in progress, two queued, the rest dropped and counted.
    assert stats["submitted"] == 3 and stats["dropped"] == 2
    assert len(sink.emitted) == 3


class _BrokenSink(_StuckSink):
    name = "broken"

    def capture_parent(self) -> Any:
        raise RuntimeError("backend bug at rollout start")

    def emit(self, node: SpanNode, parent: Any) -> None:
        raise RuntimeError("backend bug at export")


async def test_a_broken_exporter_does_not_break_rollouts(
    tiny_model: art.TrainableModel, caplog: pytest.LogCaptureFixture
) -> None:
    tracing.enable(_BrokenSink())
    try:
        trajectory = await tool_rollout(tiny_model, 0.5)
        assert tracing.flush(10)
    finally:
        tracing.disable()
    assert len(trajectory.calls) == 2
    assert "broken failed to export" in caplog.text


def test_the_environment_turns_tracing_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ART_TRACING", "console")
    monkeypatch.setenv("ART_TRACING_CAPTURE_CONTENT", "off")
    monkeypatch.setattr(state._state, "env_checked", False)
    try:
        pipeline = state.active()
        assert pipeline is not None and pipeline.settings.capture_content is False
        assert [sink.name for sink in pipeline.sinks] == ["otlp"]  # an OTel sink printing spans
    finally:
        tracing.disable()
    monkeypatch.setenv("ART_TRACING", "carrier-pigeon")
    monkeypatch.setattr(state._state, "env_checked", False)
    assert state.active() is None  # a bad value is logged; rollouts go on untraced


def test_import_art_core_does_not_load_opentelemetry() -> None:
    code = "import sys, art_core, art_core.tracing; print('opentelemetry' in sys.modules)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ART_TRACING")}
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    assert done.stdout.strip() == "False"
