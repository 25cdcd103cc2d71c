"""The batched sampler: right distribution, per-row settings, seeds, masks, raw logprobs."""

from __future__ import annotations

import math

import torch

from art_core.engines.sampling import RowSampling, sample_next_tokens

PROBS = torch.tensor([0.5, 0.3, 0.2, 0.0])
LOGITS = PROBS.clamp_min(1e-30).log()


def frequencies(tokens: list[int], vocab: int) -> list[float]:
    return [tokens.count(t) / len(tokens) for t in range(vocab)]


def test_samples_follow_the_distribution_and_never_pick_impossible_tokens() -> None:
    torch.manual_seed(0)
    rows = 4000
    logits = LOGITS.masked_fill(PROBS == 0, -torch.inf).repeat(rows, 1)
    tokens, _ = sample_next_tokens(logits, [RowSampling() for _ in range(rows)])
    seen = frequencies(tokens.tolist(), 4)
    assert seen[3] == 0.0
    for got, want in zip(seen, PROBS.tolist(), strict=True):
        # 4000 draws: a standard deviation of at most 0.008; allow 4 of them.
        assert abs(got - want) < 0.032, (seen, PROBS)


def test_temperature_sharpens_and_flattens() -> None:
    torch.manual_seed(1)
    logits = torch.tensor([[2.0, 0.0]]).repeat(3000, 1)
    cold, _ = sample_next_tokens(logits, [RowSampling(temperature=0.25)] * 3000)
    hot, _ = sample_next_tokens(logits, [RowSampling(temperature=4.0)] * 3000)
    p_cold = 1 / (1 + math.exp(-8.0))
    p_hot = 1 / (1 + math.exp(-0.5))
    assert abs(frequencies(cold.tolist(), 2)[0] - p_cold) < 0.01
    assert abs(frequencies(hot.tolist(), 2)[0] - p_hot) < 0.04


def test_each_row_keeps_its_own_settings_in_a_mixed_batch() -> None:
    torch.manual_seed(2)
    logits = torch.tensor([[0.0, 1.0, 3.0, 2.0]]).repeat(5, 1)
    allowed = torch.tensor([True, True, False, False])
    rows = [
        RowSampling(temperature=0.0),  # greedy
        RowSampling(top_k=1),  # greedy too
        RowSampling(top_k=2),  # only tokens 2 or 3
        RowSampling(allowed=allowed),  # grammar: only 0 or 1
        RowSampling(top_p=0.5),  # the head holding half the mass: token 2 alone
    ]
    for _ in range(50):
        tokens, logprobs = sample_next_tokens(logits, rows)
        picked = tokens.tolist()
        assert picked[0] == 2 and picked[1] == 2
        assert picked[2] in (2, 3)
        assert picked[3] in (0, 1)
        assert picked[4] == 2
    # The recorded logprobs are the raw distribution's, whatever each row's settings.
    torch.testing.assert_close(logprobs, torch.log_softmax(logits, dim=-1))


def test_a_seeded_row_repeats_whatever_shares_its_batch() -> None:
    logits = torch.randn(6, 50)

    def seeded_draws(batch_size: int) -> list[int]:
        generator = torch.Generator().manual_seed(1234)
        rows = [RowSampling(generator=generator)] + [RowSampling()] * (batch_size - 1)
        out = []
        for _ in range(20):
            tokens, _ = sample_next_tokens(logits[:batch_size], rows)
            out.append(int(tokens[0]))
        return out

    assert seeded_draws(1) == seeded_draws(6)
    assert len(set(seeded_draws(1))) > 1  # it does sample, not argmax
