"""Scores to compare with: a plain transformers forward's fp32 log-softmax."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from art_core.engines.base import PromptLogprob


def reference(
    model_path: Path, dtype: torch.dtype, ids: list[int], adapter: Path | None = None
) -> torch.Tensor:
    """``[len(ids) - 1, vocab]``: the fp32 log-softmax predicting token ``i + 1`` from
    ``ids[: i + 1]``, by a plain transformers forward (peft for an adapter)."""
    model: Any = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter))
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1)


def tolerance(dtype: torch.dtype) -> float:
    # fp32 on CPU agrees to rounding; bf16 (CPUs with native bf16, GPUs) to bf16's precision.
    return 1e-4 if dtype == torch.float32 else 5e-2


def assert_scores(
    scored: list[PromptLogprob | None], ref: torch.Tensor, ids: list[int], k: int, tol: float
) -> None:
    """Each position's logprob, rank and top-k agree with ``ref`` (ties within ``tol`` may
    order either way)."""
    assert len(scored) == len(ids) and scored[0] is None
    for position in range(1, len(ids)):
        entry = scored[position]
        assert entry is not None
        row = ref[position - 1]
        own = float(row[ids[position]])
        assert entry.logprob == pytest.approx(own, abs=tol), position
        surely_better = int((row > own + tol).sum())
        maybe_better = int((row >= own - tol).sum())
        assert surely_better + 1 <= entry.rank <= maybe_better, (position, entry.rank)
        assert len(entry.top) == k
        best = torch.topk(row, k).values.tolist()
        values = [logprob for _, logprob in entry.top]
        assert values == sorted(values, reverse=True)
        assert values == pytest.approx(best, abs=tol)
        for token, logprob in entry.top:  # each id is scored as the model scores it
            assert float(row[token]) == pytest.approx(logprob, abs=tol)
        if entry.rank <= k:  # the prompt token is one of the top k, at its rank
            assert entry.top[entry.rank - 1][1] == pytest.approx(entry.logprob, abs=tol)
