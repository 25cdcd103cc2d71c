"""The GRPO loss, advantages and per-rollout credit against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from art_core.training.advantages import group_advantages, rollout_token_weight
from art_core.training.batch import prepare_batch, split_rollouts, to_examples
from art_core.training.config import TrainConfig, TrainResult
from art_core.training.loss import grpo_loss, k3_kl, token_logprobs
from art_core.trajectories import LLMCall, Trajectory, TrajectoryGroup

# Three trained tokens: the first unclipped, the second above 1 + eps with A > 0, the third
# below 1 - eps with A < 0 (both clipped under PPO).
LOGP = [-1.0, -0.5, -2.0]
SAMPLER = [-1.0, -1.0, -1.0]
ADV = [1.0, 1.0, -1.0]
WEIGHTS = [0.25, 0.25, 0.5]


def tensors() -> tuple[torch.Tensor, ...]:
    logp = torch.tensor(LOGP, requires_grad=True)
    return logp, torch.tensor(SAMPLER), torch.tensor(ADV), torch.tensor(WEIGHTS)


def test_ppo_loss_value_gradient_and_clip_fraction_match_hand_computation() -> None:
    logp, sampler, adv, weights = tensors()
    out = grpo_loss(logp, sampler, adv, weights, loss_type="ppo", epsilon=0.2)
    # ratios: 1, e^0.5 = 1.6487 (clipped to 1.2), e^-1 = 0.3679 (clipped to 0.8)
    # per token: -1 * 1 = -1;  -min(1.6487, 1.2) = -1.2;  -min(-0.3679, -0.8) = 0.8
    expected = 0.25 * -1.0 + 0.25 * -1.2 + 0.5 * 0.8
    assert out.loss.item() == pytest.approx(expected)  # -0.15
    assert out.metrics["clip_fraction"] == pytest.approx(0.75)
    out.loss.backward()
    # d/dlogp of -ratio*A*w = -ratio*A*w for the unclipped token; clipped tokens get none.
    assert logp.grad.tolist() == pytest.approx([-0.25, 0.0, 0.0])


def test_epsilon_high_widens_only_the_upper_clip() -> None:
    logp, sampler, adv, weights = tensors()
    out = grpo_loss(logp, sampler, adv, weights, epsilon=0.2, epsilon_high=1.0)
    ratio = math.exp(0.5)  # 1.6487 < 2.0: no longer clipped
    expected = 0.25 * -1.0 + 0.25 * -ratio + 0.5 * 0.8
    assert out.loss.item() == pytest.approx(expected)
    out.loss.backward()
    assert logp.grad.tolist() == pytest.approx([-0.25, -0.25 * ratio, 0.0])


def test_cispo_keeps_a_gradient_on_clipped_tokens() -> None:
    logp, sampler, adv, weights = tensors()
    out = grpo_loss(logp, sampler, adv, weights, loss_type="cispo", epsilon=0.2)
    # IS weights clipped to [0.8, 1.2] and detached: 1, 1.2, 0.8
    # per token -w*A*logp: -1*1*-1 = 1;  -1.2*1*-0.5 = 0.6;  -0.8*-1*-2 = -1.6
    assert out.loss.item() == pytest.approx(0.25 * 1.0 + 0.25 * 0.6 + 0.5 * -1.6)  # -0.4
    assert out.metrics["clip_fraction"] == pytest.approx(0.75)
    out.loss.backward()
    assert logp.grad.tolist() == pytest.approx([-0.25, -0.3, 0.4])


def test_truncated_importance_sampling_weights_tokens_by_capped_trainer_over_sampler() -> None:
    logp, sampler, adv, weights = tensors()
    out = grpo_loss(
        logp,
        sampler,
        adv,
        weights,
        old_logprobs=logp.detach(),  # single-step: the trainer's old policy is the current one
        truncated_importance_sampling=1.5,
    )
    # ratio vs old = 1 everywhere; TIS weights min(exp(old - sampler), 1.5): 1, 1.5, e^-1
    expected = 0.25 * -1.0 * 1.0 + 0.25 * -1.0 * 1.5 + 0.5 * 1.0 * math.exp(-1)
    assert out.loss.item() == pytest.approx(expected)
    out.loss.backward()
    assert logp.grad.tolist() == pytest.approx([-0.25, -0.375, 0.5 * math.exp(-1)])


def test_k3_kl_penalty_is_added_with_beta() -> None:
    logp, sampler, adv, weights = tensors()
    ref = torch.tensor([-2.0, -0.5, -2.0])
    base = grpo_loss(logp, sampler, adv, weights).loss.item()
    out = grpo_loss(logp, sampler, adv, weights, ref_logprobs=ref, beta=0.1)
    k3 = math.exp(-1.0) - (-1.0) - 1  # ref - logp = -1 for the first token, 0 elsewhere
    assert k3_kl(torch.tensor([-1.0]), torch.tensor([-2.0])).item() == pytest.approx(k3)
    assert out.metrics["kl"] == pytest.approx(0.25 * k3)
    assert out.loss.item() == pytest.approx(base + 0.1 * 0.25 * k3)


def test_token_logprobs_and_entropy() -> None:
    logits = torch.tensor([[0.0, math.log(3.0)], [0.0, 0.0]])
    logp, entropy = token_logprobs(logits, torch.tensor([1, 0]))
    assert logp.tolist() == pytest.approx([math.log(0.75), math.log(0.5)])
    expected_entropy = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert entropy.tolist() == pytest.approx([expected_entropy, math.log(2.0)])


def test_loss_rejects_mismatched_shapes_and_missing_inputs() -> None:
    logp, sampler, adv, weights = tensors()
    with pytest.raises(ValueError, match="advantages must have shape"):
        grpo_loss(logp, sampler, adv[:2], weights)
    with pytest.raises(ValueError, match="beta > 0 needs ref_logprobs"):
        grpo_loss(logp, sampler, adv, weights, beta=0.1)
    with pytest.raises(ValueError, match="old_logprobs"):
        grpo_loss(logp, sampler, adv, weights, truncated_importance_sampling=2.0)


def test_group_advantages_by_hand() -> None:
    # mean 0.5, population std sqrt(0.125) = 0.35355
    scaled = group_advantages([1.0, 0.0, 0.5, 0.5], scale_rewards=True)
    assert scaled == pytest.approx([0.5 / 0.353554, -0.5 / 0.353554, 0.0, 0.0], rel=1e-5)
    assert group_advantages([1.0, 0.0, 0.5, 0.5], scale_rewards=False) == [0.5, -0.5, 0.0, 0.0]
    assert group_advantages([0.7, 0.7, 0.7]) is None
    assert group_advantages([1.0]) is None
    with pytest.raises(ValueError, match="finite"):
        group_advantages([1.0, float("nan")])


def test_rollout_weight_makes_every_rollout_weigh_the_same() -> None:
    assert rollout_token_weight(4, 2) == 0.125
    with pytest.raises(ValueError):
        rollout_token_weight(0, 2)


def _call(prompt: list[int], completion: list[int], index: int = 0) -> LLMCall:
    return LLMCall(
        model="m",
        messages=[],
        index=index,
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        logprobs=[-1.0] * len(completion),
    )


def test_prepare_batch_skips_equal_groups_and_normalizes_per_rollout() -> None:
    # Rollout A: two calls merged into one sequence with 3 trained tokens; B: one call, 1 token.
    a = Trajectory(
        calls=[_call([1, 2], [3, 4]), _call([1, 2, 3, 4, 5], [6], index=1)],
        reward=1.0,
        metrics={"turns": 2},
    )
    b = Trajectory(calls=[_call([1, 2], [7])], reward=0.0, metrics={"turns": 1})
    flat = TrajectoryGroup([Trajectory(calls=[_call([1], [2])], reward=0.5)] * 3)
    batch = prepare_batch([TrajectoryGroup([a, b]), flat], scale_rewards=False)
    assert [r.advantage for r in batch.rollouts] == [0.5, -0.5]
    assert batch.metrics["train/groups_skipped"] == 1
    assert batch.metrics["train/reward"] == pytest.approx((1.0 + 0.0 + 0.5 * 3) / 5)
    assert batch.metrics["train/num_trainable_tokens"] == 4
    assert batch.metrics["train/turns"] == pytest.approx(1.5)  # mean over trajectories having it
    examples = to_examples(batch.rollouts)
    # Each rollout's weights sum to 1/2 whatever its length.
    assert examples[0].weight * 3 == pytest.approx(0.5)
    assert examples[1].weight * 1 == pytest.approx(0.5)
    assert [len(chunk) for chunk in split_rollouts(batch.rollouts, 2)] == [1, 1]


def test_prepare_batch_rejects_pending_groups_and_wrong_types() -> None:
    async def rollout() -> Trajectory:
        return Trajectory()

    coroutine = rollout()
    with pytest.raises(ValueError, match="have not run"):
        prepare_batch([TrajectoryGroup([coroutine])])
    coroutine.close()
    with pytest.raises(TypeError, match="not a TrajectoryGroup"):
        prepare_batch([[Trajectory()]])  # type: ignore[list-item]


def test_config_validation_and_result_json() -> None:
    assert TrainConfig().upper_epsilon == 0.2
    assert TrainConfig(epsilon_high=0.3).upper_epsilon == 0.3
    with pytest.raises(ValueError):
        TrainConfig(learning_rate=0)
    with pytest.raises(ValueError):
        TrainConfig(loss="reinforce")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        TrainConfig(lora_target_modules=())
    with pytest.raises(ValueError):
        TrainConfig(unknown_field=1)  # type: ignore[call-arg]
    config = TrainConfig(learning_rate=1e-3, lora_target_modules=("q_proj", "lm_head"))
    assert TrainConfig.model_validate_json(config.model_dump_json()) == config
    result = TrainResult(step=2, metrics={"train/loss": 0.5}, checkpoint_path="/x/0002")
    assert TrainResult.model_validate_json(result.model_dump_json()) == result


def test_token_logprobs_matches_log_softmax_in_value_and_gradient_across_chunks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import art_core.training.loss as loss_module

    torch.manual_seed(0)
    logits = torch.randn(7, 11, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 11, (7,))
    reference = torch.log_softmax(logits, -1)
    for elements in (1 << 25, 22):  # one chunk; chunks of 2 rows (the last one short)
        monkeypatch.setattr(loss_module, "_CHUNK_ELEMENTS", elements)
        selected, entropy = token_logprobs(logits, targets)
        torch.testing.assert_close(selected, reference.gather(-1, targets[:, None])[:, 0])
        torch.testing.assert_close(entropy, -(reference.exp() * reference).sum(-1))
        assert not entropy.requires_grad
        assert torch.autograd.gradcheck(lambda x: token_logprobs(x, targets)[0], (logits,))


def test_token_logprobs_handles_masked_logits_and_bf16() -> None:
    logits = torch.tensor([[0.0, -torch.inf, 0.0]])
    selected, entropy = token_logprobs(logits, torch.tensor([0]))
    assert selected.item() == pytest.approx(math.log(0.5))
    assert entropy.item() == pytest.approx(math.log(2))  # the impossible token adds 0, not NaN
    bf16 = torch.randn(3, 50).bfloat16().requires_grad_()
    selected, _ = token_logprobs(bf16, torch.tensor([1, 2, 3]))
    assert selected.dtype == torch.float32
    selected.sum().backward()
    assert bf16.grad is not None and bf16.grad.dtype == torch.bfloat16


def test_token_logprobs_gradient_is_the_same_with_kept_or_recomputed_softmax(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import art_core.training.loss as loss_module

    logits = torch.randn(9, 13, dtype=torch.float64)
    targets = torch.randint(0, 13, (9,))
    upstream = torch.randn(9, dtype=torch.float64)
    grads = []
    for keep in (0, 1 << 26):
        monkeypatch.setattr(loss_module, "_KEEP_ELEMENTS", keep)
        monkeypatch.setattr(loss_module, "_CHUNK_ELEMENTS", 4 * 13)
        leaf = logits.clone().requires_grad_()
        selected, _ = token_logprobs(leaf, targets)
        (selected * upstream).sum().backward()
        grads.append(leaf.grad)
    reference = logits.clone().requires_grad_()
    picked = torch.log_softmax(reference, -1).gather(-1, targets[:, None])[:, 0]
    (picked * upstream).sum().backward()
    torch.testing.assert_close(grads[0], reference.grad)
    torch.testing.assert_close(grads[1], reference.grad)
