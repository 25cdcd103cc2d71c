"""``Trainer`` on tiny-random: learning signal, checkpoints, resume, history, deletion."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from art_core.embedded import resolve_base_model
from art_core.model_folder import ModelFolder
from art_core.training import TrainConfig, Trainer
from art_core.trajectories import LLMCall, Trajectory, TrajectoryGroup

# A high learning rate so one step on a tiny model moves probabilities measurably.
FAST = TrainConfig(learning_rate=2e-2, precision="fp32", seed=1)


@pytest.fixture(scope="module")
def base_path() -> Path:
    return resolve_base_model("tiny-random")


@pytest.fixture(scope="module")
def tokenizer(base_path: Path):  # type: ignore[no-untyped-def]
    return AutoTokenizer.from_pretrained(base_path)


@pytest.fixture(scope="module")
def base_model(base_path: Path):  # type: ignore[no-untyped-def]
    return AutoModelForCausalLM.from_pretrained(base_path).eval()


def completion_logprobs(model, prompt: list[int], completion: list[int]) -> list[float]:  # type: ignore[no-untyped-def]
    """What a sampler at temperature 1 would have recorded for ``completion``."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = model(ids).logits[0, :-1].log_softmax(-1)
    targets = ids[0, 1:]
    picked = logp.gather(-1, targets[:, None])[:, 0]
    return picked[len(prompt) - 1 :].tolist()


@pytest.fixture(scope="module")
def prompt(tokenizer) -> list[int]:  # type: ignore[no-untyped-def]
    messages = [{"role": "user", "content": "Say yes or no."}]
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"])


@pytest.fixture(scope="module")
def answers(tokenizer) -> dict[str, list[int]]:  # type: ignore[no-untyped-def]
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return {
        word: [*tokenizer(word, add_special_tokens=False)["input_ids"], end]
        for word in ("yes", "no")
    }


def make_group(base_model, prompt, answers, rewards: dict[str, float], copies: int = 2):  # type: ignore[no-untyped-def]
    trajectories = []
    for word, reward in rewards.items():
        completion = answers[word]
        for _ in range(copies):
            call = LLMCall(
                model="tiny",
                messages=[],
                prompt_token_ids=prompt,
                completion_token_ids=completion,
                logprobs=completion_logprobs(base_model, prompt, completion),
            )
            trajectories.append(Trajectory(calls=[call], reward=reward))
    return TrajectoryGroup(trajectories)


def sequence_logprob(model, prompt: list[int], completion: list[int]) -> float:  # type: ignore[no-untyped-def]
    return sum(completion_logprobs(model, prompt, completion))


def test_train_step_raises_the_probability_of_rewarded_completions(
    tmp_path: Path, base_path: Path, base_model, prompt, answers
) -> None:  # type: ignore[no-untyped-def]
    group = make_group(base_model, prompt, answers, {"yes": 1.0, "no": 0.0})
    trainer = Trainer(base_path, tmp_path / "model", device="cpu")
    assert trainer.latest_step() == 0
    events: list[dict] = []

    result = trainer.train_step([group], FAST, on_progress=events.append)

    assert result.step == 1 and trainer.latest_step() == 1
    folder = Path(result.checkpoint_path)
    assert folder == tmp_path / "model" / "checkpoints" / "0001"
    # The standard PEFT folder format an engine loads, plus pickle-free trainer files.
    names = {p.name for p in folder.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "optimizer.safetensors"} <= names
    assert "trainer_state.json" in names
    assert not any(n.endswith((".bin", ".pt", ".pth", ".pkl")) for n in names)

    tuned = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(base_path), folder
    ).eval()
    before = {w: sequence_logprob(base_model, prompt, ids) for w, ids in answers.items()}
    after = {w: sequence_logprob(tuned, prompt, ids) for w, ids in answers.items()}
    assert after["yes"] > before["yes"] + 0.05, (before, after)
    assert after["no"] < before["no"] - 0.05, (before, after)

    metrics = result.metrics
    assert metrics["train/reward"] == 0.5
    assert metrics["train/num_trainable_tokens"] == 2 * len(answers["yes"]) + 2 * len(answers["no"])
    assert metrics["train/optimizer_steps"] == 1 and metrics["train/grad_norm"] > 0
    assert metrics["train/loss"] == pytest.approx(0.0, abs=1e-3)  # ratio 1, advantages sum to 0
    assert metrics["train/logprob_mismatch"] < 1e-4  # fp32 trainer == fp32 "sampler"
    assert 0 < metrics["train/entropy"] <= torch.log(torch.tensor(1024.0)).item()
    assert [e["event"] for e in events] == ["micro_batch", "optimizer_step"]

    # History is stored under the step that sampled the rollouts (0), ART-style.
    [record] = ModelFolder(tmp_path / "model").read_history()
    assert record["step"] == 0 and record["checkpoint_step"] == 1
    assert record["train/loss"] == pytest.approx(metrics["train/loss"])
    [saved] = ModelFolder(tmp_path / "model").read_trajectories("train", 0)
    assert saved == group


