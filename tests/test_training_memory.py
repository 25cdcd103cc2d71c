"""Training memory chosen from the machine (issue 50): the budget setting, micro-batches sized
under it with the same loss and gradients, the fused output layer, the per-step peak metric,
and the clear error, before any forward and with nothing written, for a sequence that cannot
fit.

Budget-derived micro-batch sizes depend on the machine; the tests that need several small
micro-batches fix the per-token estimate instead (``fixed_costs``), so they plan the same
everywhere. Nothing here is timed.
"""

from __future__ import annotations

import math
import platform
import random
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

import art_core.training.trainer as trainer_module
from art_core import memory
from art_core.embedded import resolve_base_model
from art_core.memory import MemoryBudget, PeakMemory, parse_bytes, process_memory_budget
from art_core.training import SFTConfig, TrainConfig, Trainer
from art_core.training.loss import head_logprobs, token_logprobs
from art_core.training.memory import (
    ModelShape,
    SequenceSize,
    SequenceTooLargeError,
    TokenCosts,
    estimate_step_memory,
    plan_memory,
)
from art_core.training.output_head import fusable_output_head
from art_core.training.sequences import TokenSequence
from art_core.training.sft import SFTRecord
from art_core.trajectories import LLMCall, Trajectory, TrajectoryGroup

GiB = 2**30
# fp32, every token trained (constant sampler logprobs would be masked by the default band).
EXACT = TrainConfig(learning_rate=1e-3, precision="fp32", seed=3, off_policy_mask=None)


