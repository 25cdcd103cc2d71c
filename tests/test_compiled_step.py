"""The compiled decode step (``engines/compiled_step.py``) computes what the model computes.

fp32, tiny-random's architecture with seeded weights of a larger scale (its own weights make
every row repeat its last token, with near-uniform logits), a left-padded batch of three
prompts of different lengths (padded to a bucket of four rows). ``model.generate`` (greedy,
its own DynamicCache and SDPA attention) gives the reference tokens and logits; the fixed-width
step, eager and compiled, is fed the same tokens (so one near-tie cannot send the rest of a
row elsewhere) and must give logits within ``ATOL`` of the reference at every step, and the
same greedy token wherever the reference's top two logits are more than ``MARGIN`` apart. A
small width bucket makes the cache widen twice on the way (two compilations, of 32 and 64
columns). The tests compile into the run's shared cache folder (``shared_cache_home``: a graph
one test or module compiled, the next loads from inductor's cache; a warm cache changes how
long a compile takes, not what it computes, and nothing carries over between runs); the
cache's own bound is tested in a folder of its own. No timing is asserted.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from sharp_support import sharp_tiny_random

from art_core.embedded import resolve_base_model
from art_core.engines.compiled_step import (
    CompiledDecodeStep,
    compile_cache_dir,
    compiled_variants,
    decode_attention,
    prune_cache,
    use_compile_cache,
)

PROMPTS = [[5, 17, 300, 42, 8, 99, 123], [7, 7, 250], [600, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]]
STEPS = 24
MIN_WIDTH = 32  # prompts of 11 columns + 24 tokens: widths 32, then 64
ATOL = 1e-4  # fp32 logits of std ~1.2: eager and compiled sum in other orders
MARGIN = 1e-3  # a top-two gap below this is a near-tie, where the argmax may flip


def reference(model: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``model.generate``'s greedy tokens ``[rows, STEPS]`` and logits ``[rows, STEPS, vocab]``."""
    longest = max(len(p) for p in PROMPTS)
    ids = torch.tensor([[0] * (longest - len(p)) + p for p in PROMPTS])
    attention = (ids != 0).long()
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=attention,
            max_new_tokens=STEPS,
            min_new_tokens=STEPS,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
    return out.sequences[:, longest:], torch.stack(out.logits, dim=1).float()


def teacher_forced(step: CompiledDecodeStep, tokens: torch.Tensor) -> torch.Tensor:
    """The step's logits ``[rows, STEPS, vocab]``, fed the reference tokens."""
    logits = [step.prefill(PROMPTS)]
    for i in range(STEPS - 1):
        logits.append(step.decode(tokens[:, i]))
    return torch.stack(logits, dim=1)


def check(logits: torch.Tensor, ref_tokens: torch.Tensor, ref_logits: torch.Tensor) -> None:
    assert logits.shape == ref_logits.shape
    torch.testing.assert_close(logits, ref_logits, atol=ATOL, rtol=0)
    top = ref_logits.topk(2, dim=-1).values
    clear = (top[..., 0] - top[..., 1]) > MARGIN
    assert clear.float().mean() > 0.9  # the comparison covers nearly every token
    assert torch.equal(logits.argmax(-1)[clear], ref_tokens[clear])


