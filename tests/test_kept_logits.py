"""``KeptLogits`` gives the kept positions' logits whatever the model does with a boolean
``logits_to_keep``: honours it, ignores it (every position back), or refuses it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from art_core.kept_logits import KeptLogits

FULL = torch.arange(2 * 3 * 5, dtype=torch.float32).reshape(2, 3, 5)
KEEP = torch.tensor([[True, False, True], [False, True, False]])


class Model:
    def __init__(self, behaviour: str) -> None:
        self.behaviour = behaviour
        self.calls: list[Any] = []

    def __call__(self, input_ids: torch.Tensor, logits_to_keep: Any = 0) -> SimpleNamespace:
        self.calls.append(logits_to_keep)
        masked = isinstance(logits_to_keep, torch.Tensor)
        if masked and self.behaviour == "refuses":
            raise IndexError("too many indices for tensor of dimension 1")
        if masked and self.behaviour == "honours":
            return SimpleNamespace(logits=FULL[logits_to_keep])
        return SimpleNamespace(logits=FULL)


@pytest.mark.parametrize("behaviour", ["honours", "ignores", "refuses"])
def test_the_kept_rows_come_back_whatever_the_model_does(behaviour: str) -> None:
    kept, model = KeptLogits("the model"), Model(behaviour)
    for _ in range(2):
        assert torch.equal(kept(model, {"input_ids": KEEP}, KEEP), FULL[KEEP])
    # A refusal is remembered: the mask is not tried again.
    assert kept.masked is (behaviour != "refuses")
    masked_calls = [isinstance(c, torch.Tensor) for c in model.calls]
    assert masked_calls == {"refuses": [True, False, False]}.get(behaviour, [True, True])
