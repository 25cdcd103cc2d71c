"""A pytest plugin for code built on art_core: one gateway with a tiny-random model per session.

Enable it with ``-p art_core.testing.pytest_plugin`` (e.g. ``addopts`` in your pytest
configuration, as art_core's own tests and its integrations do) or
``pytest_plugins = ["art_core.testing.pytest_plugin"]`` in a top-level ``conftest.py``.

What it gives:

- ``ART_CORE_MODELS_DIR`` defaults to one folder under the system's temporary directory, so the
  embedded models are built once per machine, not once per test (CI sets its own);
  ``TOKENIZERS_PARALLELISM`` defaults to ``false`` (no fork warnings from tokenizers);
  ``ART_CORE_FOLLOW_FREE_CORES`` to ``0`` (a fixed torch thread count: reproducible sums);
- the ``slow`` marker (end-to-end tests, still run in CI: deselect with ``-m "not slow"``);
- under pytest-xdist, each worker pinned to its own share of the cores, and the
  ``whole_machine`` and ``memory_heavy`` markers (``art_core.testing.workers``);
- ``needs_install(name)``: wait for ``run.sh``'s background install of ``name`` before the
  test's setup (``art_core.testing.installs``);
- with pytest-timeout, a default timeout on every test (300 s; 900 s for ``slow`` tests; a
  ``timeout`` marker of the test's own wins), failing with every thread's stack and killing
  the processes the test left running (``art_core.testing.hangs``);
- session fixtures ``art_path`` (a temporary ``.art`` folder), ``backend`` (a
  ``LocalBackend`` there) and ``tiny_model`` (``tiny-random`` registered on it);
- ``register_tiny_model(backend, name, project)`` for a suite's own model on that backend;
- ``shared_cache_home``: an art_core cache folder (for ``$ART_CORE_CACHE_DIR``) shared by
  every test of the run, on every xdist worker, under pytest's temporary folder: what one test
  compiled (inductor's cache, ``compile_cache_dir()``) the next finds there;
- ``judge_server`` (one ``StandInJudge`` for the session) and ``judge`` (that judge, reset for
  the test, with RULER's cache in the test's temporary folder and no judge endpoint or key from
  the machine's environment: ``OPENAI_*`` and the provider variables of LiteLLM ids).

The async fixtures run on the session's event loop: configure pytest-asyncio with
``asyncio_default_fixture_loop_scope = "session"`` and ``asyncio_default_test_loop_scope =
"session"`` (a loop per test would outlive nothing the session fixtures hold).

Example:
    >>> # conftest.py:  pytest_plugins = ["art_core.testing.pytest_plugin"]
    >>> async def test_one_call(tiny_model):  # fragment: a test, run by pytest with the plugin  # doctest: +SKIP
    ...     async with art.capture(tiny_model) as run:
    ...         await run.openai_client().chat.completions.create(...)
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

import art_core as art
from art_core.rewards.endpoint import JUDGE_ENV_VARS
from art_core.testing.installs import NEEDS_INSTALL_MARKER
from art_core.testing.judge import StandInJudge
from art_core.testing.run_hooks import RunHooks
from art_core.testing.workers import MEMORY_HEAVY_MARKER, WHOLE_MACHINE_MARKER

os.environ.setdefault(
    "ART_CORE_MODELS_DIR", str(Path(tempfile.gettempdir()) / "art-core-test-models")
)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tests compare numbers bit for bit (resume vs uninterrupted, a batch vs a request alone): a
# thread count that follows other processes (the servers and ranks tests start) would change
# the order of float sums between runs. Fixed threads unless a test asks otherwise.
os.environ.setdefault("ART_CORE_FOLLOW_FREE_CORES", "0")
# The checks' asserts explain their failures like a test's own asserts do.
pytest.register_assert_rewrite("art_core.testing.checks")

SLOW_MARKER = "slow: end-to-end tests on the embedded smollm2-135m model (still run in CI)"


def pytest_configure(config: pytest.Config) -> None:
    for marker in (SLOW_MARKER, WHOLE_MACHINE_MARKER, MEMORY_HEAVY_MARKER, NEEDS_INSTALL_MARKER):
        config.addinivalue_line("markers", marker)
    config.pluginmanager.register(RunHooks(config), "art-core-run-hooks")


async def register_tiny_model(
    backend: art.LocalBackend, name: str, project: str = "tests"
) -> art.TrainableModel:
    """A ``tiny-random`` model registered on ``backend`` (seeded: the same weights each time).

    Example:
        >>> model = await register_tiny_model(backend, "lg-tiny", "langgraph")  # fragment: the `backend` fixture  # doctest: +SKIP
    """

    model = art.TrainableModel(name=name, project=project, base_model="tiny-random")
    await model.register(backend)
    return model


@pytest.fixture(scope="session")
def art_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A temporary ``.art`` folder for the session's backend."""
    return tmp_path_factory.mktemp("art")


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def backend(art_path: Path) -> AsyncIterator[art.LocalBackend]:
    """One ``LocalBackend`` (engines, gateway, trainer) for the whole session."""

    async with art.LocalBackend(path=art_path) as local:
        yield local


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def tiny_model(backend: art.LocalBackend) -> art.TrainableModel:
    """``tiny-random`` (name ``tiny``, project ``tests``) served by ``backend``."""
    return await register_tiny_model(backend, "tiny", "tests")


@pytest.fixture(scope="session")
def shared_cache_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An art_core cache folder for every test of this run, on every xdist worker (their
    temporary folders share a parent): a compiled decode step one test built, another test
    loads from inductor's cache instead of compiling it again (tiny-random's graphs: 50 s
    cold, 14 s warm for the compiled engine's test). Tests of the cache's own behaviour
    (its location, its bound) use their ``tmp_path``.

    Example:
        >>> def test_compiles(shared_cache_home, monkeypatch):  # fragment: a test, run by pytest with the plugin  # doctest: +SKIP
        ...     monkeypatch.setenv("ART_CORE_CACHE_DIR", str(shared_cache_home))
    """
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder = root / "art-core-cache"
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def judge_server() -> Iterator[StandInJudge]:
    """One stand-in RULER judge (an OpenAI-compatible server on loopback) for the session."""

    with StandInJudge() as server:
        yield server


@pytest.fixture
def judge(
    judge_server: StandInJudge, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> StandInJudge:
    """The stand-in judge with no requests, script or reversed replies left from other tests;
    RULER's cache under ``tmp_path``; the machine's judge settings out of the environment."""

    judge_server.reset()
    judge_server.reverse = False
    monkeypatch.setenv("ART_CORE_CACHE_DIR", str(tmp_path / "cache"))
    for name in JUDGE_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    return judge_server
