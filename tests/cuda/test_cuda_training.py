"""Training on cuda:0: a trainer step in fp32 and under bf16 autocast moves the adapter the
right way, and the full public loop (gateway, engine and trainer on one GPU, bf16, adapter
hot-swapped) makes tiny-random learn the digits task of ``test_training_learning``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from cuda_support import needs_cuda
from peft import PeftModel
from test_training_learning import CONFIG, MAX_STEPS, gather, mean_reward
from test_training_trainer import FAST, completion_logprobs, make_group, sequence_logprob
from transformers import AutoModelForCausalLM, AutoTokenizer

import art_core as art
from art_core.embedded import resolve_base_model
from art_core.training import Trainer

pytestmark = needs_cuda


@pytest.fixture(scope="module")
def base_path() -> Path:
    return resolve_base_model("tiny-random")


@pytest.fixture(scope="module")
def base_model(base_path: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(base_path).eval()


@pytest.fixture(scope="module")
def yes_no(base_path: Path) -> tuple[list[int], dict[str, list[int]]]:
    """A prompt and the token ids of the answers "yes" and "no" (each ending the turn)."""
    tokenizer = AutoTokenizer.from_pretrained(base_path)
    messages = [{"role": "user", "content": "Say yes or no."}]
    prompt = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"])
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    answers = {
        word: [*tokenizer(word, add_special_tokens=False)["input_ids"], end]
        for word in ("yes", "no")
    }
    return prompt, answers


@pytest.mark.parametrize(("precision", "mismatch"), [("fp32", 1e-3), ("bf16", 0.05)])
def test_a_train_step_on_cuda_raises_the_rewarded_completion(
    tmp_path: Path,
    base_path: Path,
    base_model: Any,
    yes_no: tuple[list[int], dict[str, list[int]]],
    precision: str,
    mismatch: float,
) -> None:
    prompt, answers = yes_no
    group = make_group(base_model, prompt, answers, {"yes": 1.0, "no": 0.0})
    torch.cuda.reset_peak_memory_stats()
    trainer = Trainer(base_path, tmp_path / "model", device="cuda:0")
    result = trainer.train_step([group], FAST.model_copy(update={"precision": precision}))
    assert result.step == 1 and result.checkpoint_path is not None
    assert torch.cuda.max_memory_allocated() > 0  # the step ran on the GPU
    # The recorded logprobs (fp32 on the CPU) agree with the trainer's on the GPU.
    assert result.metrics["train/logprob_mismatch"] < mismatch
    tuned = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(base_path), result.checkpoint_path
    ).eval()
    before = {w: sequence_logprob(base_model, prompt, ids) for w, ids in answers.items()}
    after = {w: sequence_logprob(tuned, prompt, ids) for w, ids in answers.items()}
    assert after["yes"] > before["yes"] + 0.05, (before, after)
    assert after["no"] < before["no"] - 0.05, (before, after)
    assert completion_logprobs(tuned, prompt, answers["yes"])  # the saved adapter loads on CPU


async def test_tiny_random_learns_to_answer_in_digits_on_cuda(tmp_path: Path) -> None:
    started = time.perf_counter()
    # bf16 on both sides (engine and trainer autocast), as a CUDA run trains by default.
    config = CONFIG.model_copy(update={"precision": "auto"})
    async with art.LocalBackend(path=tmp_path, engine="transformers", device="cuda:0") as backend:
        model = art.TrainableModel(name="digits", project="learning", base_model="tiny-random")
        await model.register(backend)
        engine: Any = backend.engine(model)
        assert engine.device == "cuda:0" and engine.dtype == torch.bfloat16
        groups = await gather(model, 0)
        rewards = [mean_reward(groups)]
        for step in range(1, MAX_STEPS + 1):
            result = await model.train(groups, config=config)
            assert result.step == step
            assert result.metrics["train/logprob_mismatch"] < 0.05  # sampler and trainer agree
            groups = await gather(model, step)
            assert {c.adapter_step for g in groups for t in g for c in t.calls} == {step}
            rewards.append(mean_reward(groups))
            if rewards[-1] >= 0.8:
                break
    curve = " ".join(f"{r:.2f}" for r in rewards)
    assert rewards[-1] >= 0.8, f"mean reward per step: {curve}"
    print(f"\nreward by step on cuda: {curve} ({time.perf_counter() - started:.0f} s)")
