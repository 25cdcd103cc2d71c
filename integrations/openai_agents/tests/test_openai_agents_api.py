"""The package's contracts that need no model: tracing setup, routing, input validation."""

from __future__ import annotations

import art_openai_agents
import pytest
from agents import Agent, ModelProvider, OpenAIChatCompletionsModel, RunConfig
from agents.tracing import get_trace_provider
from agents.tracing.processors import BatchTraceProcessor, default_processor
from art_openai_agents import (
    ArtModel,
    ArtModelProvider,
    configure_tracing,
    tracing_installed,
    tracing_processor,
)
from art_openai_agents.call_metadata import call_metadata
from art_openai_agents.filtering import check_agent_filter, split_calls
from openai import AsyncOpenAI

import art_core as art


def processors() -> tuple[object, ...]:
    return tuple(get_trace_provider()._multi_processor._processors)  # type: ignore[attr-defined]


@pytest.fixture
def unregistered() -> art.TrainableModel:
    return art.TrainableModel(name="not-served", project="tests", base_model="tiny-random")


def test_the_provider_turns_off_the_export_to_openai(unregistered: art.TrainableModel) -> None:
    configure_tracing(export_to_openai=True)
    assert default_processor() in processors()
    ArtModelProvider(unregistered)
    assert processors() == (tracing_processor(),) and tracing_installed()
    assert not any(isinstance(p, BatchTraceProcessor) for p in processors())
    # leaving the processors alone is possible too
    configure_tracing(export_to_openai=True)
    ArtModelProvider(unregistered, configure_tracing=False)
    assert default_processor() in processors()
    configure_tracing()
    assert processors() == (tracing_processor(),)


def test_routing_by_model_name_and_fallback(unregistered: art.TrainableModel) -> None:
    class Frozen(ModelProvider):
        def get_model(self, model_name: str | None) -> OpenAIChatCompletionsModel:
            return OpenAIChatCompletionsModel(str(model_name), AsyncOpenAI(api_key="x"))

    provider = ArtModelProvider(unregistered, model_names=["policy"], fallback=Frozen())
    assert isinstance(provider.get_model(None), ArtModel)
    assert isinstance(provider.get_model("policy"), ArtModel)
    assert isinstance(provider.get_model("judge"), OpenAIChatCompletionsModel)
    with pytest.raises(ValueError, match="not in model_names"):
        ArtModelProvider(unregistered, model_names=["policy"]).get_model("judge")
    # every name is served by default: agents keep the names they were written with
    assert isinstance(ArtModelProvider(unregistered).get_model("gpt-4.1"), ArtModel)


def test_bad_inputs_get_clear_errors(unregistered: art.TrainableModel) -> None:
    with pytest.raises(TypeError, match="TrainableModel"):
        ArtModelProvider(art.Model(name="judge"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="single string"):
        ArtModelProvider(unregistered, model_names="policy")
    with pytest.raises(TypeError, match=r"\['triage'\]"):
        check_agent_filter("triage")
    with pytest.raises(TypeError, match="async function"):
        art_openai_agents.wrap_rollout(unregistered, lambda: 1.0)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="not registered"):
        ArtModelProvider(unregistered).get_model(None)._target()  # type: ignore[attr-defined]


async def test_rollout_rejects_a_config_that_bypasses_the_trainable_model(
    unregistered: art.TrainableModel,
) -> None:
    other = OpenAIChatCompletionsModel("gpt-4.1", AsyncOpenAI(api_key="x"))
    with pytest.raises(ValueError, match=r"run_config\.model"):
        await art_openai_agents.rollout(
            unregistered, Agent(name="a"), "hi", run_config=RunConfig(model=other)
        )
    with pytest.raises(TypeError, match=r"agents\.Agent"):
        await art_openai_agents.rollout(unregistered, "not an agent", "hi")  # type: ignore[arg-type]


def test_a_predicate_chooses_the_trained_agents() -> None:
    calls = [
        art.LLMCall(
            model="m",
            index=i,
            messages=[],
            prompt_token_ids=[1],
            completion_token_ids=[2],
            logprobs=[-0.1],
            metadata={"agent": name},
        )
        for i, name in enumerate(["planner", "writer", "planner"])
    ]
    kept, left_out = split_calls(calls, lambda agent: agent == "planner")
    assert [c.index for c in kept] == [0, 2]
    assert left_out == [
        {"call_id": calls[1].id, "index": 1, "agent": "writer", "completion_tokens": 1}
    ]
    assert split_calls(calls, None) == (calls, [])


def test_call_metadata_outside_a_run() -> None:
    assert call_metadata({"x": 1}) == {"framework": "openai-agents", "x": 1}
