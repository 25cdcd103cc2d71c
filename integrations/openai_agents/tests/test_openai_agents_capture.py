"""Real agents through ArtModelProvider: tool calls, handoffs, concurrency, streaming."""

from __future__ import annotations

import asyncio
import json

import art_openai_agents
import pytest
from agents import RunConfig, Runner
from art_openai_agents import ArtModelProvider
from openai_agents_support import (
    CITIES,
    assert_token_exact,
    tool_call_of,
    triage_agent,
    weather_agent,
)

import art_core as art
from art_core.testing.checks import assert_prefix_chain


async def test_function_tool_call_and_its_output(
    backend: art.LocalBackend, agents_model: art.TrainableModel
) -> None:
    agent = weather_agent(stop_on_tool=False)
    trajectory = await art_openai_agents.rollout(
        agents_model, agent, "What is the weather in Paris?", max_turns=3
    )
    first, second = trajectory.calls  # the forced tool call, then the answer after its output
    assert [c.metadata["agent"] for c in trajectory.calls] == ["weather", "weather"]
    assert [c.metadata["turn"] for c in trajectory.calls] == [1, 2]
    name, arguments = tool_call_of(first)
    city = json.loads(arguments)["city"]
    assert name == "get_weather" and city in CITIES and first.finish_reason == "tool_calls"
    assert first.messages[-1] == {"role": "user", "content": "What is the weather in Paris?"}
    tool_message = second.messages[-1]
    assert tool_message["role"] == "tool" and tool_message["content"] == f"sunny in {city}"
    assert second.request_params.get("tool_choice") in (None, "auto")  # reset after the call
    assert_token_exact(backend, agents_model, trajectory)
    assert_prefix_chain(trajectory.calls)

    summary = trajectory.metadata["openai_agents"]
    assert summary["agents"] == ["weather"]
    [tool_call] = summary["tool_calls"]
    assert tool_call["agent"] == "weather" and tool_call["tool"] == "get_weather"
    assert json.loads(tool_call["input"]) == {"city": city}
    assert tool_call["output"] == f"sunny in {city}"
    assert trajectory.metrics["requests"] == 2
    assert trajectory.metrics["output_tokens"] == trajectory.num_completion_tokens


async def test_handoff_between_two_agents(
    backend: art.LocalBackend, agents_model: art.TrainableModel
) -> None:
    triage = triage_agent(weather_agent())
    trajectory = await art_openai_agents.rollout(
        agents_model, triage, "Weather in Lima?", reward=lambda r: float("sunny" in r.final_output)
    )
    handoff_call, weather_call = trajectory.calls
    assert handoff_call.metadata["agent"] == "triage"
    assert weather_call.metadata["agent"] == "weather"
    assert tool_call_of(handoff_call) == ("transfer_to_weather", "{}")
    # the weather agent sees the handoff as a tool call and its result
    assert weather_call.messages[-1]["role"] == "tool"
    assert json.loads(weather_call.messages[-1]["content"]) == {"assistant": "weather"}
    _, arguments = tool_call_of(weather_call)
    city = json.loads(arguments)["city"]
    assert_token_exact(backend, agents_model, trajectory)

    summary = trajectory.metadata["openai_agents"]
    assert summary["agents"] == ["triage", "weather"]
    assert summary["handoffs"] == [{"from": "triage", "to": "weather"}]
    assert summary["final_output"] == f"sunny in {city}" and summary["last_agent"] == "weather"
    assert summary["trained_agents"] == ["triage", "weather"] and summary["excluded_calls"] == []
    assert trajectory.reward == 1.0


async def test_train_agents_keeps_only_the_chosen_agents_calls(
    agents_model: art.TrainableModel,
) -> None:
    trajectory = await art_openai_agents.rollout(
        agents_model, triage_agent(weather_agent()), "Weather?", train_agents=["weather"]
    )
    [call] = trajectory.calls
    assert call.metadata["agent"] == "weather" and call.index == 1
    summary = trajectory.metadata["openai_agents"]
    assert summary["agents"] == ["triage", "weather"]  # the run itself is described in full
    assert [(c["agent"], c["index"]) for c in summary["excluded_calls"]] == [("triage", 0)]
    assert trajectory.tools == call.tools
    assert any("triage" in line for line in trajectory.logs)


