"""A solved task on endless scenarios: every group's rewards are equal, none can be trained on.
The pipeline stops with a warning after ``max_groups_without_signal`` such groups in a row
instead of waiting forever (real gateway, tiny-random)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pipeline_support import CONFIG, scenarios

import art_core as art


async def solved(model: art.TrainableModel, scenario: dict[str, object]) -> art.Trajectory:
    async with art.capture(model) as run:
        await run.openai_client().chat.completions.create(
            model=run.model_name,
            messages=[{"role": "user", "content": str(scenario["prompt"])}],
            max_tokens=2,
        )
    return run.trajectory(reward=1.0)  # every run succeeds: no group has a signal


async def test_a_solved_task_stops_the_pipeline_instead_of_waiting_forever(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with art.LocalBackend(path=tmp_path) as backend:
        model = art.TrainableModel(name="solved", project="pipeline", base_model="tiny-random")
        await model.register(backend)
        trainer = art.PipelineTrainer(
            model,
            solved,
            scenarios(),  # endless
            group_size=2,
            groups_per_step=2,
            max_groups_without_signal=6,
            train_config=CONFIG,
            overlap=False,
            progress=False,
        )
        with caplog.at_level(logging.WARNING, logger="art_core"):
            results = await trainer.train()
        assert results == [] and trainer.stopped_without_signal
        assert trainer.state.dropped_no_signal >= 6
        assert await model.get_step() == 0
    assert "the last 6 groups each had equal rewards (mean 1.000)" in caplog.text


def test_the_limit_is_validated() -> None:
    with pytest.raises(ValueError, match="max_groups_without_signal"):
        art.PipelineTrainer(object(), solved, [], group_size=2, max_groups_without_signal=0)  # type: ignore[arg-type]
