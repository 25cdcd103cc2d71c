"""Two engine-worker replicas of tiny-random behind one gateway (``LocalBackend(replicas=2)``):
sticky routing, token-exact rollouts, training across replicas, a replica killed mid-batch."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
import pytest_asyncio
from rollout_checks import assert_rollouts_isolated_and_exact, three_turn_rollout

import art_core as art
from art_core.engines.router import ReplicaRouter
from art_core.engines.worker_engine import WorkerEngine
from art_core.testing.checks import assert_prefix_chain

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def replicated(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[tuple[art.LocalBackend, art.TrainableModel]]:
    path = tmp_path_factory.mktemp("replicas")
    async with art.LocalBackend(path=path, replicas=2, threads_per_replica=1) as backend:
        model = art.TrainableModel(name="tiny-replicas", project="tests", base_model="tiny-random")
        await model.register(backend)
        yield backend, model


def router_of(backend: art.LocalBackend, model: art.TrainableModel) -> ReplicaRouter:
    engine = backend.engine(model)
    assert isinstance(engine, ReplicaRouter)
    return engine


async def wait_for(condition: Any, within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within_s} s: {what}")
        await asyncio.sleep(0.05)


async def one_call(
    model: art.TrainableModel, prompt: str, max_tokens: int = 8, *, max_retries: int = 2
) -> Any:
    async with art.capture(model) as run:
        client = run.openai_client(max_retries=max_retries)
        response = await client.chat.completions.create(
            model=run.model_name,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=max_tokens,
            temperature=1.0,
        )
    return run.trajectory(reward=0.0), response


async def test_64_concurrent_rollouts_each_stay_on_one_replica_token_exactly(
    replicated: tuple[art.LocalBackend, art.TrainableModel],
) -> None:
    backend, model = replicated
    router = router_of(backend, model)
    results = await asyncio.gather(*(three_turn_rollout(model, i) for i in range(64)))
    assert_rollouts_isolated_and_exact(results, router.tokenizer)
    replicas_used = set()
    for trajectory, _ in results:
        served_by = {call.replica for call in trajectory.calls}
        assert len(served_by) == 1, f"{trajectory.id} was served by replicas {served_by}"
        replicas_used |= served_by
    assert replicas_used == {0, 1}
    # Least loaded, bounded: neither replica took (nearly) everything.
    per_replica = [sum(t.calls[0].replica == r for t, _ in results) for r in (0, 1)]
    assert min(per_replica) >= 16, per_replica


async def test_calls_on_the_plain_v1_path_are_spread(
    replicated: tuple[art.LocalBackend, art.TrainableModel],
) -> None:
    backend, model = replicated
    client = model.openai_client()
    responses = await asyncio.gather(
        *(
            client.chat.completions.create(
                model=model.name, messages=[{"role": "user", "content": f"q{i}"}], max_tokens=4
            )
            for i in range(8)
        )
    )
    store = backend.store(model)
    served_by = [store.get(r.choices[0].model_extra["call_id"]).replica for r in responses]
    assert set(served_by) == {0, 1}, served_by


async def test_a_train_step_drains_both_replicas_and_both_serve_the_new_step(
    replicated: tuple[art.LocalBackend, art.TrainableModel],
) -> None:
    backend, model = replicated
    router = router_of(backend, model)
    step_before = await model.get_step()
    trajectories = [
        (await one_call(model, f"train {i}", max_tokens=6))[0].model_copy(
            update={"reward": float(i % 2)}
        )
        for i in range(4)
    ]
    group = art.TrajectoryGroup(trajectories)
    in_flight = [asyncio.ensure_future(one_call(model, f"long {i}", 48)) for i in range(8)]
    await wait_for(
        lambda: all(load.in_flight > 0 for load in router.load), 30, "calls on both replicas"
    )
    result = await model.train([group], config=art.TrainConfig(learning_rate=1e-3))
    assert result.step == step_before + 1 and result.nothing_trained is None
    done = await asyncio.gather(*in_flight)
    # Requests in flight finished on the step they started on, on both replicas.
    assert {t.calls[0].replica for t, _ in done} == {0, 1}
    assert {t.calls[0].adapter_step for t, _ in done} == {step_before}
    after = await asyncio.gather(*(one_call(model, f"after {i}") for i in range(8)))
    assert {t.calls[0].replica for t, _ in after} == {0, 1}
    assert {t.calls[0].adapter_step for t, _ in after} == {result.step}
    assert result.metrics["serving/replicas"] == 2.0
    assert result.metrics["serving/replica0/live"] == 1.0
    # Each replica's prefix cache, as its health check reports it.
    assert result.metrics["serving/replica0/prefill/tokens_asked"] > 0
    assert "serving/replica1/prefix_cache/hit_rate" in result.metrics


async def test_a_killed_replica_fails_only_its_calls_and_comes_back(
    replicated: tuple[art.LocalBackend, art.TrainableModel],
) -> None:
    backend, model = replicated
    router = router_of(backend, model)
    victim = router.replicas[0]
    assert isinstance(victim, WorkerEngine)
    restarts = victim.restarts
    store = backend.store(model)

    # Rollouts that made their first call before the kill, and go on after it.
    go_on = asyncio.Event()
    first_calls: list[str] = []

    async def pinned_rollout(i: int) -> art.Trajectory:
        async with art.capture(model) as run:
            client = run.openai_client()
            messages: list[dict[str, Any]] = [{"role": "user", "content": f"pinned {i}"}]
            first = await client.chat.completions.create(
                model=run.model_name, messages=messages, max_tokens=6
            )
            first_calls.append(run.rollout_id)
            await go_on.wait()
            messages += [
                first.choices[0].message.model_dump(exclude_none=True),
                {"role": "user", "content": "go on"},
            ]
            await client.chat.completions.create(
                model=run.model_name, messages=messages, max_tokens=4
            )
        return run.trajectory(reward=0.0)

    pinned = [asyncio.ensure_future(pinned_rollout(i)) for i in range(6)]
    await wait_for(lambda: len(first_calls) == 6, 60, "the first calls of 6 rollouts")
    on_victim = {rollout for rollout in first_calls if router.pinned(rollout) == 0}
    assert on_victim, "no rollout was pinned to replica 0"

    async def attempt(i: int) -> tuple[str, Any]:
        try:
            # No retries: the openai client would retry a 503 (on the live replica).
            return "ok", await one_call(model, f"burst {i}", max_tokens=64, max_retries=0)
        except openai.APIStatusError as exc:
            return "error", exc

    burst = [asyncio.ensure_future(attempt(i)) for i in range(16)]
    await wait_for(lambda: router.load[0].in_flight > 0, 30, "calls on replica 0")
    await wait_for(lambda: router.load[1].in_flight > 0, 30, "calls on replica 1")
    victim.kill()
    await wait_for(lambda: not victim.available, 10, "the kill is seen")
    go_on.set()  # the pinned rollouts' next calls arrive while replica 0 is down
    outcomes = await asyncio.gather(*burst)
    failed = [o for kind, o in outcomes if kind == "error"]
    answered = [o for kind, o in outcomes if kind == "ok"]
    assert failed, "the killed replica had calls in flight: they must fail"
    assert all(exc.status_code == 503 for exc in failed)
    assert answered, "the other replica's calls are unaffected"
    for trajectory, response in answered:
        call = store.get(response.choices[0].model_extra["call_id"])
        assert call is not None and call.replica in (0, 1)
        assert trajectory.calls == [call]

    # A rollout pinned to the dead replica goes on, on the live one, token-exactly: the
    # prompt is built from the recorded ids, whichever replica serves it.
    for trajectory in await asyncio.gather(*pinned):
        assert len(trajectory.calls) == 2
        assert_prefix_chain(trajectory.calls)
        if trajectory.id in on_victim:
            assert [c.replica for c in trajectory.calls] == [0, 1]

    await wait_for(lambda: victim.available, 120, "the killed replica is back")
    assert victim.restarts == restarts + 1
    # Both replicas serve again.
    again = await asyncio.gather(*(one_call(model, f"again {i}") for i in range(8)))
    assert {t.calls[0].replica for t, _ in again} == {0, 1}


def test_plan_replicas_gives_each_replica_its_own_cores() -> None:
    from art_core.engines.replicas import plan_replicas

    specs = plan_replicas(2, threads_per_replica=1)
    assert [s.threads for s in specs] == [1, 1]
    cpus = [s.cpus for s in specs]
    if all(cpus):
        assert set(cpus[0]).isdisjoint(cpus[1])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="replicas must be >= 1"):
        plan_replicas(0)


async def test_art_core_serve_replicas_serves_a_remote_rollout_on_both_replicas(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from remote_support import ServerProcess

    path = tmp_path_factory.mktemp("serve-replicas") / "art"
    server = ServerProcess(path, args=["--replicas", "2", "--threads-per-replica", "1"]).start()
    try:
        model = art.TrainableModel(
            name="remote-replicas", project="tests", base_model="tiny-random"
        )
        await model.register(server.backend())
        results = await asyncio.gather(*(one_call(model, f"remote {i}") for i in range(8)))
        assert {t.calls[0].replica for t, _ in results} == {0, 1}
    finally:
        assert server.stop() == 0
