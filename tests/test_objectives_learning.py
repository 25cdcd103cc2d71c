"""Learning tests of the objectives on the digits task (``test_training_learning``'s task:
tiny-random must learn to answer in digits; reward = share of digit characters).

Three runs from the same start (tiny-random, the same sampling seeds), each through the public
loop (``LocalBackend``, ``capture``, ``model.train``), two optimizer updates per step so the
second half of each batch is trained off-policy and the clip ranges matter:

1. token-level GRPO (PPO clip 0.2 / 0.28): the baseline, and the teacher for 3;
2. GSPO (``importance_sampling_level="sequence"``, clip 3e-4 / 4e-4 as in the paper and
   TRL's docs): must reach the goal about as fast as 1, on average over three seed sets;
3. on-policy distillation alone (``TrainConfig.teacher``, ``rl=False``, top-20 reverse KL)
   from run 1's last checkpoint (which answers in digits): a fresh student must reach the
   goal in fewer steps, so fewer rollouts (32 a step), than GRPO needed.

Measured here (2 cores): token-level 9 steps, GSPO 7, distillation 4 (the sampled-token
estimate, ``top_k=0``, needed 12 with ``weight=0.3`` and collapsed at ``weight=1``: the
variance the top-k form avoids). The machine's thread count follows its load, so the
curves vary slightly between runs; the margins allow for it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from test_training_learning import CONFIG, gather, mean_reward

import art_core as art
from art_core.training import TrainConfig
from art_core.training.config import TeacherConfig

GOAL = 0.8
MAX_STEPS = 25
# The task's config (lm_head in the LoRA, lr 3e-2, fp32), two updates per step.
TOKEN = CONFIG.model_copy(update={"optimizer_steps_per_epoch": 2, "epsilon_high": 0.28})
GSPO = TOKEN.model_copy(
    update={"importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4}
)

# The sampling seeds of a run: set k samples step s with the seeds of step 50 * k + s (the
# runs stop by MAX_STEPS, so the sets never share a seed).
SEED_SET_STRIDE = 50
# How many seed sets the GSPO comparison averages over. One set is one draw: its curve moves
# by several steps with the batching of concurrent rollouts and the machine's float sums
# (seen on one 2-core EPYC, set 0: token-level 6 steps, GSPO 9 or 10; sets 0-3: token-level
# 6/12/8/13, GSPO 10/9/5/11).
GSPO_SEED_SETS = 3

pytestmark = pytest.mark.slow


async def steps_to_goal(
    path: Path, name: str, config: TrainConfig, seed_set: int = 0
) -> tuple[int, list[float], Any]:
    """Train until the mean reward of a step's rollouts reaches GOAL: (steps, curve, last
    checkpoint path); sampled with the seeds of ``seed_set``."""
    first = SEED_SET_STRIDE * seed_set
    async with art.LocalBackend(path=path) as backend:
        model = art.TrainableModel(name=name, project="objectives", base_model="tiny-random")
        await model.register(backend)
        groups = await gather(model, first)
        rewards = [mean_reward(groups)]
        checkpoint = None
        for step in range(1, MAX_STEPS + 1):
            result = await model.train(groups, config=config)
            checkpoint = result.checkpoint_path
            groups = await gather(model, first + step)
            rewards.append(mean_reward(groups))
            if rewards[-1] >= GOAL:
                break
    return len(rewards) - 1, rewards, checkpoint


def curve(rewards: list[float]) -> str:
    return " ".join(f"{r:.2f}" for r in rewards)


@pytest.fixture(scope="module")
async def baseline(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, list[float], Any]:
    started = time.perf_counter()
    steps, rewards, checkpoint = await steps_to_goal(
        tmp_path_factory.mktemp("token"), "token", TOKEN
    )
    print(
        f"\ntoken-level GRPO: {curve(rewards)} ({steps} steps, {time.perf_counter() - started:.0f} s)"
    )
    assert rewards[0] <= 0.2 and rewards[-1] >= GOAL, curve(rewards)
    return steps, rewards, checkpoint


async def test_gspo_learns_as_fast_as_token_level(
    tmp_path: Path, baseline: tuple[int, list[float], Any]
) -> None:
    """On average over GSPO_SEED_SETS seed sets, GSPO needs at most 3 steps more than
    token-level GRPO (set 0 of token-level is the module's baseline run)."""
    token_steps, gspo_steps = [baseline[0]], []
    for seed_set in range(GSPO_SEED_SETS):
        if seed_set > 0:
            steps, rewards, _ = await steps_to_goal(
                tmp_path / f"token-{seed_set}", "token", TOKEN, seed_set
            )
            assert rewards[-1] >= GOAL, f"token-level, set {seed_set}: {curve(rewards)}"
            token_steps.append(steps)
        started = time.perf_counter()
        steps, rewards, _ = await steps_to_goal(
            tmp_path / f"gspo-{seed_set}", "gspo", GSPO, seed_set
        )
        print(
            f"\nGSPO, set {seed_set}: {curve(rewards)} ({steps} steps, {time.perf_counter() - started:.0f} s)"
        )
        assert rewards[-1] >= GOAL, f"GSPO by step, set {seed_set}: {curve(rewards)}"
        gspo_steps.append(steps)
    mean_gspo, mean_token = sum(gspo_steps) / len(gspo_steps), sum(token_steps) / len(token_steps)
    assert mean_gspo <= mean_token + 3, f"GSPO steps {gspo_steps}, token-level {token_steps}"


async def test_distillation_from_a_solving_teacher_beats_grpo_alone(
    tmp_path: Path, baseline: tuple[int, list[float], Any]
) -> None:
    teacher = TeacherConfig(model="tiny-random", adapter=str(baseline[2]), rl=False)
    config = TOKEN.model_copy(update={"teacher": teacher})
    started = time.perf_counter()
    steps, rewards, _ = await steps_to_goal(tmp_path, "student", config)
    print(
        f"\ndistillation: {curve(rewards)} ({steps} steps, {time.perf_counter() - started:.0f} s)"
    )
    assert rewards[-1] >= GOAL, f"distillation by step: {curve(rewards)}"
    assert steps < baseline[0], f"distillation {steps} steps, GRPO alone {baseline[0]}"
