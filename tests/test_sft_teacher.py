"""Distillation: a rollout function run with a teacher behind ``TeacherProxy``, then SFT.

The teacher is a real OpenAI-compatible server: an ``art-core`` gateway serving another
model (``tiny-random-1``), reached over HTTP exactly like a vLLM server or a hosted API.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from rollout_checks import WEATHER_TOOL

import art_core as art
from art_core.sft.data import Demonstration
from art_core.sft.render import SFTRenderer
from art_core.sft.teacher import TeacherProxy


@pytest.fixture(scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[art.LocalBackend]:
    backend = art.LocalBackend(path=tmp_path_factory.mktemp("teacher"))
    teacher = art.TrainableModel(name="big-teacher", project="t", base_model="tiny-random-1")
    student = art.TrainableModel(name="student", project="t", base_model="tiny-random")
    await teacher.register(backend)
    await student.register(backend)
    yield backend
    await backend.close()


def teacher_model(backend: art.LocalBackend, name: str = "big-teacher") -> art.Model:
    return art.Model(
        name="teacher",
        inference_base_url=backend.base_url,
        inference_api_key="any",
        inference_model_name=name,
    )


async def weather_rollout(model: art.TrainableModel, city: str) -> art.Trajectory:
    """The user's rollout: a forced tool call, its result, a short answer; reward 1 when the
    model asked for the scenario's city."""
    async with art.capture(model, metadata={"city": city}) as run:
        client = run.openai_client()
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": f"What is the weather in {city}?"}
        ]
        first = await client.chat.completions.create(
            model=run.model_name,
            messages=messages,
            tools=[WEATHER_TOOL],
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=80,  # room for every city's call: no first answer is cut
            extra_body={"metadata": {"turn": 0}},
        )
        call = first.choices[0].message.tool_calls[0]
        messages.append(first.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "sunny"})
        await client.chat.completions.create(
            model=run.model_name,
            messages=messages,
            tools=[WEATHER_TOOL],
            tool_choice="none",
            max_tokens=6,
        )
    asked = json.loads(call.function.arguments).get("city")
    return run.trajectory(reward=1.0 if asked == city else 0.0)


async def test_teacher_runs_become_sft_data_rendered_for_the_student(
    served: art.LocalBackend,
) -> None:
    teacher = teacher_model(served)
    demos = await art.teacher_trajectories(
        weather_rollout,
        teacher,
        ["Paris", "Tokyo", "Lima"],
        rollouts_per_scenario=3,
        per_group=2,
        pbar_desc=None,
    )
    assert len(demos) == 6
    assert [d.reward for d in demos[:2]] == sorted([d.reward for d in demos[:2]], reverse=True)
    for trajectory in demos:
        assert trajectory.metadata["teacher"] == "big-teacher"
        assert [c.model for c in trajectory.calls] == ["big-teacher", "big-teacher"]
        first, second = trajectory.calls
        # Recorded as text, per rollout and in order; the gateway-only fields were kept here.
        assert first.prompt_token_ids == [] and first.metadata["turn"] == 0
        assert (first.index, second.index) == (0, 1)
        assert first.response_message["tool_calls"][0]["function"]["name"] == "get_weather"
        assert second.messages[-1] == {
            "role": "tool",
            "content": "sunny",
            "tool_call_id": first.response_message["tool_calls"][0]["id"],
        }

    # The student re-renders the teacher's text in its own template: its trained tokens
    # decode to exactly what the teacher answered (a second answer cut by max_tokens is no
    # finished turn: context, not trained).
    student = art.TrainableModel(name="student", project="t", base_model="tiny-random")
    await student.register(served)
    chat = served.served(student).chat
    renderer = SFTRenderer(chat)
    record = renderer.record(Demonstration("d", demos[0]), lookup=served.store(student).get)
    assert renderer.rendered == 1
    (sequence,) = record.sequences
    trained = [t for t, m in zip(sequence.token_ids, sequence.loss_mask, strict=True) if m]
    arguments = json.loads(
        demos[0].calls[0].response_message["tool_calls"][0]["function"]["arguments"]
    )
    expected = (
        '<tool_call>\n{"name": "get_weather", "arguments": '
        + json.dumps(arguments)
        + "}\n</tool_call><|im_end|>"
    )
    second = demos[0].calls[1]
    if second.finish_reason != "length":
        expected += (second.response_message["content"] or "") + "<|im_end|>"
    assert chat.tokenizer.decode(trained, skip_special_tokens=False) == expected

    result = await student.train_sft(demos, config=art.SFTConfig(precision="fp32"))
    assert result.step == 1 and result.metrics["sft/records_rendered"] == 6


async def test_the_proxy_streams_relays_errors_and_validates(served: art.LocalBackend) -> None:
    async with TeacherProxy(teacher_model(served)) as proxy:
        model = proxy.model
        async with art.capture(model) as run:
            stream = await run.openai_client().chat.completions.create(
                model=run.model_name,
                messages=[{"role": "user", "content": "weather?"}],
                tools=[WEATHER_TOOL],
                tool_choice="required",
                max_tokens=40,
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [chunk async for chunk in stream]
        (call,) = run.calls
        streamed = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
        assert (
            streamed[0].function.arguments
            == call.response_message["tool_calls"][0]["function"]["arguments"]
        )
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0

        client = openai.AsyncOpenAI(base_url=proxy.base_url, api_key="x", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="messages"):
            await client.chat.completions.create(model="teacher", messages=[])
        with pytest.raises(RuntimeError, match="train the student on its trajectories"):
            await model.train([])
        assert await model.get_step() == 0

    async with TeacherProxy(teacher_model(served, name="no-such-model")) as proxy:
        client = openai.AsyncOpenAI(base_url=proxy.base_url, api_key="x", max_retries=0)
        with pytest.raises(openai.NotFoundError, match="no-such-model"):
            await client.chat.completions.create(
                model="x", messages=[{"role": "user", "content": "hi"}]
            )

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    gone = art.Model(name="gone", inference_base_url=f"http://127.0.0.1:{closed}/v1")
    async with TeacherProxy(gone) as proxy:
        client = openai.AsyncOpenAI(base_url=proxy.base_url, api_key="x", max_retries=0)
        with pytest.raises(openai.InternalServerError, match="did not answer"):
            await client.chat.completions.create(
                model="x", messages=[{"role": "user", "content": "hi"}]
            )
    with pytest.raises(ValueError, match="has no inference_base_url"):
        TeacherProxy(art.Model(name="nowhere"))


async def test_rollouts_may_fail_within_max_exceptions(
    served: art.LocalBackend, tmp_path: Path
) -> None:
    async def flaky(model: art.TrainableModel, city: str) -> art.Trajectory:
        if city == "Lima":
            raise RuntimeError("tool server down")
        return await weather_rollout(model, city)

    demos = await art.teacher_trajectories(
        flaky, teacher_model(served), ["Paris", "Lima"], max_exceptions=1, pbar_desc=None
    )
    assert len(demos) == 1
    with pytest.raises(art.TooManyExceptions):
        await art.teacher_trajectories(flaky, teacher_model(served), ["Lima"], pbar_desc=None)
