"""The training signal (``signals/{split}/{step:04d}.jsonl``): what each rollout of a GRPO
step was trained with (advantage, token weight, the trainer's logprob of every trained token),
on tiny-random; and the packing ``segments`` it is traced through."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from art_core.embedded import resolve_base_model
from art_core.model_folder import ModelFolder
from art_core.training import SFTConfig, TrainConfig, Trainer
from art_core.training.advantages import group_advantages
from art_core.training.distributed import DistributedTrainer, TrainingWorld
from art_core.training.packing import (
    MicroBatch,
    TrainingExample,
    make_micro_batches,
    pack_row,
    pad_rows,
)
from art_core.training.sequences import TokenSequence, assemble_sequences
from art_core.training.sft import SFTRecord
from art_core.trajectories import LLMCall, Trajectory, TrajectoryGroup

# A high learning rate so one update on a tiny model moves its logprobs measurably.
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
        for word in ("yes", "no", "maybe so")
    }


def call(model, prompt: list[int], completion: list[int], index: int = 0) -> LLMCall:  # type: ignore[no-untyped-def]
    return LLMCall(
        model="tiny",
        messages=[],
        index=index,
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        logprobs=completion_logprobs(model, prompt, completion),
    )


def make_group(base_model, prompt, answers, rewards: dict[str, float], copies: int = 2):  # type: ignore[no-untyped-def]
    trajectories = [
        Trajectory(calls=[call(base_model, prompt, answers[word])], reward=reward)
        for word, reward in rewards.items()
        for _ in range(copies)
    ]
    return TrajectoryGroup(trajectories)


@pytest.fixture(scope="module")
def groups(base_model, prompt, answers) -> list[TrajectoryGroup]:  # type: ignore[no-untyped-def]
    """Single-call rollouts; multi-call ones (one merged sequence; two sequences after a
    break); and a group of equal rewards, which trains nothing."""
    yes, no, maybe = answers["yes"], answers["no"], answers["maybe so"]
    turn = [7, 8, 9]  # a tool result after the first answer
    merged = Trajectory(
        calls=[
            call(base_model, prompt, yes),
            call(base_model, prompt + yes + turn, maybe, index=1),
        ],
        reward=0.8,
    )
    other_prompt = [*prompt[:-3], 11, 12, 13]
    broken = Trajectory(
        calls=[
            call(base_model, prompt, no),
            call(base_model, other_prompt, yes, index=1),  # not an extension: a new sequence
        ],
        reward=0.3,
    )
    single = Trajectory(calls=[call(base_model, prompt, maybe)], reward=0.5)
    return [
        make_group(base_model, prompt, answers, {"yes": 1.0, "no": 0.0}),
        TrajectoryGroup([merged, broken, single]),
        make_group(base_model, prompt, answers, {"yes": 0.4, "no": 0.4}),
    ]


def sampler_logprobs(sequence: TokenSequence) -> list[float]:
    return [
        lp for lp, trained in zip(sequence.logprobs, sequence.loss_mask, strict=True) if trained
    ]


def train(base_path: Path, folder: Path, groups: list[TrajectoryGroup], config: TrainConfig):  # type: ignore[no-untyped-def]
    trainer = Trainer(base_path, folder, device="cpu")
    result = trainer.train_step(groups, config)
    assert result.nothing_trained is None
    return ModelFolder(folder).read_training_signal("train", 0)


def ratios(record: dict, trajectory: Trajectory) -> list[float]:
    """exp(trainer - sampler logprob) of every trained token of the record's rollout."""
    sequences = assemble_sequences(trajectory.calls).sequences
    out = []
    for seen, sequence in zip(record["sequences"], sequences, strict=True):
        out += [
            math.exp(trainer - sampler)
            for trainer, sampler in zip(
                seen["trainer_logprobs"], sampler_logprobs(sequence), strict=True
            )
        ]
    return out


