"""Fixtures of the LangGraph tests: their own tiny-random model on the session's gateway
(``backend`` comes from art_core's pytest plugin)."""

from __future__ import annotations

from typing import Any

import pytest

import art_core as art
from art_core.testing.pytest_plugin import register_tiny_model


@pytest.fixture(scope="session")
async def langgraph_model(backend: art.LocalBackend) -> art.TrainableModel:
    return await register_tiny_model(backend, "lg-tiny", "langgraph")


@pytest.fixture(scope="session")
def langgraph_tokenizer(backend: art.LocalBackend, langgraph_model: art.TrainableModel) -> Any:
    return backend.engine(langgraph_model).tokenizer
