"""ART's hand-built rollouts: ``trajectory.messages_and_choices.append(choice)`` with the raw
``Choice`` the openai client returns (ART's examples, docs and cheat sheet), and every other
way of putting choices in the list, behave like the constructor: the next turn's request is
valid, RULER reads the run, and training matches each choice to its recorded call."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from openai.types.chat.chat_completion import Choice

import art_core as art
from art_core.matching import attach_recorded_calls
from art_core.testing.judge import StandInJudge

SYSTEM = {"role": "system", "content": "Answer in one word."}


@pytest.fixture(scope="module")
async def art_style_model(backend: art.LocalBackend) -> AsyncIterator[art.TrainableModel]:
    model = art.TrainableModel(name="art-style", project="tests", base_model="tiny-random")
    await model.register(backend)
    yield model


async def complete(model: art.TrainableModel, messages: list[dict[str, Any]], seed: int) -> Choice:
    client = model.openai_client()
    completion = await client.chat.completions.create(
        model=model.name,
        messages=messages,  # type: ignore[arg-type]
        max_completion_tokens=6,
        seed=seed,
    )
    return completion.choices[0]


def append(t: art.Trajectory, choice: Choice) -> None:
    t.messages_and_choices.append(choice)


def append_dict(t: art.Trajectory, choice: Choice) -> None:
    t.messages_and_choices.append(choice.model_dump())


def append_to_dict(t: art.Trajectory, choice: Choice) -> None:
    t.messages_and_choices.append(choice.to_dict())


def extend(t: art.Trajectory, choice: Choice) -> None:
    t.messages_and_choices.extend([choice])


def iadd(t: art.Trajectory, choice: Choice) -> None:
    t.messages_and_choices += [choice]


def insert(t: art.Trajectory, choice: Choice) -> None:
    t.messages_and_choices.insert(len(t.messages_and_choices), choice)


def assign_list(t: art.Trajectory, choice: Choice) -> None:
    t.messages_and_choices = [*t.messages_and_choices, choice]


def assign_slice(t: art.Trajectory, choice: Choice) -> None:
    t.messages_and_choices[len(t.messages_and_choices) :] = [choice]


WAYS: dict[str, Callable[[art.Trajectory, Choice], None]] = {
    f.__name__: f
    for f in (
        append,
        append_dict,
        append_to_dict,
        extend,
        iadd,
        insert,
        assign_list,
        assign_slice,
    )
}


async def play(
    model: art.TrainableModel, way: Callable[[art.Trajectory, Choice], None], turns: int, seed: int
) -> art.Trajectory:
    """ART's multi-turn rollout shape: user turn, completion on ``messages()``, add the choice."""
    trajectory = art.Trajectory(messages_and_choices=[SYSTEM], reward=0)
    for turn in range(turns):
        trajectory.messages_and_choices.append({"role": "user", "content": f"turn {turn}"})
        choice = await complete(model, trajectory.messages(), seed=seed * 10 + turn)
        way(trajectory, choice)
    return trajectory


@pytest.mark.parametrize("way", list(WAYS))
async def test_every_way_of_adding_a_choice_is_stored_and_matched(
    backend: art.LocalBackend, art_style_model: art.TrainableModel, way: str
) -> None:
    trajectory = await play(art_style_model, WAYS[way], turns=2, seed=1)
    items = trajectory.messages_and_choices
    assert all(type(item) is dict for item in items)
    assert len(trajectory.choices()) == 2
    for message in trajectory.messages():
        assert message["role"] in ("system", "user", "assistant") and "finish_reason" not in message
    # the list keeps converting after assignment and after a JSON round trip
    loaded = art.Trajectory.model_validate_json(trajectory.model_dump_json())
    loaded.messages_and_choices.append(await complete(art_style_model, loaded.messages(), 99))
    assert type(loaded.messages_and_choices[-1]) is dict
    # each choice is its recorded call: the ids the model sampled, in order
    attached = attach_recorded_calls(trajectory, backend.store(art_style_model))
    assert [c.completion_token_ids for c in attached.calls] == [
        c["token_ids"] for c in trajectory.choices()
    ]


