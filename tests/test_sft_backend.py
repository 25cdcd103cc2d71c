"""``model.train_sft`` through ``LocalBackend``: learning, token-exactness, bad data.

Acceptance: SFT on 50 traces of the digits task (``test_training_learning``) takes
tiny-random's reward from <= 0.2 to >= 0.8 in a few epochs, and GRPO steps continue from
that checkpoint; for trajectories recorded through the gateway, the SFT sequences and masks
are GRPO's.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from rollout_checks import three_turn_rollout
from test_training_learning import CONFIG, PROMPTS, gather, mean_reward

import art_core as art
from art_core.matching import attach_recorded_calls
from art_core.model_folder import ModelFolder
from art_core.sft.data import Demonstration
from art_core.sft.render import SFTRenderer
from art_core.training.batch import prepare_batch

# The digits task's right answers; "a number between 1 and 9" gets a random digit.
ANSWERS = ["84", "366", None, "2000"]


def digits_traces(count: int, seed: int = 0) -> list[dict]:
    """``count`` OpenAI chat records answering the digits task's prompts in digits."""
    rng = random.Random(seed)
    records = []
    for i in range(count):
        prompt = i % len(PROMPTS)
        answer = ANSWERS[prompt] or str(rng.randint(1, 9))
        records.append(
            {
                "messages": [
                    {"role": "user", "content": PROMPTS[prompt]},
                    {"role": "assistant", "content": answer},
                ]
            }
        )
    return records


async def test_sft_on_50_traces_teaches_digits_then_grpo_continues(tmp_path: Path) -> None:
    data = tmp_path / "digits.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in digits_traces(50)))
    async with art.LocalBackend(path=tmp_path / "art") as backend:
        model = art.TrainableModel(name="digits", project="sft", base_model="tiny-random")
        await model.register(backend)
        before = mean_reward(await gather(model, 0))
        assert before <= 0.2, f"the task must start hard: mean reward {before:.3f}"

        result = await model.train_sft(
            str(data),
            config=art.SFTConfig(
                learning_rate=1e-2,
                epochs=5,
                batch_size=8,
                lora_target_modules=CONFIG.lora_target_modules,  # the GRPO config's LoRA shape
                precision="fp32",
            ),
        )
        assert result.step == 1 == await model.get_step()
        assert result.metrics["sft/records_rendered"] == 50
        assert result.metrics["sft/optimizer_steps"] == 5 * 7
        groups = await gather(model, 1)
        # The SFT adapter is served right after train_sft returns.
        assert {c.adapter_step for g in groups for t in g for c in t.calls} == {1}
        after = mean_reward(groups)
        assert after >= 0.8, f"mean reward {before:.3f} -> {after:.3f} after SFT"

        # GRPO steps continue from the SFT checkpoint, on the same adapter (and optimizer
        # state), at a learning rate for a policy that already succeeds (the digits test's
        # 3e-2 is for one that never does).
        rewards = [after]
        for step in (2, 3):
            trained = await model.train(
                groups, config=CONFIG.model_copy(update={"learning_rate": 3e-3})
            )
            assert trained.step == step
            groups = await gather(model, step)
            assert {c.adapter_step for g in groups for t in g for c in t.calls} == {step}
            rewards.append(mean_reward(groups))
        print(f"\ndigits reward: base {before:.2f}, then " + " ".join(f"{r:.2f}" for r in rewards))
        assert min(rewards) >= 0.8

    folder = ModelFolder.of(tmp_path / "art", "sft", "digits")
    assert [(r["split"], r["step"], r["checkpoint_step"]) for r in folder.read_history()] == [
        ("sft", 0, 1),
        ("train", 1, 2),
        ("train", 2, 3),
    ]
    (logged,) = folder.read_trajectories("sft", 0)
    assert len(logged.trajectories) == 50


