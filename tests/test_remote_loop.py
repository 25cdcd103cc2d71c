"""Acceptance: the full loop through ``RemoteBackend`` against ``art-core serve`` (a real
process on loopback): register, rollouts through its gateway, train with streamed progress,
the next rollout served by the new adapter; two clients serialized; a dropped connection
during training reattached without training twice."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

os.environ.setdefault(
    "ART_CORE_MODELS_DIR", str(Path(tempfile.gettempdir()) / "art-core-test-models")
)

from remote_support import CuttableProxy, ServerProcess, groups_of
from rollout_checks import WEATHER_TOOL as CITY_TOOL

import art_core as art
from art_core.training import TrainConfig

# Many small micro-batches: a step lasts long enough to observe (and interrupt) it.
SLOW_STEP = TrainConfig(learning_rate=1e-3, max_tokens_per_batch=16, num_epochs=6)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path_factory.mktemp("remote-loop") / "art").start()
    yield server
    assert server.stop() == 0, server.describe()


@pytest.fixture
async def backend(server: ServerProcess) -> AsyncIterator[art.RemoteBackend]:
    backend = server.backend()
    yield backend
    await backend.close()


async def test_full_loop_register_rollouts_train_and_serve_the_new_adapter(
    server: ServerProcess, backend: art.RemoteBackend
) -> None:
    records: list[dict[str, Any]] = []
    backend.on_progress = records.append
    model = art.TrainableModel(name="loop", project="remote", base_model="tiny-random")
    await model.register(backend)
    assert model.inference_base_url == f"{server.url}/v1"
    assert model.inference_api_key == server.token
    assert await model.get_step() == 0

    # A rollout with a forced tool call, through the remote gateway.
    async with art.capture(model, metadata={"kind": "tools"}) as run:
        assert run.base_url.startswith(f"{server.url}/rollouts/")
        client = run.openai_client()
        first = await client.chat.completions.create(
            model=run.model_name,
            messages=[{"role": "user", "content": "weather in Lima?"}],
            tools=[CITY_TOOL],
            # Named: exactly one grammar-forced call (``required`` allows parallel calls,
            # which a random model may keep emitting until max_tokens).
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            max_tokens=64,
        )
        tool_calls: Any = first.choices[0].message.tool_calls
        assert json.loads(tool_calls[0].function.arguments)["city"] in {"Paris", "Tokyo", "Lima"}
        recorded_live = await run.fetch_calls()
        assert [c.index for c in recorded_live] == [0]
    tool_trajectory = run.trajectory(reward=1.0)
    assert tool_trajectory.calls[0].finish_reason == "tool_calls"
    assert tool_trajectory.calls[0].rollout_id == run.rollout_id
    assert tool_trajectory.metadata == {"kind": "tools"}

    groups = await groups_of(model, n_groups=2, size=4)
    for group in groups:
        for trajectory in group:
            assert len(trajectory.calls) == 1
            call0 = trajectory.calls[0]
            assert call0.adapter_step == 0 and call0.rollout_id == trajectory.id
            assert f"task {trajectory.metadata['i']}:" in call0.messages[0]["content"]
            assert len(call0.logprobs) == len(call0.completion_token_ids) > 0

    result = await model.train(groups, config=SLOW_STEP)
    assert result.step == 1 == await model.get_step()
    assert result.checkpoint_path.startswith(str(server.path))
    assert result.metrics["train/num_trajectories"] == 8
    # Progress streamed: one record per micro-batch and per optimizer step, in order.
    micro = [r for r in records if r["event"] == "micro_batch"]
    assert micro and len(micro) == micro[-1]["num_micro_batches"]
    assert [r["micro_batch"] for r in micro] == list(range(1, len(micro) + 1))
    assert sum(r["event"] == "optimizer_step" for r in records) == SLOW_STEP.num_epochs
    assert records[0]["event"] == "started" and records[0]["step"] == 0

    # The next rollout is served by the new adapter, as its recorded adapter_step says.
    [[after]] = [g.trajectories for g in await groups_of(model, size=1)]
    assert after.calls[0].adapter_step == 1

    await model.log([after], split="val")
    history = (server.path / "remote" / "models" / "loop" / "history.jsonl").read_text()
    assert '"val/reward"' in history and '"train/loss"' in history
    second = await model.train(
        await groups_of(model, size=4), config=TrainConfig(learning_rate=1e-3)
    )
    assert second.step == 2
    deleted = await model.delete_checkpoints("train/reward")
    assert 2 not in deleted and await model.get_step() == 2


async def test_hand_built_trajectories_are_matched_to_recorded_calls(
    backend: art.RemoteBackend,
) -> None:
    model = art.TrainableModel(name="artstyle", project="remote", base_model="tiny-random")
    await model.register(backend)
    client = model.openai_client()
    trajectories = []
    for i in range(3):
        messages: list[Any] = [{"role": "user", "content": f"plain call {i}"}]
        response = await client.chat.completions.create(
            model=model.get_inference_name(), messages=messages, max_tokens=5
        )
        trajectories.append(
            art.Trajectory(messages_and_choices=[*messages, response.choices[0]], reward=float(i))
        )
    result = await model.train([art.TrajectoryGroup(trajectories)], config=TrainConfig())
    assert result.step == 1 and result.metrics["train/num_rollouts_trained"] == 3
    # The client openai_client() shares is the model's until the backend closes it.
    assert model.openai_client() is client
    await backend.close()
    assert client.is_closed()


async def test_two_clients_training_one_model_are_serialized(server: ServerProcess) -> None:
    events: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
    clients = {
        key: server.backend(on_progress=events[key].append, progress=False) for key in events
    }
    models = {
        key: art.TrainableModel(name="shared", project="remote", base_model="tiny-random")
        for key in events
    }
    for key in events:
        await models[key].register(clients[key])
    start = await models["a"].get_step()
    groups = {key: await groups_of(models[key], size=4) for key in events}
    results = await asyncio.gather(
        *(models[key].train(groups[key], config=SLOW_STEP) for key in events)
    )
    assert sorted(r.step for r in results) == [start + 1, start + 2]
    spans = sorted((e[0]["time"], e[-1]["time"]) for e in events.values())
    # One job's whole step (started .. last optimizer step) ends before the other's starts.
    assert spans[0][1] <= spans[1][0], f"interleaved training: {spans}"
    for e in events.values():
        assert e[0]["event"] == "started"
    assert {e[0]["step"] for e in events.values()} == {start, start + 1}
    for client in clients.values():
        await client.close()


async def test_dropped_connection_during_training_reattaches_and_trains_once(
    server: ServerProcess,
) -> None:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    proxy = await CuttableProxy(host, int(port)).start()
    cut = asyncio.Event()
    seqs: list[int] = []

    def on_progress(record: dict[str, Any]) -> None:
        seqs.append(record["seq"])
        if record["event"] == "micro_batch" and not cut.is_set():
            proxy.cut()  # mid-step: the stream breaks, the job goes on
            cut.set()

    backend = art.RemoteBackend(proxy.url, token=server.token, on_progress=on_progress)
    model = art.TrainableModel(name="dropped", project="remote", base_model="tiny-random")
    await model.register(backend)
    groups = await groups_of(model, size=4)
    connections_before = proxy.connections
    result = await model.train(groups, config=SLOW_STEP)
    assert cut.is_set()
    assert result.step == 1 == await model.get_step()  # trained exactly once
    assert proxy.connections > connections_before  # it reconnected to follow the job
    assert len(seqs) == len(set(seqs)), "a replayed record was reported twice"
    assert seqs == sorted(seqs)
    checkpoints = server.path / "remote" / "models" / "dropped" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir() if not p.name.startswith(".")) == ["0001"]
    await backend.close()
    await proxy.close()


async def test_a_retried_train_request_attaches_to_its_job_instead_of_training_again(
    server: ServerProcess, backend: art.RemoteBackend
) -> None:
    model = art.TrainableModel(name="idempotent", project="remote", base_model="tiny-random")
    await model.register(backend)
    groups = await groups_of(model, size=4)
    body = {
        "job_id": "job_retry_1",
        "groups": [g.model_dump(mode="json") for g in groups],
        "config": TrainConfig(learning_rate=1e-3).model_dump(mode="json"),
    }
    headers = {"Authorization": f"Bearer {server.token}"}
    path = f"{server.url}/api/models/remote/idempotent/train"
    async with httpx.AsyncClient(headers=headers, timeout=120) as client:
        streams = []
        for _ in range(2):  # the same request twice, as a client retrying after a drop would
            response = await client.post(path, json=body)
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("application/x-ndjson")
            records = [json.loads(line) for line in response.text.splitlines()]
            streams.append([r for r in records if r["event"] != "heartbeat"])
        status = (await client.get(f"{server.url}/api/jobs/job_retry_1", headers=headers)).json()
    for records in streams:
        assert records[0] == {**records[0], "event": "job", "job_id": "job_retry_1"}
        assert records[-1]["event"] == "result" and records[-1]["result"]["step"] == 1
    assert streams[0] == streams[1]  # the second request replayed the first one's job
    assert status["status"] == "succeeded" and status["result"]["step"] == 1
    assert await model.get_step() == 1  # trained once