def test_resume_continues_with_the_same_adapter_and_optimizer_state(
    tmp_path: Path, base_path: Path, base_model, prompt, answers
) -> None:  # type: ignore[no-untyped-def]
    groups = [
        [make_group(base_model, prompt, answers, {"yes": 1.0, "no": 0.0})],
        [make_group(base_model, prompt, answers, {"yes": 0.0, "no": 1.0})],
        [make_group(base_model, prompt, answers, {"yes": 1.0, "no": 0.2})],
    ]
    straight = Trainer(base_path, tmp_path / "straight", device="cpu")
    for batch in groups:
        straight.train_step(batch, FAST)

    first = Trainer(base_path, tmp_path / "resumed", device="cpu")
    for batch in groups[:2]:
        first.train_step(batch, FAST)
    weights = {n: p.detach().clone() for n, p in first.model.named_parameters() if p.requires_grad}
    optimizer_state = first.optimizer.state_dict()
    del first  # "kill" the process: only the folder survives

    second = Trainer(base_path, tmp_path / "resumed", device="cpu")
    assert second.latest_step() == 2
    assert second.load() == 2
    for name, param in second.model.named_parameters():
        if param.requires_grad:
            assert torch.equal(param, weights[name]), name
    restored = second.optimizer.state_dict()
    assert restored["param_groups"][0]["betas"] == optimizer_state["param_groups"][0]["betas"]
    for index, state in optimizer_state["state"].items():
        for key, value in state.items():
            assert torch.equal(restored["state"][index][key], value), (index, key)

    result = second.train_step(groups[2], FAST)
    assert result.step == 3
    # Same adapter after step 3 whether or not training was interrupted after step 2 (this
    # needs Adam's moments back: a fresh optimizer would take a different step).
    resumed = load_file(str(Path(result.checkpoint_path) / "adapter_model.safetensors"))
    uninterrupted = load_file(
        str(tmp_path / "straight" / "checkpoints" / "0003" / "adapter_model.safetensors")
    )
    assert resumed.keys() == uninterrupted.keys()
    for key in resumed:
        torch.testing.assert_close(resumed[key], uninterrupted[key], rtol=0, atol=1e-7)


def test_gradient_accumulation_over_micro_batches_matches_one_big_batch(
    tmp_path: Path, base_path: Path, base_model, prompt, answers
) -> None:  # type: ignore[no-untyped-def]
    group = make_group(base_model, prompt, answers, {"yes": 1.0, "no": 0.0}, copies=3)
    small = FAST.model_copy(update={"max_tokens_per_batch": 16})  # one sequence per batch
    results = {}
    for name, config in {
        "big": FAST,
        "small": small,
        "padded": FAST.model_copy(update={"packing": False}),
    }.items():
        trainer = Trainer(base_path, tmp_path / name, device="cpu")
        result = trainer.train_step([group], config)
        results[name] = (
            result,
            load_file(str(Path(result.checkpoint_path) / "adapter_model.safetensors")),
        )
    assert results["big"][0].metrics["train/num_micro_batches"] == 1
    assert results["small"][0].metrics["train/num_micro_batches"] == 6
    for name in ("small", "padded"):
        for key, value in results["big"][1].items():
            torch.testing.assert_close(results[name][1][key], value, rtol=1e-4, atol=1e-6)
        assert results[name][0].metrics["train/grad_norm"] == pytest.approx(
            results["big"][0].metrics["train/grad_norm"], rel=1e-4
        )


