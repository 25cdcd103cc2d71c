"""The paths past one GPU: two NCCL ranks train exactly like one process, and two engine
replicas on two GPUs serve behind one gateway and both take up a new adapter."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from cuda_support import needs_two_gpus
from distributed_support import FAST, adapter, assert_same_tensors, random_groups
from transformers import AutoModelForCausalLM

import art_core as art
from art_core.embedded import resolve_base_model
from art_core.engines.router import ReplicaRouter
from art_core.training import Trainer
from art_core.training.distributed import DistributedTrainer, TrainingWorld

pytestmark = [needs_two_gpus, pytest.mark.filterwarnings("ignore::ResourceWarning")]


@pytest.fixture(scope="module")
def base_path() -> Path:
    return resolve_base_model("tiny-random")


def test_two_nccl_ranks_train_exactly_like_one_gpu(tmp_path: Path, base_path: Path) -> None:
    base_model = AutoModelForCausalLM.from_pretrained(base_path).eval()
    groups = random_groups(
        base_model, seed=7, lengths=[[150, 2, 3, 90], [5, 60, 4, 7]], prompt_lengths=[60, 3]
    )
    one = Trainer(base_path, tmp_path / "one", device="cuda:0")
    world = TrainingWorld(ranks=2, devices=("cuda:0", "cuda:1"))
    assert world.collective_backend() == "nccl"
    two = DistributedTrainer(base_path, tmp_path / "two", world)
    try:
        expected = one.train_step(groups, FAST)
        actual = two.train_step(groups, FAST)
        assert actual.metrics["train/world_size"] == 2
        assert_same_tensors(adapter(expected), adapter(actual), rel=1e-4)
    finally:
        two.unload()


async def test_two_replicas_on_two_gpus_serve_and_take_up_a_new_adapter(tmp_path: Path) -> None:
    async with art.LocalBackend(
        path=tmp_path, engine="transformers", replicas=2, replica_devices=["cuda:0", "cuda:1"]
    ) as backend:
        model = art.TrainableModel(name="replicas", project="tests", base_model="tiny-random")
        await model.register(backend)
        router = backend.engine(model)
        assert isinstance(router, ReplicaRouter)

        async def rollout(i: int) -> art.Trajectory:
            async with art.capture(model) as run:
                await run.openai_client().chat.completions.create(
                    model=run.model_name,
                    messages=[{"role": "user", "content": f"question {i}"}],
                    max_tokens=8,
                )
            return run.trajectory(reward=float(i % 2))

        first = await asyncio.gather(*(rollout(i) for i in range(16)))
        assert {t.calls[0].replica for t in first} == {0, 1}
        result = await model.train([art.TrajectoryGroup(first[:8])], config=FAST)
        assert result.step == 1
        after = await asyncio.gather(*(rollout(i) for i in range(16)))
        assert {t.calls[0].replica for t in after} == {0, 1}
        assert {c.adapter_step for t in after for c in t.calls} == {1}
