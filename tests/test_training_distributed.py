"""Data-parallel training (issue 18): N ranks on gloo train exactly like one process, a rank
killed mid-step fails only that step, FSDP2 shards the base, and the backend does not care."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from distributed_support import (
    EVERYTHING,
    FAST,
    adapter,
    assert_same_metrics,
    assert_same_tensors,
    make_group,
    optimizer_state,
    random_groups,
)
from transformers import AutoModelForCausalLM, AutoTokenizer

import art_core as art
from art_core.embedded import resolve_base_model
from art_core.model_folder import ModelFolder
from art_core.training import Trainer
from art_core.training.distributed import DistributedTrainer, TrainingWorld, TrainingWorldError
from art_core.training.distributed.balance import split_by_tokens
from art_core.training.distributed.messages import decode_examples, encode_examples
from art_core.training.packing import TrainingExample
from art_core.training.sequences import TokenSequence

TWO_CPU_RANKS = TrainingWorld(ranks=2, devices=("cpu", "cpu"), threads_per_rank=1)


@pytest.fixture(scope="module")
def base_path() -> Path:
    return resolve_base_model("tiny-random")


@pytest.fixture(scope="module")
def base_model(base_path: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(base_path).eval()


@pytest.fixture(scope="module")
def yes_no(base_path: Path, base_model: Any) -> list[art.TrajectoryGroup]:
    """One group, rollouts of equal length."""
    tokenizer = AutoTokenizer.from_pretrained(base_path)
    messages = [{"role": "user", "content": "Say yes or no."}]
    prompt = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"])
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    yes = [*tokenizer("yes", add_special_tokens=False)["input_ids"], end]
    no = [*tokenizer("no", add_special_tokens=False)["input_ids"], end]
    return [make_group(base_model, prompt, [yes, yes, yes, no, no, no], [1, 1, 1, 0, 0, 0])]


@pytest.fixture(scope="module")
def uneven(base_model: Any) -> list[art.TrajectoryGroup]:
    """Groups of very different lengths: 2 to 150 completion tokens, prompts of 3 to 60."""
    return random_groups(
        base_model,
        seed=7,
        lengths=[[150, 2, 3, 90], [5, 60, 4, 7], [2, 2, 120]],
        prompt_lengths=[60, 3, 25],
    )


def test_two_ranks_train_exactly_like_one(
    tmp_path: Path, base_path: Path, yes_no: list, uneven: list
) -> None:
    one = Trainer(base_path, tmp_path / "one", device="cpu")
    two = DistributedTrainer(base_path, tmp_path / "two", TWO_CPU_RANKS)
    events: list[dict] = []
    try:
        # One optimizer update per step: the same update to 1e-5. Then four updates in one
        # call at a learning rate of 2e-2, on top of the first two steps: each update feeds
        # the float noise of the last into the next forward, so it grows to ~1e-5..1e-4.
        for groups, config, rel in (
            (yes_no, FAST, 1e-5),
            (uneven, FAST, 1e-5),
            (uneven, EVERYTHING, 1e-4),
        ):
            expected = one.train_step(groups, config)
            actual = two.train_step(groups, config, on_progress=events.append)
            assert actual.step == expected.step
            assert_same_tensors(adapter(expected), adapter(actual), rel=rel)
            assert_same_tensors(optimizer_state(expected), optimizer_state(actual), rel=rel)
            assert_same_metrics(expected, actual)
            metrics = actual.metrics
            assert metrics["train/world_size"] == 2
            # Both ranks worked, on shares balanced by tokens run.
            assert metrics["train/rank0/tokens"] > 0 and metrics["train/rank1/tokens"] > 0
            assert metrics["train/rank0/tokens"] + metrics["train/rank1/tokens"] > 0
            assert metrics["train/allreduce_seconds"] >= 0
        assert metrics["train/rank_token_imbalance"] < 1.5
        ranks = two.ranks
        assert [r["rank"] for r in ranks] == [0, 1] and ranks[0]["pid"] != ranks[1]["pid"]
        assert all(r["pid"] != os.getpid() and r["threads"] == 1 for r in ranks)
    finally:
        two.unload()
    assert two.ranks == []
    # Progress: every rank's micro-batches, one optimizer-step record per update.
    micro = [e for e in events if e["event"] == "micro_batch"]
    assert {e["rank"] for e in micro} == {0, 1}
    last_step = [e for e in events if e["step"] == 3]
    assert [e["micro_batch"] for e in last_step if e["event"] == "micro_batch"] == list(
        range(1, 1 + last_step[0]["num_micro_batches"])
    )
    updates = [e for e in last_step if e["event"] == "optimizer_step"]
    assert len(updates) == 4 and all("allreduce_seconds" in e for e in updates)
    # The history holds the same records, plus the world's.
    history = ModelFolder(tmp_path / "two").read_history()
    assert [r["checkpoint_step"] for r in history] == [1, 2, 3]
    assert "train/rank1/seconds" in history[-1]


def test_a_world_of_one_runs_the_same_micro_batches_as_the_in_process_trainer(
    tmp_path: Path, base_path: Path, uneven: list
) -> None:
    expected = Trainer(base_path, tmp_path / "one", device="cpu").train_step(uneven, EVERYTHING)
    world = TrainingWorld(ranks=1, devices=("cpu",), threads_per_rank=1)
    trainer = DistributedTrainer(base_path, tmp_path / "world", world)
    try:
        actual = trainer.train_step(uneven, EVERYTHING)
    finally:
        trainer.unload()
    assert actual.metrics["train/num_micro_batches"] == expected.metrics["train/num_micro_batches"]
    assert_same_tensors(adapter(expected), adapter(actual), rel=1e-6)
    assert_same_metrics(expected, actual)


def wait_until_exited(pid: int, limit_s: float = 120.0) -> None:
    """Wait until process ``pid`` has exited: a zombie whose threads are all gone (only then
    can its parent reap it), or reaped already."""
    deadline = time.monotonic() + limit_s
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            threads = os.listdir(f"/proc/{pid}/task")
        except FileNotFoundError:
            return
        if state == "Z" and threads == [str(pid)]:
            return
        assert time.monotonic() < deadline, f"process {pid} still running"
        time.sleep(0.02)


def test_a_rank_killed_mid_step_fails_only_that_step_and_resume_continues(
    tmp_path: Path, base_path: Path, yes_no: list, uneven: list
) -> None:
    # Small micro-batches: each rank runs several, so the kill lands while ranks compute.
    config = FAST.model_copy(update={"max_tokens_per_batch": 32})
    batches = [yes_no, uneven, yes_no, uneven]
    straight = Trainer(base_path, tmp_path / "straight", device="cpu")
    expected = [straight.train_step(groups, config) for groups in batches]

    trainer = DistributedTrainer(base_path, tmp_path / "model", TWO_CPU_RANKS)
    try:
        assert trainer.train_step(batches[0], config).step == 1
        victim = trainer.ranks[1]["pid"]

        def kill_rank_1(event: dict) -> None:
            # The coordinator relays this before it can commit anything: the step is mid-way.
            if event["event"] == "micro_batch" and event["rank"] == 1:
                os.kill(victim, signal.SIGKILL)

        with pytest.raises(TrainingWorldError) as failure:
            trainer.train_step(batches[1], config, on_progress=kill_rank_1)
        message = str(failure.value)
        assert f"rank 1 (pid {victim}) was killed by signal SIGKILL" in message
        assert "checkpoint 1 stays in force" in message
        folder = ModelFolder(tmp_path / "model")
        # No half-written checkpoint, not even a hidden staging folder; history unchanged.
        assert sorted(p.name for p in folder.checkpoints.iterdir()) == ["0001"]
        assert trainer.latest_step() == 1 and len(folder.read_history()) == 1
        assert trainer.ranks == []

        # The next step re-forms the world (new processes) and trains from checkpoint 1.
        second = trainer.train_step(batches[1], config)
        assert second.step == 2 and victim not in [r["pid"] for r in trainer.ranks]
        assert_same_tensors(adapter(expected[1]), adapter(second))

        # A rank that dies between steps is replaced before the next one, which then works.
        idle = trainer.ranks[0]["pid"]
        os.kill(idle, signal.SIGKILL)
        wait_until_exited(idle)
        third = trainer.train_step(batches[2], config)
        assert third.step == 3 and idle not in [r["pid"] for r in trainer.ranks]
        assert_same_tensors(adapter(expected[2]), adapter(third))
    finally:
        trainer.unload()

    # A new coordinator with new ranks resumes at step 3 with the same optimizer state.
    resumed = DistributedTrainer(base_path, tmp_path / "model", TWO_CPU_RANKS)
    try:
        assert resumed.latest_step() == 3
        fourth = resumed.train_step(batches[3], config)
    finally:
        resumed.unload()
    assert fourth.step == 4
    assert_same_tensors(adapter(expected[3]), adapter(fourth))
    assert_same_tensors(optimizer_state(expected[3]), optimizer_state(fourth))


def test_fsdp2_shards_the_base_across_ranks_and_trains_like_one(
    tmp_path: Path, base_path: Path, yes_no: list, uneven: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    sharded = TWO_CPU_RANKS.model_copy(update={"shard_base_model": True})
    # Sharded ranks compute the model's own logits (the root module gathers the output layer
    # in its forward); the reference does too, rather than run it fused with the softmax
    # (``training.output_head``), whose rounding differs by ~1e-7 and, through four Adam
    # updates, by ~1e-4 in the moments.
    monkeypatch.setattr(Trainer, "_output_head", lambda self, config: None)
    straight = Trainer(base_path, tmp_path / "one", device="cpu")
    expected = [straight.train_step(groups, EVERYTHING) for groups in (uneven, yes_no)]
    results = []
    for groups in (uneven, yes_no):
        # A new world per step: the second resumes a sharded optimizer from checkpoint 1.
        trainer = DistributedTrainer(base_path, tmp_path / "sharded", sharded)
        try:
            results.append(trainer.train_step(groups, EVERYTHING))
        finally:
            trainer.unload()
    for want, got in zip(expected, results, strict=True):
        # Four optimizer updates per call: float noise compounds to ~1e-5 (see the first test).
        assert_same_tensors(adapter(want), adapter(got), rel=1e-4)
        assert_same_tensors(optimizer_state(want), optimizer_state(got), rel=1e-4)
        assert_same_metrics(want, got)
    # Same checkpoint files as without sharding: the in-process trainer resumes from them.
    state = json.loads((Path(results[1].checkpoint_path) / "trainer_state.json").read_text())
    assert state["world"]["shard_base_model"] is True
    assert Trainer(base_path, tmp_path / "sharded", device="cpu").load() == 2


async def test_local_backend_trains_on_a_world_and_serves_the_new_adapter(
    tmp_path: Path, yes_no: list
) -> None:
    async with art.LocalBackend(path=tmp_path, training_world=TWO_CPU_RANKS) as backend:
        model = art.TrainableModel(name="dp", project="tests", base_model="tiny-random")
        await model.register(backend)
        result = await model.train(yes_no, config=FAST)
        assert result.step == 1 and result.metrics["train/world_size"] == 2
        assert await model.get_step() == 1
        current = backend.engine(model).current_adapter
        assert current is not None and current.step == 1  # hot-swapped
        trainer = backend._models["dp"].trainer
        assert trainer is not None and len(trainer.ranks) == 2  # type: ignore[attr-defined]
    assert trainer.ranks == []  # type: ignore[attr-defined]  # closed with the backend


def test_a_world_that_cannot_start_says_which_rank_and_why(tmp_path: Path, yes_no: list) -> None:
    broken = tmp_path / "broken-base"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    trainer = DistributedTrainer(broken, tmp_path / "model", TWO_CPU_RANKS)
    with pytest.raises(TrainingWorldError, match=r"did not start: rank 0 raised OSError") as error:
        trainer.train_step(yes_no, FAST)
    assert "not a valid JSON file" in str(error.value) and "rank 1 raised" in str(error.value)
    assert trainer.ranks == [] and trainer.latest_step() == 0
    assert not (tmp_path / "model" / "checkpoints").exists()
    # The full traceback is in each rank's log.
    assert "Traceback" in (tmp_path / "model" / "logs" / "train-rank0.log").read_text()


def test_bad_worlds_are_refused_before_anything_starts() -> None:
    with pytest.raises(ValueError, match="2 devices for 3 ranks"):
        TrainingWorld(ranks=3, devices=("cpu", "cpu"))
    with pytest.raises(ValueError, match="one kind of device"):
        TrainingWorld(ranks=2, devices=("cpu", "cuda:0"))
    with pytest.raises(ValueError, match="cannot share one GPU"):
        TrainingWorld(ranks=2, devices=("cuda:0", "cuda:0"))
    with pytest.raises(ValueError, match="not a torch device"):
        TrainingWorld(ranks=1, devices=("tpu-7",))
    with pytest.raises(ValueError, match="nccl backend needs CUDA"):
        TrainingWorld(ranks=2, devices=("cpu", "cpu"), backend="nccl")
    with pytest.raises(ValueError):
        TrainingWorld(ranks=0)
    with pytest.raises(ValueError):
        TrainingWorld(ranks=2, launcher="mpi")  # type: ignore[arg-type]
    world = TrainingWorld(ranks=2, devices=("cuda:0", "cuda:1"))
    assert world.collective_backend() == "nccl" and world.rank_devices() == ["cuda:0", "cuda:1"]
    assert TrainingWorld(ranks=2, devices=("cpu", "cpu")).collective_backend() == "gloo"


def example(prompt: list[int], completion: int, weight: float = 0.1) -> TrainingExample:
    ids = prompt + [7] * completion
    mask = [False] * len(prompt) + [True] * completion
    return TrainingExample(TokenSequence(ids, mask, [-0.5] * len(ids)), 1.0, weight)


def test_the_token_split_balances_ranks_keeps_order_and_weights() -> None:
    examples = [example([1, 2], n) for n in (120, 3, 40, 2, 75, 9, 60)] + [example([5], 0)]
    parts = split_by_tokens(examples, 3)
    loads = [sum(len(e) for e in part) for part in parts]
    # Longest first onto the least-loaded rank: within the longest example of the best split.
    assert max(loads) - min(loads) <= 122 and max(loads) <= 126
    # Every trained example exactly once, in input order on each rank, weights untouched;
    # the untrained one is dropped (packing would drop it).
    flat = sorted(id(e) for part in parts for e in part)
    assert flat == sorted(id(e) for e in examples[:-1])
    for part in parts:
        assert [examples.index(e) for e in part] == sorted(examples.index(e) for e in part)
    assert split_by_tokens(examples, 1) == [examples[:-1]]
    # Rollouts sharing a long prompt stay together while that is cheaper: the prompt runs
    # once per rank that holds them.
    long_prompt = list(range(100, 300))
    group = [example(long_prompt, 5) for _ in range(4)]
    other = [example([9, 9], 200)]
    assert [len(part) for part in split_by_tokens(group + other, 2)] == [4, 1]


def test_examples_cross_the_process_boundary_bit_exact_as_json() -> None:
    weight = 1.0 / 3.0 / 7.0
    original = [example([1, 2, 3], 4, weight=weight)]
    original[0].sequence.logprobs[-1] = -0.123456789012345678
    wire = json.loads(json.dumps(encode_examples(original)))
    [back] = decode_examples(wire)
    assert back.weight == weight and back.sequence == original[0].sequence
