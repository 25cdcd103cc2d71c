"""GSPO, DAPO, Dr. GRPO (and CISPO) against TRL's own ``GRPOTrainer`` loss code.

TRL's ``GRPOTrainer._compute_loss`` is called as it is, on a stand-in ``self`` that holds only
the attributes it reads; the model forward it asks for returns the test's logprobs. Our side
goes through the real path: rollouts -> ``to_examples`` (the loss weights of the
normalisation) -> ``pack_row`` (the micro-batch) -> ``grpo_loss``. Loss and gradient with
respect to the same logprob tensor must agree.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from art_core.training.batch import Rollout, to_examples
from art_core.training.loss import grpo_loss
from art_core.training.packing import pack_row
from art_core.training.sequences import TokenSequence

trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")  # the bench extra; CI installs it

LENGTHS = [5, 9, 2, 7, 12, 4]
MAX_LENGTH = 16  # TRL's max_completion_length (Dr. GRPO's constant)


def _batch(seed: int, spread: float) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    rows, width = len(LENGTHS), max(LENGTHS)
    mask = torch.zeros(rows, width)
    for row, length in enumerate(LENGTHS):
        mask[row, :length] = 1
    old = -torch.rand(rows, width, generator=generator) * 3 - 0.05
    new = old + torch.randn(rows, width, generator=generator) * spread
    advantages = torch.randn(rows, generator=generator)
    return {"mask": mask, "old": old, "new": new, "advantages": advantages}


def _trl_loss(data: dict[str, torch.Tensor], new: torch.Tensor, **settings: Any) -> torch.Tensor:
    rows, width = data["mask"].shape
    args = SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=1)
    stand_in = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (new, torch.zeros_like(new), None),
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        beta=0.0,
        args=args,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        max_completion_length=MAX_LENGTH,
        accelerator=SimpleNamespace(
            num_processes=1,
            reduce=lambda tensor, reduction="sum": tensor,
            gather=lambda tensor: tensor,
            gather_for_metrics=lambda tensor: tensor,
        ),
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        _metrics=defaultdict(lambda: defaultdict(list)),
        **settings,
    )
    inputs = {
        "prompt_ids": torch.ones(rows, 1, dtype=torch.long),
        "prompt_mask": torch.ones(rows, 1, dtype=torch.long),
        "completion_ids": torch.ones(rows, width, dtype=torch.long),
        "completion_mask": data["mask"].long(),
        "advantages": data["advantages"],
        "old_per_token_logps": data["old"],
        "num_items_in_batch": data["mask"].sum(),
    }
    return trl_grpo.GRPOTrainer._compute_loss(stand_in, None, inputs)


def _our_loss(data: dict[str, torch.Tensor], new: torch.Tensor, **settings: Any) -> torch.Tensor:
    normalization = settings.pop("normalization")
    mask = data["mask"].bool()
    rollouts = []
    for row, length in enumerate(LENGTHS):
        sampled = data["old"][row, :length].tolist()
        sequence = TokenSequence([1] * (length + 1), [False] + [True] * length, [0.0, *sampled])
        rollouts.append(Rollout([sequence], float(data["advantages"][row])))
    examples = to_examples(rollouts, normalization=normalization, dr_grpo_length=MAX_LENGTH)
    batch = pack_row(examples, share_prefixes=False)
    # Trained tokens in example order = row-major order of the mask.
    return grpo_loss(
        new[mask],
        batch.sampler_logprobs,
        batch.advantages,
        batch.weights,
        sequence_index=batch.sequence_index,
        metric_weights=batch.metric_weights,
        **settings,
    ).loss


CASES = {
    "gspo": (
        {
            "loss_type": "grpo",
            "importance_sampling_level": "sequence",
            "epsilon_low": 3e-4,
            "epsilon_high": 4e-4,
        },
        {
            "normalization": "grpo",
            "importance_sampling_level": "sequence",
            "epsilon": 3e-4,
            "epsilon_high": 4e-4,
        },
    ),
    "grpo_token": (
        {
            "loss_type": "grpo",
            "importance_sampling_level": "token",
            "epsilon_low": 0.2,
            "epsilon_high": 0.28,
        },
        {"normalization": "grpo", "epsilon": 0.2, "epsilon_high": 0.28},
    ),
    "dapo": (
        {
            "loss_type": "dapo",
            "importance_sampling_level": "token",
            "epsilon_low": 0.2,
            "epsilon_high": 0.28,
        },
        {"normalization": "dapo", "epsilon": 0.2, "epsilon_high": 0.28},
    ),
    "dr_grpo": (
        {
            "loss_type": "dr_grpo",
            "importance_sampling_level": "token",
            "epsilon_low": 0.2,
            "epsilon_high": 0.2,
        },
        {"normalization": "dr_grpo", "epsilon": 0.2},
    ),
    # TRL's CISPO caps the ratio at epsilon_high (no lower bound) and sums over tokens like
    # DAPO; ours clips to [1 - epsilon, 1 + epsilon_high]: epsilon = 1 leaves no lower bound.
    "cispo": (
        {
            "loss_type": "cispo",
            "importance_sampling_level": "token",
            "epsilon_low": 0.2,
            "epsilon_high": 1.1,
        },
        {"normalization": "dapo", "loss_type": "cispo", "epsilon": 1.0, "epsilon_high": 0.1},
    ),
    "gspo_dapo": (
        {
            "loss_type": "dapo",
            "importance_sampling_level": "sequence",
            "epsilon_low": 3e-4,
            "epsilon_high": 4e-4,
        },
        {
            "normalization": "dapo",
            "importance_sampling_level": "sequence",
            "epsilon": 3e-4,
            "epsilon_high": 4e-4,
        },
    ),
}


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("spread", [1e-4, 0.3])
@pytest.mark.parametrize("case", sorted(CASES))
def test_loss_and_gradient_equal_trl(case: str, spread: float) -> None:
    trl_settings, our_settings = CASES[case]
    data = _batch(seed=7, spread=spread)
    new_trl = data["new"].clone().requires_grad_(True)
    new_ours = data["new"].clone().requires_grad_(True)
    trl_loss = _trl_loss(data, new_trl, **trl_settings)
    our_loss = _our_loss(data, new_ours, **dict(our_settings))
    trl_loss.backward()
    our_loss.backward()
    assert torch.isfinite(trl_loss) and trl_loss.abs() > 1e-6
    torch.testing.assert_close(our_loss, trl_loss, rtol=1e-5, atol=1e-7)
    assert new_ours.grad is not None and new_trl.grad is not None
    assert new_ours.grad.abs().sum() > 0
    torch.testing.assert_close(new_ours.grad, new_trl.grad, rtol=1e-5, atol=1e-7)


def test_clipping_is_exercised() -> None:
    """With spread 0.3 the token ratios leave [0.8, 1.28] and GSPO's sequence ratios leave
    [1 - 3e-4, 1 + 4e-4]: the equality above covers clipped and unclipped terms."""
    data = _batch(seed=7, spread=0.3)
    mask = data["mask"].bool()
    token_ratio = torch.exp(data["new"] - data["old"])[mask]
    assert ((token_ratio < 0.8) | (token_ratio > 1.28)).any()
    assert ((token_ratio > 0.8) & (token_ratio < 1.28)).any()
    log_ratio = ((data["new"] - data["old"]) * data["mask"]).sum(-1) / data["mask"].sum(-1)
    assert ((log_ratio.exp() < 1 - 3e-4) | (log_ratio.exp() > 1 + 4e-4)).any()