# ---------------------------------------------------------------------- the budget setting


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("6GiB", 6 * GiB),
        ("6 gib", 6 * GiB),
        ("6Gi", 6 * GiB),
        ("6GB", 6 * 10**9),
        ("6G", 6 * 10**9),
        ("1.5GiB", int(1.5 * GiB)),
        ("512MiB", 512 * 2**20),
        ("6442450944", 6 * GiB),
        ("1e9", 10**9),
        (4096, 4096),
    ],
)
def test_sizes_parse_in_bytes(text: str | int, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(
    "garbage", ["", "six", "6 GiBs", "-1GiB", "nan", "inf", "GiB", "6 XB", True]
)
def test_garbage_is_refused_with_the_forms_that_work(garbage: Any) -> None:
    with pytest.raises(ValueError, match="not a size in bytes"):
        parse_bytes(garbage)


def test_a_budget_is_bytes_a_size_a_share_or_off() -> None:
    assert MemoryBudget.parse("6GiB", source="x").bytes == 6 * GiB
    assert MemoryBudget.parse(6 * GiB, source="x").bytes == 6 * GiB
    assert MemoryBudget.parse("off", source="x").bytes is None
    assert MemoryBudget.parse("25%", source="x", machine=8 * GiB).bytes == 2 * GiB
    for bad, why in [
        ("lots", "is not a memory budget"),
        ("0%", "is not a memory budget"),
        ("150%", "is not a memory budget"),
        ("1MiB", "below the 64 MiB"),
    ]:
        with pytest.raises(ValueError, match=why) as caught:
            MemoryBudget.parse(bad, source="memory_budget")
        assert "memory_budget" in str(caught.value)


def test_the_config_field_validates_and_round_trips() -> None:
    config = TrainConfig(memory_budget="6GiB")
    assert TrainConfig.model_validate_json(config.model_dump_json()) == config
    assert TrainConfig(memory_budget=2**33).memory_budget == 2**33
    assert SFTConfig(memory_budget="off").memory_budget == "off"
    with pytest.raises(ValidationError, match="is not a memory budget"):
        TrainConfig(memory_budget="a lot")
    assert TrainConfig().memory_budget is None and TrainConfig().gradient_checkpointing is None


def test_the_environment_variable_sets_the_process_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(memory.ENV, "3GiB")
    budget = process_memory_budget()
    assert budget.bytes == 3 * GiB and memory.ENV in budget.source
    monkeypatch.setenv(memory.ENV, "three gigs")
    with pytest.raises(ValueError, match=f"{memory.ENV}: 'three gigs' is not a memory budget"):
        process_memory_budget()
    monkeypatch.setenv(memory.ENV, "off")
    assert process_memory_budget().bytes is None


def test_the_default_is_a_share_of_what_the_process_could_use_at_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(memory.ENV, raising=False)
    limited = memory._Startup(limit=8 * GiB, available=20 * GiB, resident=GiB)
    assert limited.default_budget().bytes == int(8 * GiB * memory.DEFAULT_FRACTION)
    assert "cgroup" in limited.default_budget().source
    # MemAvailable does not count what the process held already; the budget adds it back.
    free = memory._Startup(limit=None, available=10 * GiB, resident=GiB)
    assert free.default_budget().bytes == int(11 * GiB * memory.DEFAULT_FRACTION)
    assert "MemAvailable" in free.default_budget().source
    assert memory._Startup(None, None, GiB).default_budget().bytes is None
    # Read once: memory another process takes later does not shrink (or double-count) it.
    before = process_memory_budget()
    monkeypatch.setattr(memory, "mem_available", lambda: 1)
    monkeypatch.setattr(memory, "cgroup_memory_limit", lambda: 1)
    assert process_memory_budget() == before


def test_the_cgroup_limit_is_read_from_v1_and_v2_files(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert memory._read_int(tmp_path / "absent") is None
    (tmp_path / "max").write_text("max\n")
    (tmp_path / "v1").write_text("9223372036854771712\n")  # v1's "no limit"
    (tmp_path / "v2").write_text(f"{4 * GiB}\n")
    assert memory._read_int(tmp_path / "max") is None
    assert memory._read_int(tmp_path / "v1") is None
    assert memory._read_int(tmp_path / "v2") == 4 * GiB


def test_peak_memory_is_per_span_not_per_process() -> None:
    big = bytearray(256 * 2**20)
    big[::4096] = b"x" * len(big[::4096])  # touch every page
    del big
    meter = PeakMemory().start()
    assert meter.method != "none"
    small = bytearray(32 * 2**20)
    small[::4096] = b"y" * len(small[::4096])
    peak = meter.stop()
    del small
    assert peak >= 32 * 2**20
    if meter.method in ("VmHWM", "sampled"):  # reset at start: the 256 MiB before is not in it
        assert peak < memory._lifetime_peak() or peak < memory.resident_bytes() + 200 * 2**20


# ---------------------------------------------------------------------- planning


def costs(per_token: float, *, constant: int = 0) -> TokenCosts:
    return TokenCosts(
        per_token=per_token, per_trained_token=0.0, per_row_square=0.0, constant=constant
    )


def test_the_token_budget_is_what_fits_capped_by_max_tokens_per_batch() -> None:
    plans = {
        budget: plan_memory(
            [SequenceSize(100, 10, "s")],
            budget=MemoryBudget(budget, "x"),
            max_tokens_per_batch=4096,
            gradient_checkpointing=False,
            costs={False: costs(2**20), True: costs(2**18)},
            in_use=GiB,
            fixed=0,
        )
        for budget in (2 * GiB, 100 * GiB)
    }
    # (2 GiB * 0.95 - 1 GiB) / 1 MiB per token = 921 tokens; a large budget: the cap.
    assert plans[2 * GiB].max_tokens == 921
    assert plans[100 * GiB].max_tokens == 4096
    off = plan_memory(
        [SequenceSize(10**6, 1, "s")],
        budget=MemoryBudget(None, "off"),
        max_tokens_per_batch=512,
        gradient_checkpointing=None,
        costs={False: costs(2**20), True: costs(2**18)},
        in_use=0,
        fixed=0,
    )
    assert (off.max_tokens, off.checkpointing) == (512, False)  # no budget, no check


def test_checkpointing_turns_on_only_when_the_longest_sequence_needs_it() -> None:
    common: dict[str, Any] = {
        "budget": MemoryBudget(2 * GiB, "x"),
        "max_tokens_per_batch": 4096,
        "costs": {False: costs(2**20), True: costs(2**18)},
        "in_use": GiB,
        "fixed": 0,
    }
    short = plan_memory([SequenceSize(800, 100, "s")], gradient_checkpointing=None, **common)
    long = plan_memory([SequenceSize(2000, 100, "s")], gradient_checkpointing=None, **common)
    assert not short.checkpointing and long.checkpointing
    with pytest.raises(SequenceTooLargeError, match="turn on gradient checkpointing"):
        plan_memory([SequenceSize(2000, 100, "s")], gradient_checkpointing=False, **common)


def test_max_tokens_inverts_bytes_for_with_the_quadratic_term() -> None:
    c = TokenCosts(per_token=5000.0, per_trained_token=700.0, per_row_square=5.0, constant=10**6)
    n = c.max_tokens(10**9)
    assert c.bytes_for(tokens=n, trained=n, row_length=n) <= 10**9
    assert c.bytes_for(tokens=n + 1, trained=n + 1, row_length=n + 1) > 10**9


def test_the_estimate_reads_the_models_config(base_path: Path) -> None:
    from transformers import AutoConfig

    shape = ModelShape.of(AutoConfig.from_pretrained(base_path))
    assert (shape.hidden, shape.layers, shape.vocab) == (64, 2, 695)
    full, lean = (
        estimate_step_memory(
            shape,
            activation_bytes=4,
            checkpointing=on,
            lora_rank=8,
            lora_modules=7,
            fused_head=True,
        )
        for on in (False, True)
    )
    assert 0 < lean.per_token <= full.per_token  # 2 layers: little to save
    unfused = estimate_step_memory(
        shape,
        activation_bytes=4,
        checkpointing=False,
        lora_rank=8,
        lora_modules=7,
        fused_head=False,
    )
    assert unfused.per_trained_token > 10 * full.per_trained_token  # the vocabulary's logits


# ---------------------------------------------------------------------- the fused output layer


@pytest.mark.parametrize("elements", [1 << 23, 3 * 50])
@pytest.mark.parametrize("keep", [0, 1 << 26])
def test_the_fused_head_matches_the_plain_logprobs_in_value_and_gradient(
    monkeypatch: pytest.MonkeyPatch, elements: int, keep: int
) -> None:
    import art_core.training.loss as loss_module

    monkeypatch.setattr(loss_module, "_CHUNK_ELEMENTS", elements)  # chunks of 3 rows, or one
    monkeypatch.setattr(loss_module, "_KEEP_ELEMENTS", keep)  # softmax recomputed, or kept
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, 8, dtype=torch.float64, generator=generator)
    weight = torch.randn(50, 8, dtype=torch.float64, generator=generator)
    bias = torch.randn(50, dtype=torch.float64, generator=generator)
    targets = torch.randint(0, 50, (7,), generator=generator)
    for b in (None, bias):
        fused_leaf, plain_leaf = hidden.clone().requires_grad_(), hidden.clone().requires_grad_()
        fused, fused_entropy = head_logprobs(fused_leaf, weight, targets, b)
        plain, plain_entropy = token_logprobs(
            torch.nn.functional.linear(plain_leaf, weight, b), targets
        )
        torch.testing.assert_close(fused, plain)
        torch.testing.assert_close(fused_entropy, plain_entropy)
        upstream = torch.randn(7, dtype=torch.float64, generator=generator)
        (fused * upstream).sum().backward()
        (plain * upstream).sum().backward()
        torch.testing.assert_close(fused_leaf.grad, plain_leaf.grad)
        assert torch.autograd.gradcheck(
            lambda x, b=b: head_logprobs(x, weight, targets, b)[0],
            (hidden.clone().requires_grad_(),),
        )


def test_the_fused_head_under_bf16_autocast_matches_the_model_path() -> None:
    generator = torch.Generator().manual_seed(1)
    hidden = torch.randn(5, 16, generator=generator)
    weight = torch.randn(40, 16, generator=generator).bfloat16()
    targets = torch.randint(0, 40, (5,), generator=generator)
    leaves = [hidden.clone().requires_grad_() for _ in range(2)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused, _ = head_logprobs(leaves[0], weight, targets)
        plain, _ = token_logprobs(torch.nn.functional.linear(leaves[1], weight), targets)
    torch.testing.assert_close(fused, plain)
    fused.sum().backward()
    plain.sum().backward()
    torch.testing.assert_close(leaves[0].grad, leaves[1].grad)


def test_the_fused_head_refuses_a_trained_output_layer() -> None:
    with pytest.raises(ValueError, match="freeze it"):
        head_logprobs(
            torch.randn(2, 4), torch.randn(9, 4, requires_grad=True), torch.tensor([1, 2])
        )


def test_a_model_that_transforms_its_logits_keeps_them_whole(base_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_path)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    assert fusable_output_head(model, lambda: torch.autocast("cpu", enabled=False)) is not None
    model.config.final_logit_softcapping = 30.0  # Gemma 2/3: tanh-capped after the head
    assert fusable_output_head(model, lambda: torch.autocast("cpu", enabled=False)) is None


# ---------------------------------------------------------------------- a real train step


@pytest.fixture(scope="module")
def base_path() -> Path:
    return resolve_base_model("tiny-random")


def fixed_batch(vocab: int = 695) -> list[TrajectoryGroup]:
    """3 groups x 4 rollouts of 1-4 turns sharing each group's prompt (seeded)."""
    rng = random.Random(7)
    groups = []
    for g in range(3):
        prompt = [rng.randrange(1, vocab) for _ in range(24)]
        trajectories = []
        for r in range(4):
            ids, calls = list(prompt), []
            for turn in range(1 + (g + r) % 4):
                sampled = [rng.randrange(1, vocab) for _ in range(rng.randint(4, 12))]
                logprobs = [-rng.uniform(5.0, 8.0) for _ in sampled]
                calls.append(
                    LLMCall(
                        model="tiny",
                        messages=[],
                        index=turn,
                        prompt_token_ids=list(ids),
                        completion_token_ids=sampled,
                        logprobs=logprobs,
                    )
                )
                ids += sampled + [rng.randrange(1, vocab) for _ in range(rng.randint(3, 9))]
            trajectories.append(Trajectory(calls=calls, reward=float((r * (g + 1)) % 3)))
        groups.append(TrajectoryGroup(trajectories))
    return groups


def fixed_costs(monkeypatch: pytest.MonkeyPatch, per_token: float, checkpointed: float) -> None:
    """Plan as if a token cost ``per_token`` bytes (``checkpointed`` with checkpointing) and
    the process held nothing: the same small micro-batches on every machine."""

    def estimate(shape: Any, **kwargs: Any) -> TokenCosts:
        return costs(checkpointed if kwargs["checkpointing"] else per_token)

    monkeypatch.setattr(trainer_module, "estimate_step_memory", estimate)
    monkeypatch.setattr(trainer_module.Trainer, "_memory_in_use", lambda self, config: 0)


def train_once(
    base_path: Path, folder: Path, config: TrainConfig, *, fused: bool = True
) -> tuple[dict[str, float], list[torch.Tensor], Trainer]:
    """One step; its metrics and the accumulated gradients before clipping."""
    trainer = Trainer(base_path, folder, device="cpu")
    grads: list[torch.Tensor] = []
    finish = trainer._finish_gradients

    def spy(params: list[torch.nn.Parameter], cfg: TrainConfig) -> float:
        grads.extend(p.grad.detach().clone() for p in params if p.grad is not None)
        return finish(params, cfg)

    trainer._finish_gradients = spy  # type: ignore[method-assign]
    if not fused:
        trainer._output_head = lambda cfg: None  # type: ignore[method-assign]
    result = trainer.train_step(fixed_batch(), config)
    return result.metrics, grads, trainer


def test_budget_sized_micro_batches_give_the_same_loss_and_gradients(
    base_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: one micro-batch of everything, the model's own logits, no budget.
    old = EXACT.model_copy(update={"memory_budget": "off", "max_tokens_per_batch": 1_048_576})
    reference, reference_grads, _ = train_once(base_path, tmp_path / "old", old, fused=False)
    assert reference["train/num_micro_batches"] == 1
    # After: micro-batches of at most ~120 tokens (the longest sequence has 99) under a
    # 64 MiB budget at 0.5 MiB a token, with the fused output layer; then with checkpointing,
    # which the same budget turns on when a token costs 1 MiB without it (99 MiB > 64 MiB).
    fixed_costs(monkeypatch, per_token=2**19, checkpointed=2**19)
    small = EXACT.model_copy(update={"memory_budget": "64MiB"})
    metrics, grads, _ = train_once(base_path, tmp_path / "new", small)
    assert 100 < metrics["train/micro_batch_token_budget"] <= 121
    assert metrics["train/num_micro_batches"] >= 4
    assert metrics["train/gradient_checkpointing"] == 0.0
    fixed_costs(monkeypatch, per_token=2**20, checkpointed=2**18)
    checkpointed, checkpointed_grads, _ = train_once(base_path, tmp_path / "ckpt", small)
    assert checkpointed["train/gradient_checkpointing"] == 1.0
    for got, got_grads in ((metrics, grads), (checkpointed, checkpointed_grads)):
        assert got["train/loss"] == pytest.approx(reference["train/loss"], rel=1e-5, abs=1e-8)
        assert got["train/grad_norm"] == pytest.approx(reference["train/grad_norm"], rel=1e-5)
        assert len(got_grads) == len(reference_grads) > 0
        for a, b in zip(got_grads, reference_grads, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


def test_every_step_reports_its_peak_memory_and_budget(base_path: Path, tmp_path: Path) -> None:
    trainer = Trainer(base_path, tmp_path / "m", device="cpu")
    result = trainer.train_step(fixed_batch(), EXACT.model_copy(update={"memory_budget": "8GiB"}))
    metrics = result.metrics
    assert metrics["train/peak_memory_bytes"] > 0
    assert metrics["train/memory_budget_bytes"] == 8 * GiB
    assert 0 < metrics["train/micro_batch_token_budget"] <= EXACT.max_tokens_per_batch
    assert metrics["train/estimated_peak_memory_bytes"] > 0
    [record] = trainer.folder.read_history()
    assert record["train/peak_memory_bytes"] == metrics["train/peak_memory_bytes"]
    # SFT steps report theirs under sft/.
    sequence = TokenSequence([5, 6, 7, 8], [False, True, True, True], [0.0] * 4)
    sft = trainer.train_sft([SFTRecord("line 1", [sequence])], SFTConfig(precision="fp32"))
    assert sft.metrics["sft/peak_memory_bytes"] > 0


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {
        str(path.relative_to(folder)): (path.stat().st_size, path.stat().st_mtime_ns)
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def test_a_sequence_that_cannot_fit_is_refused_before_any_forward(
    base_path: Path, tmp_path: Path
) -> None:
    trainer = Trainer(base_path, tmp_path / "m", device="cpu")
    first = trainer.train_step(fixed_batch(), EXACT)
    before = snapshot(trainer.model_dir)
    forwards = []
    embeddings = trainer.model.get_input_embeddings()
    hook = embeddings.register_forward_hook(lambda *args: forwards.append(1))
    tight = EXACT.model_copy(update={"memory_budget": "64MiB", "gradient_checkpointing": False})
    try:
        with pytest.raises(SequenceTooLargeError) as caught:
            trainer.train_step(fixed_batch(), tight)
    finally:
        hook.remove()
    error = caught.value
    message = str(error)
    assert isinstance(error, MemoryError)
    assert f"a sequence of {error.tokens} tokens" in message
    assert "memory_budget=64MiB" in message and "0.06 GiB" in message  # the budget
    assert "GiB for its forward and backward" in message  # the estimate
    assert "gradient checkpointing" in message and "shorter" in message  # what to change
    assert error.budget_bytes == 64 * 2**20 and error.estimated_bytes > error.budget_bytes
    assert forwards == []
    assert snapshot(trainer.model_dir) == before  # no checkpoint, no history line
    # The trainer goes on from the same step when the budget allows it.
    assert trainer.train_step(fixed_batch(), EXACT).step == first.step + 1


def test_an_environment_budget_that_is_garbage_fails_the_step_clearly(
    base_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(memory.ENV, "plenty")
    trainer = Trainer(base_path, tmp_path / "m", device="cpu")
    with pytest.raises(ValueError, match=f"{memory.ENV}: 'plenty' is not a memory budget"):
        trainer.train_step(fixed_batch(), EXACT)
    assert trainer.latest_step() == 0


def test_the_budget_default_is_positive_here() -> None:
    budget = memory.STARTUP.default_budget()
    if budget.bytes is None:
        pytest.skip("this system reports neither a cgroup limit nor MemAvailable")
    assert memory.MIN_BUDGET <= budget.bytes <= (memory.STARTUP.usable or math.inf)


def test_freed_memory_is_released_only_past_half_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A full collection and ``malloc_trim`` cost a third of a small model's step: they run
    when the process holds over half its budget, or when there is no budget at all."""
    monkeypatch.setattr(memory, "resident_bytes", lambda: 3 * 2**30)
    assert memory.release_freed_memory(budget=8 * 2**30) is False
    assert memory.release_freed_memory(budget=4 * 2**30) is True
    monkeypatch.setattr(memory, "process_memory_budget", lambda: memory.MemoryBudget(None, "off"))
    assert memory.release_freed_memory() is True


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="malloc_trim is glibc's",
)
def test_freed_heap_pages_go_back_to_the_system() -> None:
    """Memory freed in the middle of the heap stays resident (a closed model's, a GGUF
    conversion's): it counted as held against the next step's budget until something
    trimmed. ``return_freed_pages`` gives it back (run by ``LocalBackend.close``, after a
    model build, and before a step measures what the process holds)."""
    chunks = [bytearray(64 * 1024) for _ in range(3200)]  # 200 MiB of 64 KiB heap blocks
    del chunks[: len(chunks) - 1]  # the last one alive: the heap cannot shrink from its top
    before = memory.resident_bytes()
    memory.return_freed_pages()
    after = memory.resident_bytes()
    assert before - after > 100 * 2**20, (before, after)


def test_the_heap_frozen_at_a_load_is_left_out_of_collections_until_let_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What is alive once a model is loaded is frozen (a full collection no longer walks
    it); a cycle among frozen objects is freed by ``collect_frozen`` (a model closed), and
    ``ART_CORE_GC_FREEZE=0`` leaves the collector as Python has it."""
    import gc
    import weakref

    class Node:
        other: Any = None

    monkeypatch.delenv(memory.FREEZE_ENV, raising=False)
    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle: only the collector frees it
    alive = weakref.ref(a)
    assert memory.freeze_heap() and gc.get_freeze_count() > 0
    del a, b
    gc.collect()
    assert alive() is not None  # frozen: out of the collection
    memory.collect_frozen()
    assert alive() is None and gc.get_freeze_count() > 0  # freed; the rest frozen again

    monkeypatch.setenv(memory.FREEZE_ENV, "0")
    gc.unfreeze()
    assert memory.freeze_heap() is False and gc.get_freeze_count() == 0
    memory.collect_frozen()
    assert gc.get_freeze_count() == 0


async def test_a_closed_backends_engine_is_freed_though_its_heap_was_frozen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's objects were frozen at registration; closing the backend lets go of
    them and collects the frozen ones again, so the weights leave memory even while the
    caller still holds the backend and the model, and even where only reference cycles hold
    them (pre-packed bf16 linears make some): every parameter, not only the model object.
    (``close`` used to collect while its loop still held the last model: its weights were
    frozen again and stayed, the whole model in bf16.)"""
    import weakref

    import art_core as art

    monkeypatch.delenv(memory.FREEZE_ENV, raising=False)
    backend = art.LocalBackend(path=tmp_path)
    async with backend:
        model = art.TrainableModel(name="freed", project="memory", base_model="tiny-random")
        await model.register(backend)
        served = backend._entry(model).served.engine.model
        served.held_by_a_cycle = [served]  # as packed linears do, on every CPU
        weights = [weakref.ref(p) for p in served.parameters()]
        model_object = weakref.ref(served)
        del served
        assert weights and all(w() is not None for w in weights)
    assert model_object() is None
    assert [w for w in weights if w() is not None] == []


async def test_a_closed_backend_frees_its_models_by_reference_counting_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Serving sets forwards on the engine's modules (pre-packed weights, a LoRA adapter
    swapped in) that hold their modules in cycles; the engine takes them back when it
    closes. So closing a backend frees its engine, trainer and every weight without walking
    the frozen heap (a full collection: ~0.2 s alone, more in a larger process, at every
    close), and only a cycle still left (the test above) costs one."""

    import art_core as art

    monkeypatch.delenv(memory.FREEZE_ENV, raising=False)
    collections: list[None] = []
    real_collect = memory.collect_frozen
    monkeypatch.setattr(memory, "collect_frozen", lambda: collections.append(real_collect()))
    backend = art.LocalBackend(path=tmp_path)
    async with backend:
        model = art.TrainableModel(name="counted", project="memory", base_model="tiny-random")
        await model.register(backend)

        async def scored(reward: float) -> art.Trajectory:
            async with art.capture(model) as run:
                await run.openai_client().chat.completions.create(
                    model=run.model_name,
                    messages=[{"role": "user", "content": "hi"}],
                    max_tokens=4,
                    temperature=1.0,
                )
            return run.trajectory(reward=reward)

        await model.train([art.TrajectoryGroup([await scored(1.0), await scored(0.0)])])
        await scored(0.5)  # served with the trained adapter swapped in
        entry = backend._entry(model)
        engine, trainer = entry.served.engine, entry.trainer
        assert engine.current_adapter is not None and trainer is not None
        # The adapter's forwards in place, as while a batch of its rows decodes: an idle engine
        # has put them back, and only a CPU that pre-packs bf16 weights keeps forwards of its
        # own (an AVX2 machine serves fp32 without them), so the state closed here is the same
        # on every machine.
        assert engine._lora is not None
        engine._lora.activate(engine.current_adapter.name)
        assert any("forward" in m.__dict__ for m in engine.model.modules())  # serving's own
        refs = memory.weak_references(engine, engine.model, trainer, trainer.model)
        assert len(refs) > 4 and collections == []
        del engine, trainer, entry
    assert [ref for ref in refs if ref() is not None] == []
    assert collections == []  # nothing was left for a full collection
