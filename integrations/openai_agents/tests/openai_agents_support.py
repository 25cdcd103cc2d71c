"""Shared pieces of the Agents SDK tests: a gateway with tiny-random, agents, checks.

With tiny-random, free text is noise, so every test that needs a tool call forces it
(``tool_choice`` set to the tool's name) on a bounded schema (a ``Literal`` argument), and
runs end through ``tool_use_behavior="stop_on_first_tool"`` or a short final turn.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

os.environ.setdefault(
    "ART_CORE_MODELS_DIR", str(Path(tempfile.gettempdir()) / "art-core-test-models")
)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
from agents import Agent, ModelSettings, function_tool

import art_core as art

CITIES = ("Paris", "Tokyo", "Lima")
# A forced call to get_weather / transfer_to_weather takes 30-40 tiny-random tokens.
TOOL_TOKENS = 48


@function_tool
def get_weather(city: Literal["Paris", "Tokyo", "Lima"]) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def weather_agent(*, stop_on_tool: bool = True, **settings: Any) -> Agent[Any]:
    """An agent forced to call get_weather; it stops there or answers in a short last turn."""
    return Agent(
        name="weather",
        instructions="Answer weather questions with the get_weather tool.",
        tools=[get_weather],
        model_settings=ModelSettings(tool_choice="get_weather", max_tokens=TOOL_TOKENS, **settings),
        tool_use_behavior="stop_on_first_tool" if stop_on_tool else "run_llm_again",
    )


def triage_agent(target: Agent[Any], **settings: Any) -> Agent[Any]:
    """An agent forced to hand off to ``target`` (handoffs are tools: transfer_to_<name>)."""
    return Agent(
        name="triage",
        instructions="Route the user to the right agent.",
        handoffs=[target],
        model_settings=ModelSettings(
            tool_choice=f"transfer_to_{target.name}", max_tokens=TOOL_TOKENS, **settings
        ),
    )


def decode(backend: art.LocalBackend, model: art.TrainableModel, ids: list[int]) -> str:
    return str(backend.engine(model).tokenizer.decode(ids, skip_special_tokens=False))


def assert_token_exact(
    backend: art.LocalBackend, model: art.TrainableModel, trajectory: art.Trajectory
) -> None:
    """Every call's recorded ids decode to its text, with one logprob per sampled id."""
    for call in trajectory.calls:
        assert call.rollout_id == trajectory.id
        assert decode(backend, model, call.completion_token_ids) == call.completion_text
        assert len(call.logprobs) == len(call.completion_token_ids) > 0


def assert_prefix_chain(calls: list[art.LLMCall]) -> None:
    """Each call's prompt starts with the previous call's prompt + sampled ids."""
    for before, after in itertools.pairwise(calls):
        prefix = before.prompt_token_ids + before.completion_token_ids
        assert after.prompt_token_ids[: len(prefix)] == prefix


def tool_call_of(call: art.LLMCall) -> tuple[str, str]:
    """(tool name, JSON arguments) of a call that made exactly one tool call."""
    [tool_call] = call.response_message["tool_calls"]
    return tool_call["function"]["name"], tool_call["function"]["arguments"]


@pytest.fixture(scope="module")
async def agents_backend(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[art.LocalBackend]:
    backend = art.LocalBackend(path=tmp_path_factory.mktemp("art-openai-agents"))
    yield backend
    await backend.close()


@pytest.fixture(scope="module")
async def agents_model(agents_backend: art.LocalBackend) -> art.TrainableModel:
    model = art.TrainableModel(name="tiny-agents", project="tests", base_model="tiny-random")
    await model.register(agents_backend)
    return model