def test_a_trained_step_records_every_rollouts_signal(
    tmp_path: Path, base_path: Path, groups: list[TrajectoryGroup]
) -> None:
    trainer = Trainer(base_path, tmp_path / "model", device="cpu")
    result = trainer.train_step(groups, FAST)
    folder = ModelFolder(tmp_path / "model")
    path = folder.training_signal("train", 0)
    assert path == tmp_path / "model" / "signals" / "train" / "0000.jsonl"
    lines = path.read_text().splitlines()
    signal = folder.read_training_signal("train", 0)

    # One line per trained rollout; the equal-reward group is not trained, so not recorded.
    trained = [t for group in groups[:2] for t in group.trajectories]
    assert len(lines) == len(trained) == result.metrics["train/num_rollouts_trained"]
    assert [json.loads(line)["trajectory_id"] for line in lines] == [t.id for t in trained]
    assert not {t.id for t in groups[2].trajectories} & signal.keys()

    total = sum(assemble_sequences(t.calls).num_trainable_tokens for t in trained)
    assert total == result.metrics["train/num_trainable_tokens"]
    all_ratios = []
    for group in groups[:2]:
        advantages = group_advantages([t.reward for t in group.trajectories])
        assert advantages is not None
        for trajectory, advantage in zip(group.trajectories, advantages, strict=True):
            record = signal[trajectory.id]
            assert set(record) == {"trajectory_id", "advantage", "token_weight", "sequences"}
            assert record["advantage"] == pytest.approx(advantage, rel=1e-12)
            sequences = assemble_sequences(trajectory.calls).sequences
            tokens = sum(s.num_trainable_tokens for s in sequences)
            # One optimizer update: each rollout's tokens weigh 1 / (its tokens * rollouts).
            assert record["token_weight"] == pytest.approx(1 / (tokens * len(trained)))
            assert len(record["sequences"]) == len(sequences)
            for seen, sequence in zip(record["sequences"], sequences, strict=True):
                assert seen["call_ids"] == sequence.call_ids
                assert seen["trained_tokens"] == sequence.num_trainable_tokens
                assert len(seen["trainer_logprobs"]) == sequence.num_trainable_tokens
                assert all(math.isfinite(v) for v in seen["trainer_logprobs"])
            all_ratios += ratios(record, trajectory)
    # Merged and broken rollouts really have one and two sequences of two and one calls.
    merged, broken = groups[1].trajectories[:2]
    assert [len(s["call_ids"]) for s in signal[merged.id]["sequences"]] == [2]
    assert [len(s["call_ids"]) for s in signal[broken.id]["sequences"]] == [1, 1]
    # Lock-step: the sampler's logprobs came from the weights the trainer started from (fp32
    # both; the trainer's logprob_mismatch metric is < 1e-4 here), so every ratio is ~1.
    assert len(all_ratios) == total
    assert max(abs(r - 1) for r in all_ratios) < 1e-3
    assert result.metrics["train/logprob_mismatch"] < 1e-4
    # Written next to the trajectories; strict JSON.
    assert folder.trajectories("train", 0).is_file()
    assert all(json.loads(line, parse_constant=pytest.fail) for line in lines)


def test_a_step_that_trains_nothing_or_sft_writes_no_signal(
    tmp_path: Path, base_path: Path, groups: list[TrajectoryGroup]
) -> None:
    trainer = Trainer(base_path, tmp_path / "model", device="cpu")
    result = trainer.train_step([groups[2]], FAST)  # equal rewards
    assert result.nothing_trained is not None
    folder = ModelFolder(tmp_path / "model")
    assert folder.trajectories("train", 0).is_file()
    assert not folder.training_signal("train", 0).exists()
    assert folder.read_training_signal("train", 0) == {}
    sequence = TokenSequence([1, 2, 3, 4], [False, False, True, True], [0.0] * 4)
    trainer.train_sft(
        [SFTRecord("demo", [sequence])], SFTConfig(learning_rate=1e-4), groups=groups[:1]
    )
    assert folder.trajectories("sft", 0).is_file()
    assert not (tmp_path / "model" / "signals").exists()
    # The next step that trains writes the signal of its own rollouts only, under its step.
    trainer.train_step(groups[:1], FAST)
    assert set(folder.read_training_signal("train", 1)) == {t.id for t in groups[0].trajectories}


