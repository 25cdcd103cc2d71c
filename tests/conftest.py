"""The core's tests share art_core's pytest plugin (``art_core.testing.pytest_plugin``, enabled
through ``addopts`` in pyproject.toml): the ``art_path``, ``backend`` and ``tiny_model``
session fixtures (one gateway with a tiny-random model), the shared models folder, the ``slow``
marker. Fixtures shared by several suites are here (``local_ray_cluster``, the tracing
servers); those of one suite stay in its file.

Under pytest-xdist (``--dist loadscope``: a module's tests on one worker) the modules of each
``SHARED_SCOPES`` entry run on one worker as one unit, so the session fixture they share
starts once: the Phoenix and MLflow servers (15-20 s of CPU each to start on 2 cores, most of
it their imports) serve the tracing suites and the tracing guide's block alike.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from remote_support import close_server_forks
from xdist.scheduler import LoadScopeScheduling

from art_core.tracing.servers import TracingServer, is_installed

# Modules run on one worker, as one unit of loadscope's scheduling, because they share a
# session fixture that is costly to start.
SHARED_SCOPES = {
    # phoenix and mlflow_server: the tracing suites, and docs/tracing.md's block (test_readme
    # gives it the running servers).
    "tests/test_tracing_phoenix.py": "tracing servers",
    "tests/test_tracing_mlflow.py": "tracing servers",
    "tests/test_readme.py": "tracing servers",
}


class SharedScopeScheduling(LoadScopeScheduling):
    """loadscope (a module's tests on one worker), with each ``SHARED_SCOPES`` group of
    modules one unit."""

    def _split_scope(self, nodeid: str) -> str:
        scope = super()._split_scope(nodeid)
        return SHARED_SCOPES.get(scope.split("::", 1)[0], scope)


@pytest.hookimpl
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> LoadScopeScheduling | None:
    if config.getvalue("dist") != "loadscope":
        return None  # xdist's own scheduler for any other --dist
    return SharedScopeScheduling(config, log)  # type: ignore[arg-type]


@pytest.fixture(scope="session", autouse=True)
def _server_forks_closed() -> Iterator[None]:
    """The remote tests' fork server (``remote_support``) ends with the session."""
    yield
    close_server_forks()


@pytest.fixture
def local_ray_cluster() -> Iterator[None]:
    """A Ray cluster on this machine (2 CPUs), shut down after the test: what the Ray suites
    (replicas, distributed training) place their actors on."""
    import ray  # the ray extra; only the suites that use this fixture need it

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def _tracing_server(name: str) -> Iterator[TracingServer]:
    if not is_installed(name):
        reason = f"the {name} tracing server is not installed: art-core tracing install {name}"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the {name} tests: {reason}")
        pytest.skip(reason)
    with TracingServer(name) as server:
        yield server


@pytest.fixture(scope="session")
def phoenix() -> Iterator[TracingServer]:
    """A Phoenix server for the session (each test traces to a project of its own)."""
    yield from _tracing_server("phoenix")


@pytest.fixture(scope="session")
def mlflow_server() -> Iterator[TracingServer]:
    """An MLflow server for the session (each test traces to an experiment of its own)."""
    yield from _tracing_server("mlflow")
