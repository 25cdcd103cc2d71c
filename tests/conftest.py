"""The core's tests share art_core's pytest plugin (``art_core.testing.pytest_plugin``, enabled
through ``addopts`` in pyproject.toml): the ``art_path``, ``backend`` and ``tiny_model``
session fixtures (one gateway with a tiny-random model), the shared models folder, the ``slow``
marker. Fixtures used by one suite only stay in that suite's files.
"""
