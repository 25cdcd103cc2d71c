"""Two replicas of tiny-random as Ray actors on a local Ray cluster
(``LocalBackend(replicas=2, ray_address="auto")``): sticky, token-exact, restarted by Ray."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from rollout_checks import assert_rollouts_isolated_and_exact, three_turn_rollout

import art_core as art
from art_core.engines.ray_replicas import RayWorkerEngine
from art_core.engines.router import ReplicaRouter

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::ResourceWarning")]


async def wait_for(condition: Any, within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within_s} s: {what}")
        await asyncio.sleep(0.1)


async def test_ray_replicas_route_sticky_and_come_back_after_a_kill(
    tmp_path: Path, local_ray_cluster: None
) -> None:
    async with art.LocalBackend(
        path=tmp_path, replicas=2, threads_per_replica=1, ray_address="auto"
    ) as backend:
        model = art.TrainableModel(name="tiny-ray", project="tests", base_model="tiny-random")
        await model.register(backend)
        router = backend.engine(model)
        assert isinstance(router, ReplicaRouter)
        assert all(isinstance(r, RayWorkerEngine) for r in router.replicas)

        results = await asyncio.gather(*(three_turn_rollout(model, i) for i in range(16)))
        assert_rollouts_isolated_and_exact(results, router.tokenizer)
        for trajectory, _ in results:
            assert len({call.replica for call in trajectory.calls}) == 1
        assert {t.calls[0].replica for t, _ in results} == {0, 1}

        victim = router.replicas[1]
        assert isinstance(victim, RayWorkerEngine)
        pid = victim.actor_pid
        victim.kill()  # Ray restarts the actor
        # Ray may restart it before the health check sees it gone (refused, or a new pid on
        # the same port): wait for the restart to be seen (new pid, adapters reloaded).
        await wait_for(
            lambda: victim.restarts == 1 and victim.available, 180, "Ray restarted the actor"
        )
        assert victim.actor_pid != pid and victim.restarts == 1
        after = await asyncio.gather(*(three_turn_rollout(model, i) for i in range(8)))
        assert_rollouts_isolated_and_exact(after, router.tokenizer)
        assert {t.calls[0].replica for t, _ in after} == {0, 1}
