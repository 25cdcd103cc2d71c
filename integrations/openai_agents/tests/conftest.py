"""Fixtures of the Agents SDK tests: their own tiny-random model on the session's gateway
(``backend`` comes from art_core's pytest plugin)."""

from __future__ import annotations

import pytest

import art_core as art
from art_core.testing.pytest_plugin import register_tiny_model


@pytest.fixture(scope="session")
async def agents_model(backend: art.LocalBackend) -> art.TrainableModel:
    return await register_tiny_model(backend, "tiny-agents", "tests")