def test_delete_checkpoints_keeps_latest_and_best(
    tmp_path: Path, base_path: Path, base_model, prompt, answers
) -> None:  # type: ignore[no-untyped-def]
    trainer = Trainer(base_path, tmp_path / "model", device="cpu")
    # Mean rewards 0.5, 0.9, 0.3 sampled by checkpoints 0 (base), 1, 2; then checkpoint 3.
    for yes, no in ((1.0, 0.0), (1.0, 0.8), (0.6, 0.0)):
        trainer.train_step([make_group(base_model, prompt, answers, {"yes": yes, "no": no})], FAST)
    assert trainer.latest_step() == 3
    assert trainer.delete_checkpoints("train/reward") == [2]
    assert sorted(p.name for p in (tmp_path / "model" / "checkpoints").iterdir()) == [
        "0001",
        "0003",
    ]
    assert trainer.delete_checkpoints("train/reward") == []
    # The latest survives and training continues from it.
    assert (
        trainer.train_step(
            [make_group(base_model, prompt, answers, {"yes": 1.0, "no": 0.0})], FAST
        ).step
        == 4
    )


def test_groups_without_signal_train_nothing_say_why_and_write_no_checkpoint(
    tmp_path: Path, base_path: Path, base_model, prompt, answers, caplog
) -> None:  # type: ignore[no-untyped-def]
    trainer = Trainer(base_path, tmp_path / "model", device="cpu")
    first = trainer.train_step(
        [make_group(base_model, prompt, answers, {"yes": 1.0, "no": 0.0})], FAST
    )
    flat = make_group(base_model, prompt, answers, {"yes": 1.0, "no": 1.0})
    with caplog.at_level("WARNING"):
        second = trainer.train_step([flat, flat], FAST)
    # Nothing changed: the step stays, no checkpoint is written, the reason is loud.
    assert second.step == 1 and trainer.latest_step() == 1
    assert second.checkpoint_path == first.checkpoint_path
    assert second.nothing_trained is not None and "equal rewards" in second.nothing_trained
    assert "train/groups_skipped" in caplog.text and "trained on nothing" in caplog.text
    assert second.metrics["train/groups_skipped"] == 2
    assert second.metrics["train/optimizer_steps"] == 0 and second.metrics["train/trained"] == 0
    assert sorted(p.name for p in (tmp_path / "model" / "checkpoints").iterdir()) == ["0001"]
    # The history still shows the step's data (under the step that sampled it).
    records = ModelFolder(tmp_path / "model").read_history()
    assert [r["checkpoint_step"] for r in records] == [1, None]
    # The next step with signal trains normally and becomes step 2.
    third = trainer.train_step(
        [make_group(base_model, prompt, answers, {"yes": 0.0, "no": 1.0})], FAST
    )
    assert third.step == 2 and third.nothing_trained is None


def test_all_objective_options_train(
    tmp_path: Path, base_path: Path, base_model, prompt, answers
) -> None:  # type: ignore[no-untyped-def]
    group = make_group(base_model, prompt, answers, {"yes": 1.0, "no": 0.0})
    config = TrainConfig(
        learning_rate=1e-2,
        loss="cispo",
        epsilon_high=0.28,
        truncated_importance_sampling=2.0,
        beta=0.05,
        scale_rewards=False,
        num_epochs=2,
        optimizer_steps_per_epoch=2,
        packing=False,
        lora_dropout=0.1,
        precision="bf16",
    )
    trainer = Trainer(base_path, tmp_path / "model", device="cpu")
    first = trainer.train_step([group], config)
    second = trainer.train_step([group], config)
    assert second.metrics["train/optimizer_steps"] == 4
    assert second.metrics["train/kl"] > 0  # the adapter moved away from the base model
    yes_before = sequence_logprob(base_model, prompt, answers["yes"])
    tuned = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(base_path), second.checkpoint_path
    ).eval()
    assert sequence_logprob(tuned, prompt, answers["yes"]) > yes_before
    state = json.loads((Path(first.checkpoint_path) / "trainer_state.json").read_text())
    assert state["step"] == 1 and state["config"]["loss"] == "cispo"


