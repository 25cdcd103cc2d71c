"""Shared fixtures: one gateway with a tiny-random model for the whole session.

Embedded models are built once per session into a temporary folder (or the folder named by
ART_CORE_MODELS_DIR, which CI keeps between steps).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

os.environ.setdefault(
    "ART_CORE_MODELS_DIR", str(Path(tempfile.gettempdir()) / "art-core-test-models")
)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import art_core as art


@pytest.fixture(scope="session")
def art_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("art")


@pytest.fixture(scope="session")
async def backend(art_path: Path) -> AsyncIterator[art.LocalBackend]:
    backend = art.LocalBackend(path=art_path)
    yield backend
    await backend.close()


@pytest.fixture(scope="session")
async def tiny_model(backend: art.LocalBackend) -> art.TrainableModel:
    model = art.TrainableModel(name="tiny", project="tests", base_model="tiny-random")
    await model.register(backend)
    return model