@pytest.fixture
def cache_folder(shared_cache_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ART_CORE_CACHE_DIR", str(shared_cache_home))
    # Building a compiled step points inductor here for the process: restored after the test.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "unused"))
    return shared_cache_home / "inductor"


@pytest.mark.slow
def test_compiled_and_eager_fixed_width_steps_decode_as_generate(cache_folder: Path) -> None:
    model = sharp_tiny_random()
    ref_tokens, ref_logits = reference(model)
    assert len({tuple(row) for row in ref_tokens.tolist()}) == len(PROMPTS)

    eager = CompiledDecodeStep(model, eager=True, min_width=MIN_WIDTH)
    eager_logits = teacher_forced(eager, ref_tokens)
    check(eager_logits, ref_tokens, ref_logits)
    assert eager.compile_seconds.keys() == {(4, 32), (4, 64)} and eager.cache_dir is None

    compiled = CompiledDecodeStep(model, min_width=MIN_WIDTH)
    compiled_logits = teacher_forced(compiled, ref_tokens)
    check(compiled_logits, ref_tokens, ref_logits)
    torch.testing.assert_close(compiled_logits, eager_logits, atol=ATOL, rtol=0)
    # Two buckets compiled, into the test's own folder.
    assert compiled.compile_seconds.keys() == {(4, 32), (4, 64)}
    # After its first call, each bucket ran dynamo's code without evaluating its guards.
    assert compiled.unguarded_buckets == {(4, 32), (4, 64)} and compiled.fallback is None
    assert compiled.cache_dir == compile_cache_dir() == cache_folder
    assert any(path.is_file() for path in cache_folder.rglob("*"))

    # Free-running greedy decoding: the compiled step's own tokens, as generate's.
    logits = compiled.prefill(PROMPTS)
    tokens = []
    for _ in range(STEPS):
        tokens.append(logits.argmax(-1))
        logits = compiled.decode(tokens[-1])
    top = ref_logits.topk(2, dim=-1).values
    if bool(((top[..., 0] - top[..., 1]) > MARGIN).all()):
        assert torch.equal(torch.stack(tokens, dim=1), ref_tokens)


@pytest.mark.slow
def test_a_packed_bf16_model_compiles_with_its_merged_projections(cache_folder: Path) -> None:
    """Pre-packed bf16 linears, siblings merged (``packed.MergedLinears``), as the engine
    serves them: the compiled step (the packed matrices as extern oneDNN calls) gives the
    eager step's logits, within bf16's tolerance."""
    from transformers import AutoModelForCausalLM

    from art_core.engines.packed import pack_linears, packing_supported

    if not packing_supported("cpu", torch.bfloat16):
        pytest.skip("this CPU or torch build has no oneDNN bf16 linears")
    model = AutoModelForCausalLM.from_pretrained(
        resolve_base_model("tiny-random"), dtype=torch.bfloat16
    ).eval()
    assert pack_linears(model) > 0
    steps = [CompiledDecodeStep(model, eager=True), CompiledDecodeStep(model)]
    firsts = [step.prefill(PROMPTS) for step in steps]
    torch.testing.assert_close(firsts[1], firsts[0], rtol=0, atol=0)  # both eager
    tokens = firsts[0].argmax(-1)
    for _ in range(6):
        eager, compiled = (step.decode(tokens) for step in steps)
        torch.testing.assert_close(compiled, eager, rtol=0.02, atol=0.02)
        tokens = eager.argmax(-1)
    assert steps[1].fallback is None and steps[1].unguarded_buckets == {(4, 128)}


@pytest.mark.slow
def test_a_dynamic_step_serves_every_bucket_with_one_graph(cache_folder: Path) -> None:
    """``dynamic=True``: batches of 2 rows and of 3 rows (not padded: a dynamic graph takes
    any number of rows) in 32 and 64 columns are one graph (rows and width symbolic), and its
    logits are the eager step's. Traced first with 2 rows, as many as tiny-random's key/value
    heads: without duck sizing turned off the two sizes would be tied, and 3 rows would need
    a graph of their own."""
    model = sharp_tiny_random()
    ref_tokens, _ = reference(model)
    eager = CompiledDecodeStep(model, eager=True, min_width=MIN_WIDTH)
    dynamic = CompiledDecodeStep(model, min_width=MIN_WIDTH, dynamic=True)
    before = compiled_variants()
    pair = [PROMPTS[0], PROMPTS[2]]
    logits = [step.prefill(pair) for step in (eager, dynamic)]
    for _ in range(3):
        logits = [step.decode(logits[0].argmax(-1)) for step in (eager, dynamic)]
        torch.testing.assert_close(logits[1], logits[0], atol=ATOL, rtol=0)
    torch.testing.assert_close(
        teacher_forced(dynamic, ref_tokens), teacher_forced(eager, ref_tokens), atol=ATOL, rtol=0
    )
    assert dynamic.compile_seconds.keys() == {(2, 32), (3, 32), (3, 64)}
    assert compiled_variants() == before + 1 and dynamic.fallback is None
    assert dynamic.unguarded_buckets == {(2, 32), (3, 32), (3, 64)}


def test_decode_attention_is_attention_over_repeated_heads() -> None:
    generator = torch.Generator().manual_seed(1)
    query = torch.randn(3, 6, 1, 16, generator=generator)
    keys, values = torch.randn(2, 3, 2, 40, 16, generator=generator)
    mask = torch.rand(3, 1, 1, 40, generator=generator) > 0.3
    mask[..., -1] = True
    out, _ = decode_attention(None, query, keys, values, mask, scaling=0.25)
    expected = torch.nn.functional.scaled_dot_product_attention(
        query,
        keys.repeat_interleave(3, dim=1),
        values.repeat_interleave(3, dim=1),
        attn_mask=mask,
        scale=0.25,
    )
    torch.testing.assert_close(out, expected.transpose(1, 2), atol=1e-5, rtol=0)


def test_the_compile_cache_is_bounded_oldest_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "inductor"
    (folder / "sub").mkdir(parents=True)
    for age, name in enumerate(["new", "sub/middle", "old"]):
        path = folder / name
        path.write_bytes(b"x" * 600 * 1024)
        stamp = 1_000_000 - age * 1000
        os.utime(path, (stamp, stamp))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "unused"))
    assert use_compile_cache(folder, max_mib=1.0) == folder  # 1.76 MiB -> at most 1 MiB
    assert sorted(p.name for p in folder.rglob("*") if p.is_file()) == ["new"]
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(folder.resolve())
    assert prune_cache(folder, 1.0) == 0


