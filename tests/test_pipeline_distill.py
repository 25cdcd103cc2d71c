"""PipelineTrainer with on-policy distillation (``TrainConfig.teacher``): every pipelined step
is scored by the teacher, and groups whose rewards are all equal are trained on (by the
distillation term) instead of being dropped for lack of a signal."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from pipeline_support import CONFIG, rollout, scenarios
from transformers import AutoModelForCausalLM

import art_core as art
from art_core.embedded import resolve_base_model
from art_core.model_folder import ModelFolder
from art_core.training.config import TeacherConfig

GROUP_SIZE = 4
GROUPS_PER_STEP = 2
STEPS = 3


def random_adapter(path: Path) -> Path:
    """A small LoRA adapter of tiny-random with random weights (B != 0): a teacher that
    differs from the student's base."""
    torch.manual_seed(5)
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    base = AutoModelForCausalLM.from_pretrained(
        resolve_base_model("tiny-random"), dtype=torch.float32
    )
    get_peft_model(base, config).save_pretrained(str(path))
    return path


async def half_flat(model: art.TrainableModel, scenario: dict[str, object]) -> art.Trajectory:
    """The digits rollout; on even scenarios every run gets reward 0 (an all-equal group)."""
    trajectory = await rollout(model, scenario)
    if int(str(scenario["index"])) % 2 == 0:
        trajectory.reward = 0.0
    return trajectory


async def test_pipelined_steps_are_distilled_and_keep_all_equal_groups(tmp_path: Path) -> None:
    teacher = TeacherConfig(
        model="tiny-random", adapter=str(random_adapter(tmp_path / "teacher")), top_k=5
    )
    async with art.LocalBackend(path=tmp_path / "art") as backend:
        model = art.TrainableModel(name="distill", project="pipeline", base_model="tiny-random")
        await model.register(backend)
        trainer = art.PipelineTrainer(
            model,
            half_flat,
            scenarios(),
            group_size=GROUP_SIZE,
            groups_per_step=GROUPS_PER_STEP,
            max_steps_off_policy=1,
            max_steps=STEPS,
            train_config=CONFIG.model_copy(update={"teacher": teacher}),
            progress=False,
        )
        results = await trainer.train()
    assert len(results) == STEPS
    assert trainer.train_config.teacher == teacher
    assert trainer.state.dropped_no_signal == 0  # all-equal groups were kept for the teacher
    records = [
        r
        for r in ModelFolder.of(tmp_path / "art", "pipeline", "distill").read_history()
        if r.get("split") == "train"
    ]
    assert len(records) == STEPS
    skipped = 0.0
    for record in records:
        kl = record.get("train/distill/kl")
        assert kl is not None and math.isfinite(kl) and kl > 0, record
        assert record["train/distill/scored_tokens"] > 0, record
        assert record["train/pipeline_dropped_no_signal"] == 0, record
        # Every rollout trained, the all-equal groups' too (GRPO alone skips those).
        assert record["train/num_rollouts_trained"] == GROUP_SIZE * GROUPS_PER_STEP, record
        skipped += record["train/groups_skipped"]
    assert skipped > 0  # there were all-equal groups, and they were trained on
