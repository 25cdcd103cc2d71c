"""SFT in the trainer: plans, schedules, the loss it computes, and steps shared with GRPO."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from art_core.embedded import resolve_base_model
from art_core.model_folder import ModelFolder
from art_core.training import SFTConfig, TrainConfig, Trainer
from art_core.training.sequences import TokenSequence
from art_core.training.sft import SFTRecord, learning_rate_schedule, plan_sft
from art_core.trajectories import LLMCall, Trajectory, TrajectoryGroup


@pytest.fixture(scope="module")
def base_path() -> Path:
    return resolve_base_model("tiny-random")


@pytest.fixture(scope="module")
def tokenizer(base_path: Path):  # type: ignore[no-untyped-def]
    return AutoTokenizer.from_pretrained(base_path)


def record(tokenizer, question: str, answer: str, label: str = "r") -> SFTRecord:  # type: ignore[no-untyped-def]
    prompt = list(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True
        )["input_ids"]
    )
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    completion = [*tokenizer(answer, add_special_tokens=False)["input_ids"], end]
    ids = prompt + completion
    mask = [False] * len(prompt) + [True] * len(completion)
    return SFTRecord(label, [TokenSequence(ids, mask, [0.0] * len(ids))])


def seq(n_context: int, n_trained: int) -> TokenSequence:
    n = n_context + n_trained
    return TokenSequence(list(range(1, n + 1)), [False] * n_context + [True] * n_trained, [0.0] * n)


# ------------------------------------------------------------------------------ planning
def test_schedule_warmup_and_decay() -> None:
    assert learning_rate_schedule(5, 2.0, "constant", warmup_steps=2) == [1.0, 2.0, 2.0, 2.0, 2.0]
    assert learning_rate_schedule(3, 1.0, "linear") == [1.0, 0.5, 0.0]
    cosine = learning_rate_schedule(5, 1.0, "cosine", warmup_steps=0)
    assert cosine[0] == 1.0 and cosine[-1] == pytest.approx(0.0) and cosine[2] == pytest.approx(0.5)
    assert learning_rate_schedule(1, 3.0, "linear") == [3.0]
    with pytest.raises(ValueError, match="schedule_type"):
        learning_rate_schedule(2, 1.0, "step")


def test_plan_epochs_batches_and_shuffle() -> None:
    records = [SFTRecord(f"r{i}", [seq(2, 1)]) for i in range(5)]
    plan = plan_sft(records, SFTConfig(batch_size=2, epochs=3, seed=7))
    assert [len(u.records) for u in plan.updates] == [2, 2, 1] * 3
    assert [u.epoch for u in plan.updates] == [0] * 3 + [1] * 3 + [2] * 3
    epochs = [sorted(i for u in plan.updates if u.epoch == e for i in u.records) for e in range(3)]
    assert epochs == [[0, 1, 2, 3, 4]] * 3  # every record once per epoch
    orders = [[i for u in plan.updates if u.epoch == e for i in u.records] for e in range(3)]
    assert len({tuple(o) for o in orders}) > 1  # reshuffled per epoch
    same = plan_sft(records, SFTConfig(batch_size=2, epochs=3, seed=7))
    assert [u.records for u in same.updates] == [u.records for u in plan.updates]
    ordered = plan_sft(records, SFTConfig(batch_size="auto", shuffle=False))
    assert [u.records for u in ordered.updates] == [[0, 1], [2, 3], [4]]  # ART's auto: 2
    assert plan.metrics["sft/num_records"] == 5 and plan.metrics["sft/epochs"] == 3


def test_plan_learning_rates_from_list_or_schedule() -> None:
    records = [SFTRecord(f"r{i}", [seq(1, 1)]) for i in range(4)]
    plan = plan_sft(records, SFTConfig(batch_size=2, learning_rate=[3e-4, 2e-4], shuffle=False))
    assert [u.learning_rate for u in plan.updates] == [3e-4, 2e-4]
    with pytest.raises(ValueError, match="make 4 steps, but 2 rates were given"):
        plan_sft(records, SFTConfig(batch_size=2, epochs=2, learning_rate=[1e-4, 1e-4]))
    plan = plan_sft(
        records,
        SFTConfig(batch_size=1, learning_rate=1e-3, schedule_type="linear", warmup_ratio=0.25),
    )
    assert [u.learning_rate for u in plan.updates] == pytest.approx([1e-3, 1e-3, 5e-4, 0.0])


def test_plan_rejects_bad_records_by_name() -> None:
    good = SFTRecord("good", [seq(2, 2)])
    with pytest.raises(ValueError, match="at least one record"):
        plan_sft([], SFTConfig())
    with pytest.raises(ValueError, match=r"chat\.jsonl:3: no assistant token"):
        plan_sft([good, SFTRecord("chat.jsonl:3", [seq(3, 0)])], SFTConfig())
    with pytest.raises(
        ValueError, match="long one: a sequence of 12 tokens is over the model's context of 10"
    ):
        plan_sft([good, SFTRecord("long one", [seq(2, 10)])], SFTConfig(), max_length=10)


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        SFTConfig(batch_size=0)
    with pytest.raises(ValueError, match="finite and > 0"):
        SFTConfig(learning_rate=[1e-4, -1.0])
    with pytest.raises(ValueError, match="schedule_type must be 'constant'"):
        SFTConfig(learning_rate=[1e-4], schedule_type="cosine")
    with pytest.raises(ValueError):
        SFTConfig(epochs=0)
    with pytest.raises(ValueError):
        SFTConfig(warmup_ratio=1.0)
    with pytest.raises(ValueError):
        SFTConfig(num_epochs=2)  # type: ignore[call-arg]  (GRPO's name: SFT says epochs)


# ------------------------------------------------------------------------------ the trainer
def test_loss_is_the_token_mean_negative_log_likelihood(
    base_path: Path, tokenizer, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """With a fresh adapter (LoRA B = 0) the first step's loss is the base model's mean NLL
    over all trained tokens of the batch, however the records are packed."""
    records = [
        record(tokenizer, "What is 2+2?", "4"),
        record(tokenizer, "Name a colour.", "A shade of blue, like the sky"),
        record(tokenizer, "What is 2+2?", "four"),  # shares its prompt with the first
    ]
    base = AutoModelForCausalLM.from_pretrained(base_path).eval()
    nll, count = 0.0, 0
    for r in records:
        (sequence,) = r.sequences
        ids = torch.tensor([sequence.token_ids])
        with torch.no_grad():
            logp = base(ids).logits[0, :-1].log_softmax(-1)
        picked = logp.gather(-1, ids[0, 1:, None])[:, 0]
        trained = torch.tensor(sequence.loss_mask[1:])
        nll -= float(picked[trained].sum())
        count += int(trained.sum())
    trainer = Trainer(base_path, tmp_path / "m")
    config = SFTConfig(learning_rate=1e-9, batch_size=3, precision="fp32", max_tokens_per_batch=32)
    result = trainer.train_sft(records, config)
    assert result.metrics["sft/loss"] == pytest.approx(nll / count, rel=1e-4)
    assert result.metrics["sft/num_micro_batches"] >= 2  # the 32-token budget split the batch
    assert result.metrics["sft/num_trainable_tokens"] == count


def test_sft_then_grpo_on_one_adapter(base_path: Path, tokenizer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    folder = ModelFolder(tmp_path / "m")
    trainer = Trainer(base_path, folder)
    records = [record(tokenizer, f"Question {i}?", "yes", label=f"r{i}") for i in range(6)]
    config = SFTConfig(learning_rate=5e-3, epochs=3, batch_size=2, precision="fp32", seed=3)
    progress: list[dict] = []
    result = trainer.train_sft(records, config, on_progress=progress.append)

    assert result.step == 1 and trainer.latest_step() == 1
    metrics = result.metrics
    assert metrics["sft/optimizer_steps"] == 9 and metrics["sft/trained"] == 1.0
    assert metrics["sft/last_epoch_loss"] < metrics["sft/first_epoch_loss"]
    assert not any(k.startswith("train/") for k in metrics)
    assert [e["event"] for e in progress].count("optimizer_step") == 9
    last = [e for e in progress if e["event"] == "micro_batch"][-1]
    assert last["micro_batch"] == last["num_micro_batches"] == metrics["sft/num_micro_batches"]

    (record_line,) = folder.read_history()
    assert record_line["split"] == "sft" and record_line["step"] == 0
    assert record_line["checkpoint_step"] == 1 and record_line["sft/loss"] > 0
    state = json.loads((folder.checkpoint(1) / "trainer_state.json").read_text())
    assert state["config"]["epochs"] == 3

    # A GRPO step continues from the SFT checkpoint (adapter and optimizer state) to step 2.
    prompt = records[0].sequences[0].token_ids[: records[0].sequences[0].loss_mask.index(True)]
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    trajectories = []
    for word, reward in (("yes", 1.0), ("no", 0.0)):
        completion = [*tokenizer(word, add_special_tokens=False)["input_ids"], end]
        call = LLMCall(
            model="m",
            messages=[],
            prompt_token_ids=prompt,
            completion_token_ids=completion,
            logprobs=[-1.0] * len(completion),
        )
        trajectories.append(Trajectory(calls=[call], reward=reward))
    grpo = trainer.train_step(
        [TrajectoryGroup(trajectories)], TrainConfig(learning_rate=1e-3, precision="fp32")
    )
    assert grpo.step == 2 and [r["split"] for r in folder.read_history()] == ["sft", "train"]

    # And an SFT step after GRPO, in a new trainer (resumed from disk).
    again = Trainer(base_path, folder).train_sft(
        records[:2], config.model_copy(update={"epochs": 1})
    )
    assert again.step == 3 and math.isfinite(again.metrics["sft/loss"])


def test_lora_shape_must_match_the_adapter(base_path: Path, tokenizer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    trainer = Trainer(base_path, tmp_path / "m")
    records = [record(tokenizer, "Hi?", "yes")]
    trainer.train_sft(records, SFTConfig(precision="fp32"))
    with pytest.raises(ValueError, match="SFTConfig asks for"):
        trainer.train_sft(records, SFTConfig(precision="fp32", lora_rank=4))
    assert trainer.latest_step() == 1


def test_a_bad_record_trains_nothing(base_path: Path, tokenizer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    trainer = Trainer(base_path, tmp_path / "m")
    good = record(tokenizer, "Hi?", "yes")
    with pytest.raises(
        ValueError, match="huge: a sequence of 3000 tokens is over the model's context of 2048"
    ):
        trainer.train_sft([good, SFTRecord("huge", [seq(2990, 10)])], SFTConfig(precision="fp32"))
    assert trainer.latest_step() == 0 and not ModelFolder(tmp_path / "m").history.exists()