async def test_16_concurrent_runs_hold_exactly_their_own_calls(
    backend: art.LocalBackend, agents_model: art.TrainableModel
) -> None:
    provider = ArtModelProvider(agents_model)
    # handoff, forced tool call, then an answer after the tool's output: 3 calls per run
    triage = triage_agent(weather_agent(stop_on_tool=False))
    trajectories = await asyncio.gather(
        *(
            art_openai_agents.rollout(
                agents_model,
                triage,
                f"task {i}: weather?",
                provider=provider,
                max_turns=4,
                metadata={"i": i},
            )
            for i in range(16)
        )
    )
    await provider.aclose()
    assert len({t.id for t in trajectories}) == 16
    for i, trajectory in enumerate(trajectories):
        assert trajectory.metadata["i"] == i
        handoff, tool, answer = trajectory.calls
        assert tool_call_of(handoff) == ("transfer_to_weather", "{}")
        assert [c.metadata["agent"] for c in trajectory.calls] == ["triage", "weather", "weather"]
        assert [c.index for c in trajectory.calls] == [0, 1, 2]
        for call in trajectory.calls:
            assert call.messages[1] == {"role": "user", "content": f"task {i}: weather?"}
        # the answer turn saw the output of this rollout's own tool call
        city = json.loads(tool_call_of(tool)[1])["city"]
        assert answer.messages[-1] == {
            "role": "tool",
            "content": f"sunny in {city}",
            "tool_call_id": tool.response_message["tool_calls"][0]["id"],
        }
        assert_token_exact(backend, agents_model, trajectory)
        assert_prefix_chain([tool, answer])  # same agent, same tools: one exact sequence
        # the spans recorded for this rollout are this rollout's own
        summary = trajectory.metadata["openai_agents"]
        assert [c["input"] for c in summary["tool_calls"]] == [tool_call_of(tool)[1]]
        assert summary["handoffs"] == [{"from": "triage", "to": "weather"}]
        assert len(summary["trace_ids"]) == 1
        assert {c.metadata["trace_id"] for c in trajectory.calls} == set(summary["trace_ids"])
    assert len({t.metadata["openai_agents"]["trace_ids"][0] for t in trajectories}) == 16


async def test_streamed_run_is_captured_like_a_plain_run(
    agents_model: art.TrainableModel,
) -> None:
    # seeded sampling: both runs sample the same ids, so their records must match exactly
    triage = triage_agent(weather_agent(extra_args={"seed": 11}), extra_args={"seed": 5})
    config = RunConfig(model_provider=ArtModelProvider(agents_model))
    plain = await art_openai_agents.rollout(agents_model, triage, "Weather?", run_config=config)

    async with art_openai_agents.capture(agents_model) as run:
        result = Runner.run_streamed(triage, "Weather?", run_config=config)
        raw_events = [
            e.data.type async for e in result.stream_events() if e.type == "raw_response_event"
        ]
        run.result = result
    streamed = run.trajectory(metrics={"requests": result.context_wrapper.usage.requests})
    # the model really streamed: tool-call argument deltas came in as SSE chunks
    assert raw_events.count("response.function_call_arguments.delta") >= 2
    assert len(plain.calls) == len(streamed.calls) == 2
    for a, b in zip(plain.calls, streamed.calls, strict=True):
        assert a.prompt_token_ids == b.prompt_token_ids
        assert a.completion_token_ids == b.completion_token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
        assert a.completion_text == b.completion_text and a.finish_reason == b.finish_reason
        assert tool_call_of(a)[1] == tool_call_of(b)[1]
        assert {k: a.metadata[k] for k in ("agent", "turn")} == {
            k: b.metadata[k] for k in ("agent", "turn")
        }
    summary_a, summary_b = (t.metadata["openai_agents"] for t in (plain, streamed))
    for key in ("agents", "handoffs", "tool_calls", "final_output", "last_agent"):
        assert summary_a[key] == summary_b[key]
    assert [s["type"] for s in summary_a["spans"]] == [s["type"] for s in summary_b["spans"]]
    # usage is reported for streamed calls too (the SDK asks for it only from api.openai.com)
    assert result.context_wrapper.usage.output_tokens == streamed.num_completion_tokens