@pytest.mark.slow
def test_adapters_stay_inputs_and_a_step_past_the_recompile_limit_runs_eagerly(
    cache_folder: Path,
) -> None:
    """An adapter's factors are read at every call (updated in place: the same graph, the
    new values); a new adapter's forward needs a new trace, which past dynamo's recompile
    limit falls back to the eager step (same logits)."""
    import functools

    from art_core.engines.lora import lora_forward

    model = sharp_tiny_random()
    layer = model.model.layers[0].self_attn.q_proj
    generator = torch.Generator().manual_seed(2)

    def install() -> torch.Tensor:
        a_t = torch.randn(layer.in_features, 4, generator=generator)
        b_t = torch.randn(4, layer.out_features, generator=generator)
        layer.forward = functools.partial(lora_forward, layer, a_t, b_t)
        return b_t

    def logits(step: CompiledDecodeStep) -> torch.Tensor:
        first = step.prefill(PROMPTS)
        return step.decode(first.argmax(-1))

    eager = CompiledDecodeStep(model, eager=True)
    compiled = CompiledDecodeStep(model)
    b_t = install()
    before = logits(compiled)
    torch.testing.assert_close(before, logits(eager), atol=ATOL, rtol=0)
    b_t.mul_(3)  # the adapter trained a step, in place
    after = logits(compiled)
    assert (after - before).abs().max() > 0.1
    torch.testing.assert_close(after, logits(eager), atol=ATOL, rtol=0)
    assert compiled.fallback is None

    install()  # another adapter: another forward, which dynamo may not trace again
    compiled.max_compiles = 1
    swapped = logits(compiled)
    assert compiled.fallback is not None and "recompile" in compiled.fallback.lower()
    torch.testing.assert_close(swapped, logits(eager), atol=ATOL, rtol=0)


@pytest.mark.slow
def test_an_adapter_of_the_same_targets_and_ranks_is_served_by_the_same_graph(
    cache_folder: Path,
) -> None:
    """``use_adapter`` copies an adapter's factors into buffers the step keeps: the next
    adapter (the next checkpoint of a run) is served by the graph already compiled, without
    a trace or a guard, with its own logits; the base model and back again trace nothing
    new after their first time. Shapes that do not fit are refused before anything changes."""
    model = sharp_tiny_random()
    generator = torch.Generator().manual_seed(3)
    targets = ["model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj"]

    def adapter(rank: int = 4) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        deltas = {}
        for path in targets:
            linear = model.get_submodule(path)
            a_t = torch.randn(linear.in_features, rank, generator=generator) * 0.3
            b_t = torch.randn(rank, linear.out_features, generator=generator) * 0.3
            deltas[path] = (a_t, b_t)
        return deltas

    def logits(step: CompiledDecodeStep) -> torch.Tensor:
        first = step.prefill(PROMPTS)
        second = step.decode(first.argmax(-1))
        return torch.stack([first, second, step.decode(second.argmax(-1))])

    eager = CompiledDecodeStep(model, eager=True)
    compiled = CompiledDecodeStep(model)
    served = {}
    first, second = adapter(), adapter()
    for name, deltas in (("first", first), ("second", second), ("base", None)):
        eager.use_adapter(deltas)
        served[name] = logits(eager)
    assert (served["first"] - served["second"]).abs().max() > 0.1
    assert (served["first"] - served["base"]).abs().max() > 0.1

    compiled.use_adapter(first)
    torch.testing.assert_close(logits(compiled), served["first"], atol=ATOL, rtol=0)
    graphs = compiled_variants()
    assert graphs >= 1 and compiled.unguarded_buckets == {(4, 128)}
    compiled.use_adapter(second)  # the next checkpoint: same targets, same rank
    torch.testing.assert_close(logits(compiled), served["second"], atol=ATOL, rtol=0)
    assert compiled_variants() == graphs and compiled.unguarded_buckets == {(4, 128)}
    compiled.use_adapter(None)
    torch.testing.assert_close(logits(compiled), served["base"], atol=ATOL, rtol=0)
    graphs = compiled_variants()  # the base model's graph, traced once
    compiled.use_adapter(first)
    torch.testing.assert_close(logits(compiled), served["first"], atol=ATOL, rtol=0)
    compiled.use_adapter(None)
    torch.testing.assert_close(logits(compiled), served["base"], atol=ATOL, rtol=0)
    assert compiled_variants() == graphs and compiled.fallback is None

    wrong = adapter()
    path = targets[1]
    wrong[path] = (wrong[path][0], wrong[path][1][:, :-1])
    with pytest.raises(ValueError, match="down_proj"):
        compiled.use_adapter(wrong)
    with pytest.raises(ValueError, match="no module"):
        compiled.use_adapter({"model.nowhere": first[targets[0]]})
    torch.testing.assert_close(logits(compiled), served["base"], atol=ATOL, rtol=0)  # unchanged
