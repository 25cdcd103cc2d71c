"""``PipelineTrainer`` on one GPU: sampling and training cannot overlap on the device that
holds both, so the default (``overlap=None``) trains lock-step and says why, and
``overlap=True`` refuses with a clear error before anything runs."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from cuda_support import needs_cuda
from pipeline_support import CONFIG, rollout, scenarios

import art_core as art

pytestmark = needs_cuda


async def _pipeline(backend: art.LocalBackend, **options: object) -> art.PipelineTrainer:
    model = art.TrainableModel(name="gpu", project="pipeline", base_model="tiny-random")
    await model.register(backend)
    return art.PipelineTrainer(
        model,
        rollout,
        scenarios(),
        group_size=4,
        groups_per_step=2,
        max_steps=2,
        train_config=CONFIG.model_copy(update={"precision": "auto"}),
        keep_groups_without_signal=True,
        progress=False,
        **options,  # type: ignore[arg-type]
    )


async def test_the_default_pipeline_on_one_gpu_trains_lock_step_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with art.LocalBackend(path=tmp_path, engine="transformers", device="cuda:0") as backend:
        trainer = await _pipeline(backend)
        with caplog.at_level(logging.WARNING, logger="art_core.pipeline.trainer"):
            results = await trainer.train()
        assert [r.step for r in results] == [1, 2]
        assert [r.metrics["train/pipeline_overlap"] for r in results] == [0.0, 0.0]
        assert trainer.overlap_chosen is False
        assert "one GPU holds both" in caplog.text
        with pytest.raises(ValueError, match="one GPU holds both"):
            await (await _pipeline(backend, overlap=True)).train()