async def test_recorded_trajectories_train_on_grpo_sequences(tmp_path: Path) -> None:
    """Token-exact: the SFT sequences and masks of recorded rollouts are GRPO's, whether the
    trajectory holds the calls (``run.trajectory()``) or the gateway's choices (ART-style)."""
    async with art.LocalBackend(path=tmp_path) as backend:
        model = art.TrainableModel(name="exact", project="sft", base_model="tiny-random")
        await model.register(backend)
        rollouts = [await three_turn_rollout(model, i) for i in range(2)]
        trajectories = [trajectory for trajectory, _ in rollouts]
        store = backend.store(model)

        grpo = prepare_batch([art.TrajectoryGroup(trajectories)], scale_rewards=False)
        renderer = SFTRenderer(backend.served(model).chat)
        records = renderer.records(
            [Demonstration(f"r{i}", t) for i, t in enumerate(trajectories)], lookup=store.get
        )
        assert renderer.token_exact == 2 and renderer.rendered == 0
        for rollout, record in zip(grpo.rollouts, records, strict=True):
            assert [(s.token_ids, s.loss_mask) for s in record.sequences] == [
                (s.token_ids, s.loss_mask) for s in rollout.sequences
            ]
            assert len(record.sequences) == 1  # three calls merged into one sequence

        # The same rollout as ART-style messages and the gateway's choices.
        (first_messages,) = {json.dumps(c.messages) for c in trajectories[0].calls[:1]}
        responses = rollouts[0][1]
        calls = trajectories[0].calls
        hand_built = art.Trajectory(
            messages_and_choices=[
                *json.loads(first_messages),
                responses[0].choices[0],
                *calls[1].messages[len(calls[0].messages) + 1 :],
                responses[1].choices[0],
                *calls[2].messages[len(calls[1].messages) + 1 :],
                responses[2].choices[0],
            ],
            tools=calls[0].tools,
        )
        grpo_view = attach_recorded_calls(hand_built, store)
        (record,) = renderer.records([Demonstration("hand", hand_built)], lookup=store.get)
        assert [(s.token_ids, s.loss_mask) for s in record.sequences] == [
            (s.token_ids, s.loss_mask)
            for s in prepare_batch(
                [art.TrajectoryGroup([grpo_view, grpo_view.model_copy(update={"reward": 1.0})])]
            )
            .rollouts[0]
            .sequences
        ]

        result = await model.train_sft(trajectories, config=art.SFTConfig(precision="fp32"))
        assert result.metrics["sft/records_token_exact"] == 2
        assert result.metrics["sft/num_trainable_tokens"] == sum(
            r.num_trainable_tokens for r in grpo.rollouts
        )


async def test_bad_data_names_the_record_and_trains_nothing(tmp_path: Path) -> None:
    async with art.LocalBackend(path=tmp_path) as backend:
        model = art.TrainableModel(name="bad", project="sft", base_model="tiny-random")
        await model.register(backend)
        good = digits_traces(3)
        no_answer = {"messages": [{"role": "user", "content": "hello?"}]}
        with pytest.raises(ValueError, match=r"data\[3\]: no assistant turn to train on"):
            await model.train_sft([*good, no_answer])
        unknown_tool = {
            "messages": [
                {"role": "user", "content": "pear?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c",
                            "type": "function",
                            "function": {"name": "get_price", "arguments": "{}"},
                        }
                    ],
                },
            ]
        }
        with pytest.raises(ValueError, match=r"data\[0\]: messages\[1\] calls tool 'get_price'"):
            await model.train_sft([unknown_tool, *good])
        long = tmp_path / "long.jsonl"
        long.write_text(
            json.dumps(good[0])
            + "\n"
            + json.dumps(
                {
                    "messages": [
                        {"role": "user", "content": "count: " + "one two " * 1500},
                        {"role": "assistant", "content": "3000"},
                    ]
                }
            )
            + "\n"
        )
        with pytest.raises(
            ValueError, match=r"long\.jsonl:2: \d+ tokens, over the model's context"
        ):
            await model.train_sft(long)
        with pytest.raises(TypeError, match="not SFTConfig fields: num_epochs"):
            await backend.train_sft(model, good, num_epochs=2)
        with pytest.raises(ValueError, match="make 2 steps, but 3 rates were given"):
            await model.train_sft(good, config=art.SFTConfig(learning_rate=[1e-3] * 3))

        # Nothing was trained, and the model still serves.
        assert await model.get_step() == 0
        assert not ModelFolder.of(tmp_path, "sft", "bad").history.exists()
        reply = await model.openai_client().chat.completions.create(
            model=model.name, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        assert reply.choices[0].message is not None
        # Keyword settings, ART-style, on the backend.
        result = await backend.train_sft(model, good, epochs=2, precision="fp32")
        assert result.step == 1 and result.metrics["sft/epochs"] == 2


async def test_sft_between_data_parallel_grpo_steps(tmp_path: Path) -> None:
    """With a ``TrainingWorld``, SFT runs in the backend's process; the ranks pick its
    checkpoint up at their next GRPO step."""
    from art_core.training.distributed import TrainingWorld

    world = TrainingWorld(ranks=2, devices=("cpu", "cpu"), threads_per_rank=1)
    grpo = art.TrainConfig(learning_rate=1e-3, precision="fp32")
    async with art.LocalBackend(path=tmp_path, training_world=world) as backend:
        model = art.TrainableModel(name="dp-sft", project="sft", base_model="tiny-random")
        await model.register(backend)

        async def group() -> art.TrajectoryGroup:
            return art.TrajectoryGroup([(await three_turn_rollout(model, i))[0] for i in range(2)])

        first = await model.train([await group()], config=grpo)
        assert first.step == 1 and first.metrics["train/world_size"] == 2
        sft = await model.train_sft(digits_traces(4), config=art.SFTConfig(precision="fp32"))
        assert sft.step == 2
        served = await group()
        assert {c.adapter_step for t in served for c in t.calls} == {2}
        third = await model.train([served], config=grpo)
        assert third.step == 3 and third.metrics["train/world_size"] == 2
