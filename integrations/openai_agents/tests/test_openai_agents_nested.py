"""Agents run inside a run: a guardrail's classifier agent, an agent used as a tool."""

from __future__ import annotations

import json
from typing import Any, Literal

import art_openai_agents
from agents import (
    Agent,
    GuardrailFunctionOutput,
    ModelSettings,
    RunConfig,
    RunContextWrapper,
    Runner,
    input_guardrail,
)
from art_openai_agents import ArtModelProvider
from openai_agents_support import (
    TOOL_TOKENS,
    assert_token_exact,
    tool_call_of,
    weather_agent,
)
from pydantic import BaseModel

import art_core as art


class Verdict(BaseModel):
    topic: Literal["weather", "other"]


async def test_guardrail_agent_calls_are_captured_and_tagged(
    backend: art.LocalBackend, agents_model: art.TrainableModel
) -> None:
    config = RunConfig(model_provider=ArtModelProvider(agents_model))
    # structured output: the gateway enforces the JSON schema, so the verdict always parses
    classifier = Agent(
        name="classifier",
        instructions="Is the question about the weather?",
        output_type=Verdict,
        model_settings=ModelSettings(max_tokens=TOOL_TOKENS),
    )
    verdicts: list[str] = []

    @input_guardrail(name="topic_check", run_in_parallel=False)
    async def topic_check(
        ctx: RunContextWrapper[Any], agent: Agent[Any], input: Any
    ) -> GuardrailFunctionOutput:
        result = await Runner.run(classifier, input, context=ctx.context, run_config=config)
        verdicts.append(result.final_output.topic)
        return GuardrailFunctionOutput(output_info=result.final_output, tripwire_triggered=False)

    agent = weather_agent().clone(input_guardrails=[topic_check])
    trajectory = await art_openai_agents.rollout(
        agents_model, agent, "Weather in Tokyo?", run_config=config
    )
    guard_call, weather_call = trajectory.calls  # the guardrail runs before the agent's turn
    assert guard_call.metadata["agent"] == "classifier"
    assert guard_call.metadata["guardrail"] == "topic_check"
    assert json.loads(guard_call.response_message["content"]) == {"topic": verdicts[0]}
    assert weather_call.metadata["agent"] == "weather" and "guardrail" not in weather_call.metadata
    assert_token_exact(backend, agents_model, trajectory)
    summary = trajectory.metadata["openai_agents"]
    assert summary["guardrails"] == [
        {"name": "topic_check", "triggered": False, "agent": "weather"}
    ]
    assert summary["agents"] == ["weather", "classifier"]

    # the classifier's calls can be left out of training
    only_weather = await art_openai_agents.rollout(
        agents_model, agent, "Weather?", run_config=config, train_agents=["weather"]
    )
    assert [c.metadata["agent"] for c in only_weather.calls] == ["weather"]


class WeatherQuestion(BaseModel):
    city: Literal["Paris", "Tokyo", "Lima"]


async def test_agent_used_as_a_tool_is_tagged_with_the_tool(
    backend: art.LocalBackend, agents_model: art.TrainableModel
) -> None:
    forecaster = weather_agent()
    orchestrator = Agent(
        name="orchestrator",
        instructions="Ask the forecaster.",
        tools=[
            forecaster.as_tool(
                tool_name="ask_forecaster",
                tool_description="Ask the weather agent about a city.",
                parameters=WeatherQuestion,
            )
        ],
        model_settings=ModelSettings(tool_choice="ask_forecaster", max_tokens=TOOL_TOKENS),
        tool_use_behavior="stop_on_first_tool",
    )
    trajectory = await art_openai_agents.rollout(agents_model, orchestrator, "Weather?")
    outer, inner = trajectory.calls
    assert outer.metadata["agent"] == "orchestrator" and "tool" not in outer.metadata
    assert inner.metadata["agent"] == "weather" and inner.metadata["tool"] == "ask_forecaster"
    assert tool_call_of(outer)[0] == "ask_forecaster"
    assert_token_exact(backend, agents_model, trajectory)
    summary = trajectory.metadata["openai_agents"]
    assert summary["agents"] == ["orchestrator", "weather"]
    tools = {(c["agent"], c["tool"]) for c in summary["tool_calls"]}
    assert tools == {("orchestrator", "ask_forecaster"), ("weather", "get_weather")}
