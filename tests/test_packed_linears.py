"""Pre-packed linears (``engines/packed.py``): sibling projections packed as one matrix give
each sibling what it computes alone, whatever the order of the calls and their inputs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM

from art_core.embedded import resolve_base_model
from art_core.engines.packed import MergedLinears, base_linear, pack_linears, packing_supported


def siblings(*sizes: int, bias: bool = False) -> list[nn.Linear]:
    torch.manual_seed(0)
    return [nn.Linear(16, size, bias=bias) for size in sizes]


@pytest.mark.parametrize("bias", [False, True])
def test_each_sibling_gets_its_own_output_in_any_order(bias: bool) -> None:
    q, k, v = siblings(6, 2, 2, bias=bias)
    group = MergedLinears([q, k, v], pack=False)
    x = torch.randn(3, 1, 16)
    with torch.no_grad():
        for order in ([0, 1, 2], [2, 0, 1], [1, 2, 0]):
            outputs = {i: group.output(i, x) for i in order}
            for i, linear in enumerate((q, k, v)):
                torch.testing.assert_close(outputs[i], linear(x), rtol=1e-6, atol=1e-6)
            assert group.held is None  # every output handed out: nothing kept


def test_a_sibling_called_on_another_input_computes_it_afresh() -> None:
    gate, up = siblings(5, 5)
    group = MergedLinears([gate, up], pack=False)
    x, y = torch.randn(2, 16), torch.randn(2, 16)
    with torch.no_grad():
        torch.testing.assert_close(group.output(0, x), gate(x))
        torch.testing.assert_close(group.output(1, y), up(y))  # not up(x), kept from the gate
        torch.testing.assert_close(group.output(1, x.clone()), up(x))  # equal values, other tensor
        torch.testing.assert_close(group.output(0, y), gate(y))  # y's gate was kept for it
        torch.testing.assert_close(group.output(0, x), gate(x))  # handed out once only
        torch.testing.assert_close(group.output(1, x), up(x))


@pytest.fixture(scope="module")
def base_path() -> Path:
    return resolve_base_model("tiny-random")


def test_a_packed_model_merges_its_projections_and_computes_what_the_plain_one_does(
    base_path: Path,
) -> None:
    if not packing_supported("cpu", torch.bfloat16):
        pytest.skip("this CPU or torch build has no oneDNN bf16 linears")
    plain = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.bfloat16).eval()
    packed = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.bfloat16).eval()
    linears = [m for m in packed.modules() if type(m) is nn.Linear]
    assert pack_linears(packed) == len(linears)
    layers = packed.model.layers
    attention, mlp = layers[0].self_attn, layers[0].mlp
    groups = {id(m._art_merged[0]) for m in linears if "_art_merged" in m.__dict__}
    assert len(groups) == 2 * len(layers)  # q/k/v and gate/up of every layer
    assert attention.q_proj._art_merged[0] is attention.v_proj._art_merged[0]
    assert mlp.gate_proj._art_merged[0] is mlp.up_proj._art_merged[0]
    assert "_art_merged" not in attention.o_proj.__dict__  # alone: its own packed weight
    ids = torch.randint(0, 600, (3, 10))
    with torch.inference_mode():
        # bf16 tolerances: one matrix of siblings may sum in another order than each alone
        torch.testing.assert_close(packed(ids).logits, plain(ids).logits)
        hidden = torch.randn(2, 1, attention.q_proj.in_features, dtype=torch.bfloat16)
        for name in ("v_proj", "q_proj", "k_proj"):  # any order, base_linear as adapters call it
            mine = base_linear(getattr(attention, name), hidden)
            theirs = getattr(plain.model.layers[0].self_attn, name)(hidden)
            torch.testing.assert_close(mine, theirs)
    assert all(packed_group.held is None for packed_group in _groups(packed))


def _groups(model: nn.Module) -> list[MergedLinears]:
    return [m._art_merged[0] for m in model.modules() if "_art_merged" in m.__dict__]