async def test_wrap_rollout_and_a_user_run_config(agents_model: art.TrainableModel) -> None:
    config = RunConfig(model_provider=ArtModelProvider(agents_model), tracing_disabled=True)
    agent = weather_agent()

    @art_openai_agents.wrap_rollout(agents_model, metadata={"scenario": "lima"})
    async def solve(question: str) -> float:
        result = await Runner.run(agent, question, run_config=config)
        return float(result.final_output.endswith("Lima"))

    trajectory = await solve("Weather in Lima?")
    [call] = trajectory.calls
    # with the SDK's tracing off, the call is still tagged with its agent
    assert call.metadata["agent"] == "weather" and call.metadata["framework"] == "openai-agents"
    city = json.loads(tool_call_of(call)[1])["city"]
    assert trajectory.reward == float(city == "Lima")
    assert trajectory.metadata["scenario"] == "lima"
    assert trajectory.metadata["openai_agents"]["spans"] == []  # tracing was off


async def test_outside_a_rollout_calls_go_to_plain_inference(
    backend: art.LocalBackend, agents_model: art.TrainableModel
) -> None:
    assert art.current_run() is None
    store = backend.store(agents_model)
    config = RunConfig(model_provider=ArtModelProvider(agents_model))
    result = await Runner.run(weather_agent(), "Weather now?", run_config=config)
    assert result.final_output.startswith("sunny in ")
    # recorded on /v1, outside any rollout, still tagged with its agent
    last = store.recent_unscoped()[-1]
    assert last.rollout_id is None and last.metadata["agent"] == "weather"
    assert last.messages[-1]["content"] == "Weather now?"


async def test_tool_calls_reach_the_projects_tracing(agents_model: art.TrainableModel) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from art_core import tracing

    exporter = InMemorySpanExporter()
    tracing.enable(exporter)
    try:
        trajectory = await art_openai_agents.rollout(agents_model, weather_agent(), "Weather?")
        assert tracing.flush(30)
    finally:
        tracing.disable()
    spans = {s.attributes["gen_ai.operation.name"]: s for s in exporter.get_finished_spans()}
    assert spans["invoke_agent"].attributes["gen_ai.agent.name"] == "weather"
    assert spans["chat"].attributes["art.call.metadata.agent"] == "weather"
    tool = spans["execute_tool"]
    # the SDK's function span gave the exact timing and the agent; the id comes from the call
    assert tool.attributes["art.tool.timing"] == "recorded"
    assert tool.attributes["art.tool.metadata.agent"] == "weather"
    [tool_call] = trajectory.calls[0].response_message["tool_calls"]
    assert tool.attributes["gen_ai.tool.call.id"] == tool_call["id"]
    city = json.loads(tool_call["function"]["arguments"])["city"]
    assert json.loads(tool.attributes["gen_ai.tool.call.arguments"]) == {"city": city}
    assert tool.attributes["gen_ai.tool.call.result"] == f"sunny in {city}"


async def test_agent_model_names_are_kept_and_can_pin_an_adapter_step(
    agents_model: art.TrainableModel,
) -> None:
    frozen = weather_agent().clone(model=f"{agents_model.name}@0")  # e.g. a frozen opponent
    [pinned] = (await art_openai_agents.rollout(agents_model, frozen, "Weather?")).calls
    assert pinned.request_params["model"] == f"{agents_model.name}@0"
    assert pinned.adapter_step == 0
    named = weather_agent().clone(model="gpt-4.1")  # written for OpenAI, served by ours
    [call] = (await art_openai_agents.rollout(agents_model, named, "Weather?")).calls
    assert call.request_params["model"] == agents_model.name
    assert call.metadata["requested_model"] == "gpt-4.1"
