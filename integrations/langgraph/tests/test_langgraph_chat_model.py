"""The chat model outside graphs: routing at call time, LangChain's runnable API, errors,
and the ``wrap_rollout`` contract.
"""

from __future__ import annotations

import asyncio
from typing import Any

import art_langgraph
import pytest
from art_langgraph.metadata import call_metadata, node_path
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_openai import ChatOpenAI
from langgraph_support import TOOLS, tool_names

import art_core as art

LLM = art_langgraph.init_chat_model(max_tokens=6)


def test_it_is_a_real_langchain_chat_model() -> None:
    assert isinstance(LLM, ChatOpenAI) and isinstance(LLM, BaseChatModel)
    assert LLM.use_responses_api is False and LLM.stream_usage is True


async def test_one_model_object_serves_concurrent_rollouts(
    langgraph_model: art.TrainableModel,
) -> None:
    async def one(i: int) -> tuple[art.Trajectory, list[Any]]:
        async with art.capture(langgraph_model) as run:
            answers: list[Any] = []
            for turn in range(2):
                message = await LLM.ainvoke(f"rollout {i} turn {turn}")
                answers.append(message.content)
        return run.trajectory(), answers

    results = await asyncio.gather(*(one(i) for i in range(8)))
    for i, (trajectory, answers) in enumerate(results):
        assert [c.messages[0]["content"] for c in trajectory.calls] == [
            f"rollout {i} turn 0",
            f"rollout {i} turn 1",
        ]
        assert [c.response_message["content"] for c in trajectory.calls] == answers
        assert all(c.model == langgraph_model.name for c in trajectory.calls)


async def test_sync_invoke_and_stream_in_a_thread_follow_the_rollout(
    langgraph_model: art.TrainableModel,
) -> None:
    def sync_work() -> tuple[AIMessage, str]:
        message = LLM.invoke("sync call")
        text = "".join(str(chunk.content) for chunk in LLM.stream("sync stream"))
        return message, text

    async with art.capture(langgraph_model) as run:
        # asyncio.to_thread copies the context, as LangGraph's thread pools do
        message, text = await asyncio.to_thread(sync_work)
    invoke_call, stream_call = run.trajectory().calls
    assert invoke_call.response_message["content"] == message.content
    assert stream_call.messages[0]["content"] == "sync stream"
    assert stream_call.response_message["content"] == text


async def test_astream_chunks_add_up_to_the_recorded_call(
    langgraph_model: art.TrainableModel,
) -> None:
    async with art.capture(langgraph_model) as run:
        chunks = [
            chunk
            async for chunk in LLM.astream("tell me", config={"metadata": {"agent": "teller"}})
        ]
    [call] = run.trajectory().calls
    total = chunks[0]
    for chunk in chunks[1:]:
        total = total + chunk
    assert isinstance(total, AIMessageChunk)
    assert total.content == call.response_message["content"]
    assert total.usage_metadata is not None
    assert total.usage_metadata["output_tokens"] == len(call.completion_token_ids)
    assert call.metadata["agent"] == "teller"


async def test_with_retry_with_config_and_bind_tools_compose(
    langgraph_model: art.TrainableModel,
) -> None:
    runnable = (
        LLM.bind_tools(TOOLS, tool_choice="lookup_weather", strict=True, max_tokens=64)
        .with_retry(stop_after_attempt=2)
        .with_config(metadata={"agent": "forecaster"}, tags=["forecast"])
    )
    async with art.capture(langgraph_model) as run:
        message = await runnable.ainvoke("weather?")
    [call] = run.trajectory().calls
    assert message.tool_calls[0]["name"] == "lookup_weather"
    assert tool_names(call) == ["lookup_weather"]
    assert call.metadata["agent"] == "forecaster" and "langchain_run_id" in call.metadata


async def test_a_pinned_step_name_is_recorded_in_the_rollout(
    langgraph_model: art.TrainableModel,
) -> None:
    pinned = art_langgraph.init_chat_model(f"{langgraph_model.name}@0", max_tokens=4)
    async with art.capture(langgraph_model) as run:
        await pinned.ainvoke("hi")
    [call] = run.trajectory().calls
    assert call.adapter_step == 0 and call.request_params["model"] == f"{langgraph_model.name}@0"


async def test_outside_a_rollout_calls_go_to_the_plain_url_and_no_rollout_records_them(
    backend: art.LocalBackend, langgraph_model: art.TrainableModel
) -> None:
    bound = art_langgraph.init_chat_model(langgraph_model, max_tokens=4)
    opened = asyncio.Event()
    release = asyncio.Event()

    async def open_rollout() -> art.Trajectory:
        async with art.capture(langgraph_model) as run:
            opened.set()
            await release.wait()
        return run.trajectory()

    concurrent = asyncio.ensure_future(open_rollout())
    await opened.wait()
    message = await bound.ainvoke("outside any rollout")  # this task has no rollout
    release.set()
    assert isinstance(message, AIMessage)
    assert (await concurrent).calls == []
    [unscoped] = [
        c
        for c in backend.store(langgraph_model).recent_unscoped()
        if c.messages[0]["content"] == "outside any rollout"
    ]
    assert unscoped.rollout_id is None
    # the same object inside a rollout of its model is recorded there
    async with art.capture(langgraph_model) as run:
        await bound.ainvoke("inside")
    assert [c.messages[0]["content"] for c in run.trajectory().calls] == ["inside"]


