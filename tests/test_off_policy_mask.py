"""The off-policy token mask (masked importance sampling, IcePop): ``grpo_loss`` on tensors
built by hand, its composition with TIS and GSPO, the band's validation, the default, and a
real ``Trainer`` step on tiny-random where some sampler logprobs are far from the trainer's.

The mask's ratio is ``r = exp(old_logprobs - sampler_logprobs)``; a token (a sequence, at the
sequence level) with ``r`` outside ``[low, high]`` gets no policy loss or gradient and stays in
the normalisation: masking it is the same as zeroing its loss weight, nothing else changes.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError
from transformers import AutoModelForCausalLM, AutoTokenizer

import art_core.training.trainer as trainer_module
from art_core.embedded import resolve_base_model
from art_core.training import TrainConfig, Trainer
from art_core.training.config import DEFAULT_OFF_POLICY_MASK
from art_core.training.loss import LossOutput, grpo_loss
from art_core.trajectories import LLMCall, Trajectory, TrajectoryGroup

BAND = (0.5, 5.0)
# Five tokens, trainer/sampler ratios r: agreeing, below the band, above it, and two inside
# near its edges. ``old`` is the trainer's logprob before the update (single step: the
# current one), so without TIS the PPO ratio is r too; the advantages' signs make PPO's
# min() pick the unclipped r * A wherever r != 1, so without the mask every token trains.
LOGP = [-1.0, -2.0, -0.5, -1.5, -3.0]
RATIOS = [1.0, 0.4, 6.0, 0.6, 4.5]
KEPT = [True, False, False, True, True]
ADV = [1.0, 1.0, -1.0, 1.0, -1.0]
WEIGHTS = [0.1, 0.2, 0.3, 0.15, 0.25]
CREDIT = [0.3, 0.1, 0.2, 0.25, 0.15]


def tensors(ratios: list[float] = RATIOS) -> dict[str, Any]:
    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    sampler = (
        torch.tensor(LOGP, dtype=torch.float64) - torch.tensor(ratios, dtype=torch.float64).log()
    )
    return {
        "logprobs": logp,
        "sampler_logprobs": sampler,
        "advantages": torch.tensor(ADV, dtype=torch.float64),
        "weights": torch.tensor(WEIGHTS, dtype=torch.float64),
        "metric_weights": torch.tensor(CREDIT, dtype=torch.float64),
    }


def loss_and_grad(**kwargs: Any) -> tuple[LossOutput, list[float]]:
    out = grpo_loss(**kwargs)
    out.loss.backward()
    return out, kwargs["logprobs"].grad.tolist()


def kept_weights(kept: list[bool]) -> torch.Tensor:
    return torch.tensor(
        [w if k else 0.0 for w, k in zip(WEIGHTS, kept, strict=True)], dtype=torch.float64
    )


@pytest.mark.parametrize("loss_type", ["ppo", "cispo"])
def test_the_mask_zeroes_exactly_the_tokens_outside_the_band(loss_type: str) -> None:
    masked = tensors()
    out, grad = loss_and_grad(
        **masked,
        loss_type=loss_type,
        old_logprobs=masked["logprobs"].detach(),
        off_policy_mask=BAND,
    )
    # The same loss with the masked tokens' weights set to 0 (the others' unchanged: the
    # normalisation still counts them) and no mask: identical loss and gradient.
    plain = tensors()
    plain["weights"] = kept_weights(KEPT)
    reference, want = loss_and_grad(**plain, loss_type=loss_type)
    assert out.loss.item() == pytest.approx(reference.loss.item(), rel=1e-12)
    assert grad == pytest.approx(want, rel=1e-12)
    assert [g == 0.0 for g in grad] == [not k for k in KEPT]
    assert all(g != 0.0 for g, k in zip(grad, KEPT, strict=True) if k)
    # The masked share, weighted by the per-rollout credit like clip_fraction.
    masked_share = sum(c for c, k in zip(CREDIT, KEPT, strict=True) if not k)
    assert out.metrics["off_policy/masked_share"] == pytest.approx(masked_share)  # 0.3
    # Without the mask every token trains, and no share is reported.
    whole, everyone = loss_and_grad(**tensors(), loss_type=loss_type)
    assert all(g != 0.0 for g in everyone)
    assert "off_policy/masked_share" not in whole.metrics


def test_kept_tokens_train_as_without_the_mask_by_hand() -> None:
    # PPO, eps 0.2, no TIS: the ratio is r (reference = sampler). Kept: r=1 (A=1), r=0.6
    # (A=1: min(0.6, 0.8) = 0.6) and r=4.5 (A=-1: min(-4.5, -1.2) = -4.5), all unclipped:
    # loss -r * A * w, gradient -r * A * w.
    t = tensors()
    out, grad = loss_and_grad(**t, old_logprobs=t["logprobs"].detach(), off_policy_mask=BAND)
    assert out.loss.item() == pytest.approx(-0.1 - 0.6 * 0.15 + 4.5 * 0.25)
    assert grad == pytest.approx([-0.1, 0.0, 0.0, -0.09, 1.125])
    assert out.metrics["clip_fraction"] == 0.0  # masked tokens are not counted as clipped


def test_grossly_mismatched_tokens_cannot_poison_the_gradient() -> None:
    # The trainer puts 149 nats less on token 1 than the sampler recorded, 200 more on token 2:
    # exp overflows, and without the mask the step's gradient is not finite (the whole update
    # would be skipped).
    logp = torch.tensor([-1.0, -150.0, -0.5, -1.5, -3.0], requires_grad=True)  # fp32
    sampler = torch.tensor([-1.0, -1.0, -200.5, -1.5, -3.0])
    common: dict[str, Any] = {"advantages": torch.tensor(ADV), "weights": torch.tensor(WEIGHTS)}
    grpo_loss(logp, sampler, **common).loss.backward()
    assert logp.grad is not None and not torch.isfinite(logp.grad).all()
    for tis in (None, 2.0):
        logp.grad = None
        out = grpo_loss(
            logp,
            sampler,
            **common,
            old_logprobs=logp.detach(),
            truncated_importance_sampling=tis,
            off_policy_mask=BAND,
        )
        out.loss.backward()
        assert math.isfinite(out.loss.item())
        assert logp.grad is not None and torch.isfinite(logp.grad).all()
        assert logp.grad.tolist()[1:3] == [0.0, 0.0]
        assert out.metrics["off_policy/masked_share"] == pytest.approx(WEIGHTS[1] + WEIGHTS[2])


def test_with_tis_the_kept_tokens_weights_are_truncated_and_the_masked_ones_zero() -> None:
    # With TIS the ratio's reference is old (= logp here): ratio 1, unclipped, and each token's
    # loss is -A * w_tis. Kept: r=1 -> 1, r=0.6 -> 0.6, r=4.5 -> min(4.5, C=2) = 2.
    t = tensors()
    out, grad = loss_and_grad(
        **t,
        old_logprobs=t["logprobs"].detach(),
        truncated_importance_sampling=2.0,
        off_policy_mask=BAND,
    )
    tis = [1.0, 0.0, 0.0, 0.6, 2.0]
    expected = [-a * w * c for a, w, c in zip(ADV, WEIGHTS, tis, strict=True)]
    assert out.loss.item() == pytest.approx(sum(expected))
    assert grad == pytest.approx(expected)
    # Without the mask, TIS alone keeps the tokens outside the band, truncated.
    u = tensors()
    _, unmasked = loss_and_grad(
        **u, old_logprobs=u["logprobs"].detach(), truncated_importance_sampling=2.0
    )
    assert unmasked == pytest.approx(
        [-a * w * c for a, w, c in zip(ADV, WEIGHTS, [1.0, 0.4, 2.0, 0.6, 2.0], strict=True)]
    )


def test_tis_with_a_cap_at_or_above_the_band_is_icepop() -> None:
    # IcePop weighs each token by M(r) = r inside [low, high], 0 outside: TIS with C >= high.
    t = tensors()
    _, grad = loss_and_grad(
        **t,
        old_logprobs=t["logprobs"].detach(),
        truncated_importance_sampling=BAND[1],
        off_policy_mask=BAND,
    )
    icepop = [r if BAND[0] <= r <= BAND[1] else 0.0 for r in RATIOS]
    assert grad == pytest.approx([-a * w * m for a, w, m in zip(ADV, WEIGHTS, icepop, strict=True)])


def test_at_the_sequence_level_the_geometric_mean_masks_whole_sequences() -> None:
    # Three sequences: [0, 1] with r = 1, 0.4 (geometric mean 0.63: kept, its 0.4 token too);
    # [2, 3] with r = 6, 0.6 (geometric mean 1.9: kept); [4] alone with r = 0.1: masked.
    ratios = [1.0, 0.4, 6.0, 0.6, 0.1]
    index = torch.tensor([0, 0, 1, 1, 2])
    kept = [True, True, True, True, False]
    t = tensors(ratios)
    out, grad = loss_and_grad(
        **t,
        old_logprobs=t["logprobs"].detach(),
        truncated_importance_sampling=2.0,
        off_policy_mask=BAND,
        importance_sampling_level="sequence",
        sequence_index=index,
        epsilon=3e-4,
        epsilon_high=4e-4,
    )
    plain = tensors(ratios)
    plain["weights"] = kept_weights(kept)
    _, want = loss_and_grad(
        **plain,
        old_logprobs=plain["logprobs"].detach(),
        truncated_importance_sampling=2.0,
        importance_sampling_level="sequence",
        sequence_index=index,
        epsilon=3e-4,
        epsilon_high=4e-4,
    )
    assert grad == pytest.approx(want, rel=1e-12)
    assert grad[4] == 0.0 and all(g != 0.0 for g in grad[:4])
    # GSPO: every token of a sequence shares its ratio exp(mean(logp - old)) (1 here), so each
    # token's gradient is -w_tis * sum over the sequence of A * w / its length; the TIS
    # weight is the sequence's geometric-mean ratio, capped: sqrt(0.4), min(sqrt(3.6), 2).
    first = -math.sqrt(0.4) * (ADV[0] * WEIGHTS[0] + ADV[1] * WEIGHTS[1]) / 2
    second = -min(math.sqrt(3.6), 2.0) * (ADV[2] * WEIGHTS[2] + ADV[3] * WEIGHTS[3]) / 2
    assert grad[:4] == pytest.approx([first, first, second, second])
    assert out.metrics["off_policy/masked_share"] == pytest.approx(CREDIT[4])


@pytest.mark.parametrize(
    "band",
    [(0.0, 5.0), (-1.0, 5.0), (1.0, 5.0), (1.5, 5.0), (0.5, 1.0), (0.5, 0.9), (0.5, math.inf)],
)
def test_a_band_that_does_not_hold_1_strictly_inside_is_refused(band: tuple[float, float]) -> None:
    with pytest.raises(ValidationError, match="off_policy_mask must be"):
        TrainConfig(off_policy_mask=band)
    t = tensors()
    with pytest.raises(ValueError, match="off_policy_mask must be"):
        grpo_loss(**t, old_logprobs=t["logprobs"].detach(), off_policy_mask=band)


def test_nan_bands_and_a_mask_without_old_logprobs_are_refused() -> None:
    with pytest.raises(ValidationError, match="off_policy_mask must be"):
        TrainConfig(off_policy_mask=(math.nan, 5.0))
    with pytest.raises(ValidationError, match="off_policy_mask"):
        TrainConfig(off_policy_mask=(0.5,))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="off_policy_mask needs the trainer's old_logprobs"):
        grpo_loss(**tensors(), off_policy_mask=BAND)


def test_the_default_is_icepops_band_and_changes_nothing_where_trainer_and_sampler_agree() -> None:
    config = TrainConfig()
    assert config.off_policy_mask == DEFAULT_OFF_POLICY_MASK == (0.5, 5.0)
    assert TrainConfig(off_policy_mask=None).off_policy_mask is None
    assert TrainConfig(off_policy_mask=[0.25, 4]).off_policy_mask == (0.25, 4.0)  # type: ignore[arg-type]
    assert TrainConfig.model_validate_json(config.model_dump_json()) == config
    # Ratios a few per cent off 1 (rounding): nothing masked, the loss is the unmasked one.
    near = [1.0, 0.97, 1.04, 0.99, 1.02]
    masked = tensors(near)
    out, grad = loss_and_grad(
        **masked, old_logprobs=masked["logprobs"].detach(), off_policy_mask=config.off_policy_mask
    )
    reference, want = loss_and_grad(**tensors(near))
    assert out.loss.item() == reference.loss.item() and grad == want
    assert out.metrics["off_policy/masked_share"] == 0.0


# ---------------------------------------------------------------------- a real train step

FAST = TrainConfig(learning_rate=2e-2, precision="fp32", seed=1)
# Sampler logprobs far from the trainer's (tiny-random gives these tokens about -7): a "yes"
# token (advantage +1) recorded as near-certain, r ~ e^-7 < 0.5; a "no" token (advantage -1)
# recorded as near-impossible, r ~ e^13 > 5. Without the mask PPO would still train both
# (min() picks the unclipped r * A for them). The values are distinctive, to find them again.
TOO_SURE = -0.123456
TOO_UNSURE = -19.87654


@pytest.fixture(scope="module")
def base_path() -> Path:
    return resolve_base_model("tiny-random")


@pytest.fixture(scope="module")
def base_model(base_path: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(base_path).eval()


@pytest.fixture(scope="module")
def group(base_path: Path, base_model: Any) -> TrajectoryGroup:
    tokenizer: Any = AutoTokenizer.from_pretrained(base_path)
    messages = [{"role": "user", "content": "Say yes or no."}]
    prompt = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"])
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    trajectories = []
    for word, reward in (("yes", 1.0), ("yes", 1.0), ("no", 0.0), ("no", 0.0)):
        completion = [*tokenizer(word, add_special_tokens=False)["input_ids"], end]
        ids = torch.tensor([prompt + completion])
        with torch.no_grad():
            logp = base_model(ids).logits[0, :-1].log_softmax(-1)
        # What a temperature-1 sampler on the same weights records: the trainer's logprobs.
        logprobs = logp.gather(-1, ids[0, 1:, None])[len(prompt) - 1 :, 0].tolist()
        trajectories.append((completion, logprobs, reward))
    trajectories[0][1][0] = TOO_SURE  # the first "yes": its first token
    trajectories[3][1][-1] = TOO_UNSURE  # the second "no": its end token
    return TrajectoryGroup(
        Trajectory(
            calls=[
                LLMCall(
                    model="tiny",
                    messages=[],
                    prompt_token_ids=prompt,
                    completion_token_ids=completion,
                    logprobs=logprobs,
                )
            ],
            reward=reward,
        )
        for completion, logprobs, reward in trajectories
    )


def spy_on_the_loss(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Each micro-batch's loss call, with the gradient of its loss per trained token."""
    calls: list[dict[str, Any]] = []

    def spy(logprobs: torch.Tensor, sampler: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        out = grpo_loss(logprobs, sampler, *args, **kwargs)
        (grad,) = torch.autograd.grad(out.loss, logprobs, retain_graph=True)
        old = kwargs["old_logprobs"]
        calls.append(
            {
                "sampler": sampler.tolist(),
                "grad": grad.tolist(),
                "logprobs": logprobs.detach().clone(),
                "old": None if old is None else old.clone(),
                "metrics": out.metrics,
            }
        )
        return out

    monkeypatch.setattr(trainer_module, "grpo_loss", spy)
    return calls


def perturbed(sampler: list[float]) -> list[bool]:
    return [any(math.isclose(s, v, rel_tol=1e-6) for v in (TOO_SURE, TOO_UNSURE)) for s in sampler]


def test_a_train_step_masks_exactly_the_tokens_whose_sampler_logprobs_are_off(
    tmp_path: Path, base_path: Path, group: TrajectoryGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokens = [len(t.calls[0].completion_token_ids) for t in group.trajectories]
    # Each rollout's credit is 1 / (its tokens * 4 rollouts); one masked token in two of them.
    share = 1 / (tokens[0] * 4) + 1 / (tokens[3] * 4)
    results = {}
    grads = {}
    for name, mask in (("default", DEFAULT_OFF_POLICY_MASK), ("off", None)):
        calls = spy_on_the_loss(monkeypatch)
        config = FAST.model_copy(update={"off_policy_mask": mask})
        results[name] = Trainer(base_path, tmp_path / name, device="cpu").train_step(
            [group], config
        )
        [call] = calls
        assert sum(perturbed(call["sampler"])) == 2
        grads[name] = (call["grad"], perturbed(call["sampler"]))
    grad, off = grads["default"]
    assert [g == 0.0 for g in grad] == off  # exactly the perturbed tokens get no gradient
    unmasked, _ = grads["off"]
    assert all(g != 0.0 for g in unmasked)  # which PPO alone would have trained
    # Every other token trains exactly as without the mask (same forward, same weights).
    assert [g for g, o in zip(grad, off, strict=True) if not o] == [
        g for g, o in zip(unmasked, off, strict=True) if not o
    ]
    assert results["default"].metrics["train/off_policy/masked_share"] == pytest.approx(share)
    assert "train/off_policy/masked_share" not in results["off"].metrics


def test_later_updates_and_epochs_mask_by_the_policy_before_the_step(
    tmp_path: Path, base_path: Path, group: TrajectoryGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two updates (the second chunk's old logprobs come from a pass before the first update)
    and two epochs (the first chunk's are kept from its first forward): the same two tokens
    are masked in all four updates, though the policy moves a lot (lr 2e-2)."""
    calls = spy_on_the_loss(monkeypatch)
    config = FAST.model_copy(update={"optimizer_steps_per_epoch": 2, "num_epochs": 2})
    result = Trainer(base_path, tmp_path / "m", device="cpu").train_step([group], config)
    assert len(calls) == 4  # epoch 0: update 0, 1; epoch 1: update 0, 1
    for call in calls:
        off = perturbed(call["sampler"])
        assert sum(off) == 1  # one per chunk
        mismatch = call["old"] - torch.tensor(call["sampler"])
        outside = (mismatch < math.log(BAND[0])) | (mismatch > math.log(BAND[1]))
        assert outside.tolist() == off
        assert all(g == 0.0 for g, o in zip(call["grad"], off, strict=True) if o)
    # Update 0's old logprobs are its first forward's, kept for epoch 1; update 1's were
    # computed before any update, so they differ from its first forward (the policy moved).
    assert torch.equal(calls[0]["old"], calls[0]["logprobs"])
    assert torch.equal(calls[2]["old"], calls[0]["old"])
    assert torch.equal(calls[3]["old"], calls[1]["old"])
    assert not torch.allclose(calls[1]["old"], calls[1]["logprobs"], atol=1e-4)
    # Chunks of 2 rollouts ("yes", "yes" | "no", "no"): credit 1 / (tokens * 2) per update, and
    # the step reports the mean over its 4 updates.
    tokens = [len(t.calls[0].completion_token_ids) for t in group.trajectories]
    share = 2 * (1 / (tokens[0] * 2) + 1 / (tokens[3] * 2)) / 4
    assert result.metrics["train/off_policy/masked_share"] == pytest.approx(share)
