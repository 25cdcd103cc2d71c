"""Fixtures of the art-mcp tests: their own tiny-random model on the session's gateway
(``backend`` comes from art_core's pytest plugin), and the shop example and the faulty test
server over HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from art_mcp import HttpServer, spawn_http_server
from mcp_support import FAULTY_HTTP, SHOP_SCRIPT

import art_core as art
from art_core.testing.pytest_plugin import register_tiny_model


@pytest.fixture(scope="session")
async def mcp_model(backend: art.LocalBackend) -> art.TrainableModel:
    return await register_tiny_model(backend, "mcp-tiny", "mcp-tests")


@pytest.fixture(scope="module")
async def shop() -> AsyncIterator[HttpServer]:
    """The shop example server over HTTP, one per test module."""
    async with spawn_http_server(f"python {SHOP_SCRIPT} --http") as server:
        yield server


@pytest.fixture(scope="module")
async def faulty_http() -> AsyncIterator[HttpServer]:
    async with spawn_http_server(FAULTY_HTTP) as server:
        yield server