def test_packing_and_prefix_sharing_do_not_change_the_records(
    tmp_path: Path, base_path: Path, groups: list[TrajectoryGroup]
) -> None:
    configs = {
        "packed_shared": FAST,
        "packed": FAST.model_copy(update={"share_prefixes": False}),
        "padded": FAST.model_copy(update={"packing": False}),
        "small_batches": FAST.model_copy(update={"max_tokens_per_batch": 40}),
    }
    signals = {name: train(base_path, tmp_path / name, groups, c) for name, c in configs.items()}
    expected = signals.pop("packed_shared")
    for name, signal in signals.items():
        assert signal.keys() == expected.keys(), name
        for trajectory_id, record in signal.items():
            want = expected[trajectory_id]
            assert record["advantage"] == want["advantage"]
            assert record["token_weight"] == want["token_weight"]
            for seen, wanted in zip(record["sequences"], want["sequences"], strict=True):
                assert seen["call_ids"] == wanted["call_ids"]
                assert seen["trained_tokens"] == wanted["trained_tokens"]
                # The same logprobs up to float summation order (and the 6 digits kept).
                assert seen["trainer_logprobs"] == pytest.approx(
                    wanted["trainer_logprobs"], rel=1e-4, abs=1e-5
                ), name


def test_several_updates_record_each_chunks_weights_and_the_first_forward(
    tmp_path: Path, base_path: Path, groups: list[TrajectoryGroup]
) -> None:
    trained = [t for group in groups[:2] for t in group.trajectories]  # 7 rollouts: 4 + 3
    tokens = {t.id: assemble_sequences(t.calls).num_trainable_tokens for t in trained}
    chunks = [trained[:4], trained[4:]]  # split_rollouts(7, 2): contiguous, 4 then 3

    two = FAST.model_copy(update={"optimizer_steps_per_epoch": 2})
    signal = train(base_path, tmp_path / "two", groups, two)
    for chunk in chunks:
        for trajectory in chunk:
            weight = 1 / (tokens[trajectory.id] * len(chunk))
            assert signal[trajectory.id]["token_weight"] == pytest.approx(weight)
    # The first chunk's logprobs come from the policy that sampled (ratio 1); the second's
    # from its first forward, after the first update moved the policy: what the loss saw.
    first = [abs(r - 1) for t in chunks[0] for r in ratios(signal[t.id], t)]
    second = [abs(r - 1) for t in chunks[1] for r in ratios(signal[t.id], t)]
    assert max(first) < 1e-3
    assert sum(second) / len(second) > 0.01

    # With truncated importance sampling the trainer computes the policy before any update
    # for every micro-batch: those are the logprobs recorded, ratio 1 for every chunk.
    tis = two.model_copy(update={"truncated_importance_sampling": 2.0})
    signal = train(base_path, tmp_path / "tis", groups, tis)
    assert max(abs(r - 1) for t in trained for r in ratios(signal[t.id], t)) < 1e-3
    assert signal[trained[0].id]["token_weight"] == pytest.approx(1 / (tokens[trained[0].id] * 4))

    # Several epochs: only the first epoch's forward is recorded (later ones ran after the
    # update), so the ratios stay ~1.
    epochs = FAST.model_copy(update={"num_epochs": 3})
    signal = train(base_path, tmp_path / "epochs", groups, epochs)
    assert max(abs(r - 1) for t in trained for r in ratios(signal[t.id], t)) < 1e-3


def test_a_data_parallel_step_gathers_every_ranks_signal(
    tmp_path: Path, base_path: Path, groups: list[TrajectoryGroup]
) -> None:
    """The ranks hold different rollouts; each reports the trainer's logprobs of its own,
    and the coordinator writes the whole step's signal, as one process would."""
    config = FAST.model_copy(
        update={"optimizer_steps_per_epoch": 2, "truncated_importance_sampling": 2.0}
    )
    expected = train(base_path, tmp_path / "one", groups, config)
    world = TrainingWorld(ranks=2, devices=("cpu", "cpu"), threads_per_rank=1)
    trainer = DistributedTrainer(base_path, tmp_path / "two", world)
    try:
        result = trainer.train_step(groups, config)
    finally:
        trainer.unload()
    assert result.metrics["train/rank0/tokens"] > 0 and result.metrics["train/rank1/tokens"] > 0
    signal = ModelFolder(tmp_path / "two").read_training_signal("train", 0)
    assert list(signal) == list(expected)
    for trajectory_id, record in signal.items():
        want = expected[trajectory_id]
        assert record["advantage"] == want["advantage"]
        assert record["token_weight"] == want["token_weight"]
        for seen, wanted in zip(record["sequences"], want["sequences"], strict=True):
            assert seen["call_ids"] == wanted["call_ids"]
            assert seen["trainer_logprobs"] == pytest.approx(
                wanted["trainer_logprobs"], rel=1e-4, abs=1e-5
            )