def test_lora_shape_cannot_change_and_bad_input_is_rejected(
    tmp_path: Path, base_path: Path, base_model, prompt, answers
) -> None:  # type: ignore[no-untyped-def]
    trainer = Trainer(base_path, tmp_path / "model", device="cpu")
    group = make_group(base_model, prompt, answers, {"yes": 1.0, "no": 0.0})
    trainer.train_step([group], FAST)
    with pytest.raises(ValueError, match="LoRA shape cannot change"):
        trainer.train_step([group], FAST.model_copy(update={"lora_rank": 4}))
    with pytest.raises(ValueError, match="at least one TrajectoryGroup"):
        trainer.train_step([], FAST)
    with pytest.raises(TypeError, match="TrainConfig"):
        trainer.train_step([group], {"learning_rate": 1.0})  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        Trainer(tmp_path, tmp_path / "other")
    assert trainer.latest_step() == 1  # failed calls wrote nothing


def test_a_failed_step_leaves_the_model_at_its_last_checkpoint(
    tmp_path: Path, base_path: Path, base_model, prompt, answers
) -> None:  # type: ignore[no-untyped-def]
    trainer = Trainer(base_path, tmp_path / "model", device="cpu")
    group = make_group(base_model, prompt, answers, {"yes": 1.0, "no": 0.0})
    first = trainer.train_step([group], FAST)
    saved = load_file(str(Path(first.checkpoint_path) / "adapter_model.safetensors"))

    def fail_after_the_update(event: dict) -> None:
        if event["event"] == "optimizer_step":  # the weights in memory have just changed
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        trainer.train_step([group], FAST, on_progress=fail_after_the_update)
    assert trainer.latest_step() == 1
    assert trainer.load() == 1
    in_memory = {
        name: param for name, param in trainer.model.named_parameters() if param.requires_grad
    }
    for key, value in saved.items():
        name = key.replace(".weight", ".default.weight")
        torch.testing.assert_close(in_memory[name], value, rtol=0, atol=0)
    assert trainer.train_step([group], FAST).step == 2


def test_a_model_that_refuses_a_boolean_logits_to_keep_trains_the_same(
    tmp_path: Path, base_path: Path, base_model, prompt, answers, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """transformers before ~5.2x (5.17 on the GPU image) indexes hidden states with the
    boolean mask as 1-D positions and raises; the trainer then computes full logits."""
    group = make_group(base_model, prompt, answers, {"yes": 1.0, "no": 0.0})
    expected = Trainer(base_path, tmp_path / "a", device="cpu").train_step([group], FAST)

    forward = type(base_model).forward
    refused: list[int] = []

    def old_forward(self, *args, logits_to_keep=0, **kwargs):  # type: ignore[no-untyped-def]
        if isinstance(logits_to_keep, torch.Tensor):
            refused.append(1)
            raise IndexError("too many indices for tensor of dimension 3")
        return forward(self, *args, logits_to_keep=logits_to_keep, **kwargs)

    monkeypatch.setattr(type(base_model), "forward", old_forward)
    # The model's own logits are what a model whose output layer cannot run fused gets.
    monkeypatch.setattr(Trainer, "_output_head", lambda self, config: None)
    trainer = Trainer(base_path, tmp_path / "b", device="cpu")
    result = trainer.train_step([group], FAST)
    again = trainer.train_step([group], FAST)
    assert refused == [1]  # asked once, then full logits from then on
    for key in ("train/loss", "train/logprob_mismatch", "train/grad_norm", "train/entropy"):
        assert result.metrics[key] == pytest.approx(expected.metrics[key], rel=1e-4, abs=1e-6)
    assert again.step == 2