async def test_a_wrong_item_is_refused_before_the_list_changes(
    art_style_model: art.TrainableModel,
) -> None:
    trajectory = art.Trajectory(messages_and_choices=[SYSTEM], reward=0)
    completion = await art_style_model.openai_client().chat.completions.create(
        model=art_style_model.name,
        messages=[{"role": "user", "content": "hi"}],
        max_completion_tokens=3,
    )
    with pytest.raises(TypeError, match=r"append `completion.choices\[0\]`"):
        trajectory.messages_and_choices.append(completion)
    with pytest.raises(TypeError, match="got int"):
        trajectory.messages_and_choices.extend([completion.choices[0], 42])
    with pytest.raises(ValueError, match="messages_and_choices"):
        trajectory.messages_and_choices = "not a list"  # type: ignore[assignment]
    assert trajectory.messages_and_choices == [SYSTEM]
    # a plain message dict is kept as the caller's object (ART code edits it afterwards)
    note = {"role": "user", "content": "draft"}
    trajectory.messages_and_choices.append(note)
    note["content"] = "final"
    assert trajectory.messages()[-1]["content"] == "final"
    # copies keep converting
    assert type(copy.deepcopy(trajectory).messages_and_choices) is type(
        trajectory.messages_and_choices
    )


async def test_art_style_rollouts_train_and_the_adapter_changes(
    backend: art.LocalBackend, art_style_model: art.TrainableModel
) -> None:
    step = await art_style_model.get_step()
    groups = []
    for g, way in enumerate(("append", "assign_list")):
        trajectories = [await play(art_style_model, WAYS[way], 2, seed=g * 4 + i) for i in range(4)]
        for i, trajectory in enumerate(trajectories):
            trajectory.reward = float(i % 2)  # rewards differ within each group
        groups.append(art.TrajectoryGroup(trajectories))
    result = await art_style_model.train(groups, config=art.TrainConfig(learning_rate=1e-3))
    assert result.nothing_trained is None, result.nothing_trained
    assert result.metrics["train/trajectories_without_calls"] == 0
    assert result.metrics["train/num_trainable_tokens"] > 0
    assert result.step == step + 1 == await art_style_model.get_step()
    served = await art_style_model.openai_client().chat.completions.create(
        model=art_style_model.name, messages=[SYSTEM], max_completion_tokens=2
    )
    assert served.choices[0].model_extra["adapter_step"] == step + 1  # type: ignore[index]


async def test_ruler_reads_art_style_trajectories(
    art_style_model: art.TrainableModel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ART_CORE_CACHE_DIR", str(tmp_path / "cache"))
    group = art.TrajectoryGroup([await play(art_style_model, append, 2, seed=i) for i in range(3)])
    with StandInJudge() as judge:
        scored = await art.ruler_score_group(
            group, "judge", judge_base_url=judge.base_url, judge_api_key="x"
        )
        [request] = judge.requests
    assert scored is group
    assert all("ruler_score" in t.metrics for t in group)
    # the judge saw the model's answers as assistant turns
    prompt = request["messages"][-1]["content"]
    for trajectory in group:
        assert trajectory.messages()[-1]["content"] in prompt


async def test_additional_histories_are_matched_too(
    backend: art.LocalBackend, art_style_model: art.TrainableModel
) -> None:
    main = await play(art_style_model, append, 2, seed=40)
    side = await play(art_style_model, extend, 1, seed=41)  # e.g. a sub-agent's conversation
    trajectory = art.Trajectory(
        messages_and_choices=main.messages_and_choices,
        additional_histories=[art.History(messages_and_choices=side.messages_and_choices)],
    )
    attached = attach_recorded_calls(trajectory, backend.store(art_style_model))
    expected = [c["token_ids"] for c in [*main.choices(), *side.choices()]]
    assert [c.completion_token_ids for c in attached.calls] == expected
    stranger = {
        "index": 0,
        "message": {"role": "assistant", "content": "never served"},
        "finish_reason": "stop",
        "token_ids": [1, 2, 3],
    }
    trajectory.additional_histories[0].messages_and_choices.append(stranger)
    with pytest.raises(ValueError, match=r"additional_histories\[0\]\.messages_and_choices\[3\]"):
        attach_recorded_calls(trajectory, backend.store(art_style_model))