async def test_a_rollout_following_model_outside_a_rollout_says_what_to_do() -> None:
    with pytest.raises(RuntimeError, match="outside one"):
        await LLM.ainvoke("hi")


async def test_a_chat_model_of_another_model_is_not_recorded_in_the_rollout(
    backend: art.LocalBackend, langgraph_model: art.TrainableModel
) -> None:
    # e.g. a frozen judge served elsewhere: its calls are not samples of the trained policy
    judge = art.Model(
        name="judge",
        inference_base_url=langgraph_model.inference_base_url,
        inference_api_key=langgraph_model.inference_api_key,
        inference_model_name=f"{langgraph_model.name}@0",
    )
    judge_llm = art_langgraph.init_chat_model(judge, max_tokens=4)
    async with art.capture(langgraph_model) as run:
        await judge_llm.ainvoke("judge this")
        await LLM.ainvoke("policy")
    assert [c.messages[0]["content"] for c in run.trajectory().calls] == ["policy"]


def test_bad_arguments_are_rejected_clearly() -> None:
    with pytest.raises(ValueError, match="model_provider"):
        art_langgraph.init_chat_model(model_provider="anthropic")
    with pytest.raises(ValueError, match="first argument"):
        art_langgraph.init_chat_model(model_name="x")
    with pytest.raises(TypeError, match="art_core Model"):
        art_langgraph.init_chat_model(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Responses API"):
        art_langgraph.init_chat_model(use_responses_api=True)


def test_call_metadata_keeps_graph_and_user_keys_only() -> None:
    metadata = call_metadata(
        {
            "langgraph_node": "draft",
            "langgraph_checkpoint_ns": "research:1|draft:2",
            "checkpoint_ns": "research:1|draft:2",
            "__pregel_task_id": "t",
            "ls_provider": "openai",
            "lc_versions": {"langchain-core": "1"},
            "agent": "planner",
            "not_json": object(),
        },
        run_id="r1",
    )
    assert metadata == {
        "langgraph_node": "draft",
        "langgraph_checkpoint_ns": "research:1|draft:2",
        "langgraph_node_path": ["research", "draft"],
        "agent": "planner",
        "langchain_run_id": "r1",
    }
    assert node_path("") == []


# ------------------------------------------------------------------------------ wrap_rollout
async def test_wrap_rollout_turns_each_outcome_into_a_trajectory(
    langgraph_model: art.TrainableModel,
) -> None:
    async def returns(outcome: Any) -> Any:
        await LLM.ainvoke("go")
        return outcome

    rollout = art_langgraph.wrap_rollout(langgraph_model, returns, metadata={"task": "t1"})
    as_float, as_none, as_bool = await asyncio.gather(rollout(0.5), rollout(None), rollout(True))
    assert (as_float.reward, as_none.reward, as_bool.reward) == (0.5, 0.0, 1.0)
    built = await rollout(art.Trajectory(reward=2.0, metrics={"turns": 1}, metadata={"k": "v"}))
    assert built.reward == 2.0 and built.metrics == {"turns": 1}
    assert built.metadata == {"task": "t1", "k": "v"}
    for trajectory in (as_float, as_none, as_bool, built):
        [call] = trajectory.calls
        assert call.rollout_id == trajectory.id and trajectory.end_time is not None
    assert len({t.id for t in (as_float, as_none, as_bool, built)}) == 4
    with pytest.raises(TypeError, match="must return a reward"):
        await rollout("not a reward")


async def test_wrap_rollout_seeds_each_rollout_of_its_own_and_replays_them(
    langgraph_model: art.TrainableModel,
) -> None:
    async def answers() -> float:
        await LLM.ainvoke("Tell me a story.")
        return 1.0

    base = art.RolloutSampling(seed=11, temperature=1.0)

    async def group() -> list[art.Trajectory]:
        rollout = art_langgraph.wrap_rollout(langgraph_model, answers, sampling=base)
        return list(await asyncio.gather(*(rollout() for _ in range(3))))

    first, again = await group(), await group()
    seeds = [t.calls[0].request_params["rollout_sampling"]["rollout_seed"] for t in first]
    assert seeds == [base.for_run(k).seed for k in range(3)] and len(set(seeds)) == 3
    tokens = [t.calls[0].completion_token_ids for t in first]
    assert len({tuple(ids) for ids in tokens}) > 1  # the rollouts of a group differ
    assert [t.calls[0].completion_token_ids for t in again] == tokens  # and replay
    assert all(t.calls[0].request_params["rollout_sampling"]["temperature"] == 1.0 for t in first)
    with pytest.raises(TypeError, match="RolloutSampling"):
        art_langgraph.wrap_rollout(langgraph_model, answers, sampling={"seed": 1})  # type: ignore[arg-type]


async def test_wrap_rollout_rejects_sync_functions_and_lets_errors_through(
    langgraph_model: art.TrainableModel,
) -> None:
    def not_async() -> float:
        return 1.0

    with pytest.raises(TypeError, match="async function"):
        await art_langgraph.wrap_rollout(langgraph_model, not_async)()  # type: ignore[arg-type]

    async def fails() -> float:
        await LLM.ainvoke("before the error")
        raise LookupError("tool failed")

    with pytest.raises(LookupError, match="tool failed"):
        await art_langgraph.wrap_rollout(langgraph_model, fails)()
    with pytest.raises(TypeError, match="TrainableModel"):
        art_langgraph.wrap_rollout("model", fails)  # type: ignore[arg-type]
