"""The core's tests share art_core's pytest plugin (``art_core.testing.pytest_plugin``, enabled
through ``addopts`` in pyproject.toml): the ``art_path``, ``backend`` and ``tiny_model``
session fixtures (one gateway with a tiny-random model), the shared models folder, the ``slow``
marker. Fixtures shared by several suites are here (``local_ray_cluster``); those of one
suite stay in its file.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from remote_support import close_server_forks


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
