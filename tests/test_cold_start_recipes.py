"""The learning suite's cold-start recipes on a tiny task: each changes what it claims to.

The task is ``test_training_learning``'s prompts with a pass/fail reward, as the suite's
tasks have: 1 if the answer starts with a digit. An untrained tiny-random model samples its
first token near-uniformly from 695 tokens, 43 of which start with a digit: ~6% of runs pass,
so about 40% of groups of 8 hold a passing run. (The digit-fraction reward of the GRPO test
suits rejection sampling badly: none of 256 cold runs scored above 0.34.) The recipes are
the ones ``benchmarks/learning_suite.py`` runs before GRPO, through the public API only:

- ``self``: best-of-n of the model's own runs (``art.best_trajectories``) -> ``train_sft``.
  The claim is that the *selection* carries the signal: SFT on the best run of each group
  raises the reward, SFT on the worst run of the same groups does not.
- ``teacher``: the best runs of another model that solves the task, recorded by the
  gateway under the teacher's name, rendered in the student's template -> the student's
  ``train_sft``. The claim is that the student learns the teacher's behaviour without
  ever solving a task itself.

(``grpo`` from cold is ``test_training_learning``; the off-policy mask is
``test_off_policy_mask``.)
"""

from __future__ import annotations

from pathlib import Path

import test_training_learning as learning
from test_sft_backend import digits_traces
from test_training_learning import CONFIG, mean_reward

import art_core as art

# The digits task's LoRA shape (lm_head included, see test_training_learning) in fp32.
SFT = art.SFTConfig(
    learning_rate=1e-2,
    epochs=5,
    batch_size=2,
    lora_target_modules=CONFIG.lora_target_modules,
    precision="fp32",
)
# Sampling seeds: ``gather(model, s)`` samples with the seeds of "step" s; each phase of a
# test uses its own so no two phases see the same samples.
BEFORE, COLLECT, AFTER = 0, range(1, 5), 100


def starts_with_a_digit(text: str) -> float:
    """The reward: 1.0 if the answer's first non-space character is a digit."""
    stripped = text.lstrip()
    return 1.0 if stripped[:1].isdigit() else 0.0


async def gather(model: art.TrainableModel, step: int) -> list[art.TrajectoryGroup]:
    """The digits task's groups (8 runs per prompt, the seeds of ``step``), pass/fail."""
    return await learning.gather(model, step, reward=starts_with_a_digit)


async def own_runs(model: art.TrainableModel) -> list[art.TrajectoryGroup]:
    """16 groups of 8 of the model's own runs (4 prompts x 4 seed sets)."""
    groups: list[art.TrajectoryGroup] = []
    for step in COLLECT:
        groups += await gather(model, step)
    return groups


def finished(groups: list[art.TrajectoryGroup]) -> list[art.TrajectoryGroup]:
    return [
        art.TrajectoryGroup(
            [t for t in g.trajectories if any(c.finish_reason != "length" for c in t.calls)]
        )
        for g in groups
    ]


def worst_trajectories(groups: list[art.TrajectoryGroup]) -> list[art.Trajectory]:
    return [min(g.trajectories, key=lambda t: t.reward) for g in groups]


async def test_best_of_n_of_its_own_runs_raises_the_reward_and_worst_of_n_does_not(
    tmp_path: Path,
) -> None:
    async with art.LocalBackend(path=tmp_path / "art") as backend:
        best = art.TrainableModel(name="best", project="recipes", base_model="tiny-random")
        worst = art.TrainableModel(name="worst", project="recipes", base_model="tiny-random")
        await best.register(backend)
        await worst.register(backend)
        before = mean_reward(await gather(best, BEFORE))
        assert before <= 0.2, f"the task must start hard: mean reward {before:.3f}"

        best_groups, worst_groups = await own_runs(best), await own_runs(worst)
        # As the suite keeps them: the best run of each group, only if it passed.
        chosen = art.best_trajectories(best_groups, min_reward=1.0)
        rejected = worst_trajectories(worst_groups)
        assert len(chosen) >= 4, f"{len(chosen)} of 16 groups held a passing run"
        assert {t.reward for t in rejected} == {0.0}

        best_result = await best.train_sft(chosen, config=SFT)
        worst_result = await worst.train_sft(rejected, config=SFT)
        # The model's own runs train on the ids it sampled, as GRPO would.
        assert best_result.metrics["sft/records_token_exact"] == len(chosen)
        assert worst_result.metrics["sft/records_token_exact"] == len(rejected)

        after_best = mean_reward(await gather(best, AFTER))
        after_worst = mean_reward(await gather(worst, AFTER))
    print(
        f"\nself recipe: {before:.2f} -> SFT on {len(chosen)} best-of-8 runs {after_best:.2f}, "
        f"on 16 worst-of-8 runs {after_worst:.2f}"
    )
    # 32 runs measure a pass rate: the cold model's ~6% reads as 0-3 passes of them.
    assert after_best >= before + 0.3, f"best-of-n: {before:.3f} -> {after_best:.3f}"
    assert after_worst <= 0.2, f"worst-of-n: {before:.3f} -> {after_worst:.3f}"
    assert after_best >= after_worst + 0.25, (after_best, after_worst)


async def test_a_teachers_best_runs_teach_a_student_that_never_solved_a_task(
    tmp_path: Path,
) -> None:
    async with art.LocalBackend(path=tmp_path / "art") as backend:
        teacher = art.TrainableModel(name="teacher", project="recipes", base_model="tiny-random")
        student = art.TrainableModel(name="student", project="recipes", base_model="tiny-random")
        await teacher.register(backend)
        await student.register(backend)
        # A teacher that solves the task (SFT on digit answers, test_sft_backend's data).
        await teacher.train_sft(digits_traces(50), config=SFT)
        teacher_groups = await own_runs(teacher)
        assert mean_reward(teacher_groups) >= 0.8

        before = mean_reward(await gather(student, BEFORE))
        assert before <= 0.2, f"the task must start hard: mean reward {before:.3f}"
        # As the suite keeps them: the best finished run of each group, only if it solved
        # the task (an answer cut by max_tokens demonstrates no finished turn).
        traces = art.best_trajectories(finished(teacher_groups), min_reward=1.0)
        assert len(traces) >= 8
        assert all(t.reward == 1.0 for t in traces)

        result = await student.train_sft(traces, config=SFT)
        # Recorded under the teacher's name: rendered in the student's template, not reused.
        assert result.metrics["sft/records_rendered"] == len(traces)
        assert result.metrics.get("sft/records_token_exact", 0) == 0
        after = mean_reward(await gather(student, AFTER))
    print(f"\nteacher recipe: student {before:.2f} -> {after:.2f} on {len(traces)} traces")
    assert after >= before + 0.4, (
        f"student after SFT on the teacher's runs: {before:.3f} -> {after:.3f}"
    )
