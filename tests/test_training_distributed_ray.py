"""Data-parallel training on a local Ray cluster: the ranks are a Ray actor group; a rank
killed mid-step fails only that step, Ray restarts it, and the next step trains."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from distributed_support import (
    FAST,
    adapter,
    assert_same_metrics,
    assert_same_tensors,
    random_groups,
)
from transformers import AutoModelForCausalLM

from art_core.embedded import resolve_base_model
from art_core.model_folder import ModelFolder
from art_core.training import Trainer
from art_core.training.distributed import DistributedTrainer, TrainingWorld, TrainingWorldError


def test_a_ray_actor_group_trains_like_one_rank_and_survives_a_killed_rank(
    tmp_path: Path, local_ray_cluster: None
) -> None:
    base_path = resolve_base_model("tiny-random")
    base_model = AutoModelForCausalLM.from_pretrained(base_path).eval()
    batches = [
        random_groups(
            base_model, seed=seed, lengths=[[40, 3, 9, 2], [12, 30]], prompt_lengths=[20, 5]
        )
        for seed in (1, 2)
    ]
    config = FAST.model_copy(update={"max_tokens_per_batch": 32})
    one = Trainer(base_path, tmp_path / "one", device="cpu")
    expected = [one.train_step(groups, config) for groups in batches]

    world = TrainingWorld(ranks=2, devices=("cpu", "cpu"), threads_per_rank=1, launcher="ray")
    trainer = DistributedTrainer(base_path, tmp_path / "model", world)
    try:
        first = trainer.train_step(batches[0], config)
        assert_same_tensors(adapter(expected[0]), adapter(first))
        assert_same_metrics(expected[0], first)
        assert first.metrics["train/world_size"] == 2
        victim = trainer.ranks[1]["pid"]

        def kill_rank_1(event: dict) -> None:
            if event["event"] == "micro_batch" and event["rank"] == 1:
                os.kill(victim, signal.SIGKILL)

        with pytest.raises(TrainingWorldError, match=r"rank 1 \(Ray actor.*died") as failure:
            trainer.train_step(batches[1], config, on_progress=kill_rank_1)
        assert "checkpoint 1 stays in force" in str(failure.value)
        folder = ModelFolder(tmp_path / "model")
        assert sorted(p.name for p in folder.checkpoints.iterdir()) == ["0001"]

        # Ray restarted the actors; the next step forms a new world on them and trains.
        second = trainer.train_step(batches[1], config)
        assert second.step == 2 and victim not in [r["pid"] for r in trainer.ranks]
        assert_same_tensors(adapter(expected[1]), adapter(second))
    finally:
        trainer.unload()
