"""Shared fixtures and helpers of the LangGraph integration tests.

Loaded by the test modules as a pytest plugin (``pytest_plugins = ["langgraph_support"]``), so
its session fixtures (one gateway with a tiny-random model) are shared by all of them. Fixture
names carry a ``langgraph_`` prefix: plugin fixtures are visible to the whole session.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import pytest

os.environ.setdefault(
    "ART_CORE_MODELS_DIR", str(Path(tempfile.gettempdir()) / "art-core-test-models")
)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from langchain_core.tools import StructuredTool, tool

import art_core as art

City = Literal["Paris", "Tokyo", "Lima"]


def rollout_tag() -> str:
    """The current rollout's id as a tool sees it (proves the context reached the tool)."""
    run = art.current_run()
    return run.rollout_id if run is not None else "no-rollout"


@tool
def lookup_weather(city: City) -> str:
    """The weather in a city."""
    return f"weather in {city}: sunny [{rollout_tag()}]"


def _time(city: City) -> str:
    return f"time in {city}: 12:00 [{rollout_tag()}]"


async def _time_async(city: City) -> str:
    return _time(city)


# Sync and async implementations: ToolNode runs the one that matches how the graph is run.
lookup_time = StructuredTool.from_function(
    func=_time, coroutine=_time_async, name="lookup_time", description="The local time in a city."
)


TOOLS = [lookup_weather, lookup_time]


@pytest.fixture(scope="session")
async def langgraph_backend(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[art.LocalBackend]:
    backend = art.LocalBackend(path=tmp_path_factory.mktemp("art-langgraph"))
    yield backend
    await backend.close()


@pytest.fixture(scope="session")
async def langgraph_model(langgraph_backend: art.LocalBackend) -> art.TrainableModel:
    model = art.TrainableModel(name="lg-tiny", project="langgraph", base_model="tiny-random")
    await model.register(langgraph_backend)
    return model


@pytest.fixture(scope="session")
def langgraph_tokenizer(
    langgraph_backend: art.LocalBackend, langgraph_model: art.TrainableModel
) -> Any:
    return langgraph_backend.engine(langgraph_model).tokenizer


def assert_token_exact(trajectory: art.Trajectory, tokenizer: Any) -> None:
    """Sampled ids decode to the recorded text; each call's prompt extends the previous call."""
    for call in trajectory.calls:
        assert call.rollout_id == trajectory.id
        decoded = tokenizer.decode(call.completion_token_ids, skip_special_tokens=False)
        assert decoded == call.completion_text
        assert len(call.logprobs) == len(call.completion_token_ids) > 0
    for before, after in zip(trajectory.calls, trajectory.calls[1:], strict=False):
        prefix = before.prompt_token_ids + before.completion_token_ids
        assert after.prompt_token_ids[: len(prefix)] == prefix


def tool_names(call: art.LLMCall) -> list[str]:
    """The names of the tools a recorded call asked for."""
    return [c["function"]["name"] for c in call.response_message.get("tool_calls") or []]
