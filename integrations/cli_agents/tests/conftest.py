"""Fixtures of the command-line agent tests: a model whose context holds a real agent's
request (real CLI agents send 10-25k tokens of system prompt and tools), on the session's
gateway (``backend`` comes from art_core's pytest plugin)."""

from __future__ import annotations

import pytest

import art_core as art


@pytest.fixture(scope="session")
async def cli_model(backend: art.LocalBackend) -> art.TrainableModel:
    # tiny-qwen2.5: the tiny random shape with Qwen2.5's chat template and a 32k context.
    model = art.TrainableModel(name="tiny-cli", project="tests", base_model="tiny-qwen2.5")
    await model.register(backend)
    return model