def test_read_training_signal_skips_damaged_lines(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    folder = ModelFolder(tmp_path / "model")
    good = {"trajectory_id": "rollout-1", "advantage": 1.0, "token_weight": 0.5, "sequences": []}
    path = folder.append_training_signal("train", 3, [good])
    assert path == folder.training_signal("train", 3)
    with path.open("a") as file:
        file.write('{"trajectory_id": "cut sh\n\n[1, 2]\n{"advantage": 1.0}\n')
    folder.append_training_signal("train", 3, [{**good, "trajectory_id": "rollout-2"}])
    with caplog.at_level("WARNING"):
        signal = folder.read_training_signal("train", 3)
    assert list(signal) == ["rollout-1", "rollout-2"] and signal["rollout-1"] == good
    assert "0003.jsonl:2 is not a JSON record" in caplog.text
    assert "0003.jsonl:4 is not a JSON record" in caplog.text
    assert "without a trajectory_id" in caplog.text
    assert folder.read_training_signal("train", 4) == {}


# ---------------------------------------------------------------------- packing segments


def example(rng: random.Random, prompt: list[int], source: tuple[int, int] | None):  # type: ignore[no-untyped-def]
    completion = [rng.randrange(3, 600) for _ in range(rng.randrange(0, 6))]
    context = [rng.randrange(3, 600) for _ in range(rng.randrange(0, 3))]
    more = [rng.randrange(3, 600) for _ in range(rng.randrange(1, 4))]
    ids = prompt + completion + context + more
    mask = [False] * len(prompt) + [True] * len(completion) + [False] * len(context)
    mask += [True] * len(more)
    logprobs = [-rng.random() if trained else 0.0 for trained in mask]
    return TrainingExample(TokenSequence(ids, mask, logprobs), rng.random(), rng.random(), source)


def trained_of(example: TrainingExample) -> tuple[list[int], list[float]]:
    seq = example.sequence
    kept = [i for i, trained in enumerate(seq.loss_mask) if trained]
    return [seq.token_ids[i] for i in kept], [seq.logprobs[i] for i in kept]


def check_segments(batch: MicroBatch, examples: list[TrainingExample]) -> None:
    """The segments name the batch's examples in the order of its per-token tensors."""
    by_source = {e.source: e for e in examples}
    assert sum(count for _, count in batch.segments) == batch.num_trainable_tokens
    assert len(batch.segments) == batch.num_sequences
    offset = 0
    for source, count in batch.segments:
        ids, logprobs = trained_of(by_source[source])
        assert count == len(ids)
        assert batch.target_ids[offset : offset + count].tolist() == ids
        assert batch.sampler_logprobs[offset : offset + count].tolist() == pytest.approx(logprobs)
        assert batch.weights[offset : offset + count].tolist() == pytest.approx(
            [by_source[source].weight] * count
        )
        offset += count


def test_segments_account_for_every_trained_token_in_order() -> None:
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 600) for _ in range(n)] for n in (5, 9, 2)]
    examples = [example(rng, prompts[i % 3], (i, i % 2)) for i in range(12)]

    for batch in (
        pack_row(examples),
        pack_row(examples, share_prefixes=False),
        pack_row(examples, attn_implementation="flash_attention_2"),
        pad_rows(examples),
    ):
        assert [source for source, _ in batch.segments] == [e.source for e in examples]
        check_segments(batch, examples)

    for packing in (True, False):
        for share in (True, False):
            batches = make_micro_batches(
                examples, max_tokens=24, packing=packing, share_prefixes=share
            )
            assert len(batches) > 1
            for batch in batches:
                check_segments(batch, examples)
            # Every example with a trained token exactly once over the micro-batches.
            sources = sorted(s for b in batches for s, _ in b.segments if s is not None)
            assert sources == sorted(
                e.source for e in examples if e.sequence.num_trainable_tokens and e.source
            )

    # Without a source (e.g. a rank's padding batch) the segment says None.
    assert pack_row([TrainingExample(examples[0].sequence, 1.0, 1.0)]).segments == [
        (None, examples[0].sequence.num_trainable_tokens)
    ]
