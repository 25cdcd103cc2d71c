"""Acceptance: faults of ``art-core serve`` (a real process): SIGKILL during a training step
and a restart leave the model at its previous or next step, never a half-written one, and
the client's next calls work; a rollout storm gets backpressure (429 + Retry-After), never a
crash; a graceful stop finishes the step in progress."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

os.environ.setdefault(
    "ART_CORE_MODELS_DIR", str(Path(tempfile.gettempdir()) / "art-core-test-models")
)

from remote_support import ServerProcess, groups_of

import art_core as art
from art_core.backends.local import LocalBackend
from art_core.backends.remote import TrainingInterrupted
from art_core.model_folder import ModelFolder
from art_core.server.jobs import JobStore
from art_core.server.service import Service
from art_core.server.settings import ServeSettings
from art_core.training import TrainConfig

# Long enough (hundreds of micro-batches) that a kill after the first one is mid-step.
LONG_STEP = TrainConfig(learning_rate=1e-3, max_tokens_per_batch=16, num_epochs=60)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server for the module; the crash tests kill and restart it in place."""
    server = ServerProcess(
        tmp_path_factory.mktemp("remote-faults") / "art",
        args=["--max-pending", "16", "--retry-after", "1"],
    ).start()
    yield server
    assert server.stop() == 0, server.describe()


def complete_steps(folder: Path) -> list[int]:
    checkpoints = folder / "checkpoints"
    return (
        sorted(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit())
        if checkpoints.is_dir()
        else []
    )


async def test_sigkill_during_training_then_restart_resumes_cleanly(server: ServerProcess) -> None:
    mid_step = asyncio.Event()

    def on_progress(record: dict[str, Any]) -> None:
        if record["event"] == "micro_batch" and record["step"] == 2:
            mid_step.set()

    backend = server.backend(on_progress=on_progress, reconnect_timeout=120)
    model = art.TrainableModel(name="crashy", project="faults", base_model="tiny-random")
    await model.register(backend)
    folder = server.path / "faults" / "models" / "crashy"
    first = await model.train(
        await groups_of(model, size=4), config=TrainConfig(learning_rate=1e-3)
    )
    assert first.step == 1

    groups = await groups_of(model, size=4)
    training = asyncio.create_task(model.train(groups, config=LONG_STEP))
    await asyncio.wait_for(mid_step.wait(), 60)
    server.kill()  # SIGKILL in the middle of step 2

    # On disk: step 1 complete, nothing that looks like a (half-written) step 2.
    assert complete_steps(folder) == [1]
    latest = ModelFolder(folder).latest_checkpoint()
    assert latest is not None and latest[0] == 1

    server.start()  # same folder, same port: the client reattaches to its job
    with pytest.raises(TrainingInterrupted, match="still at step 1"):
        await training
    # Rollouts work without registering again (the gateway loads the model on demand from the
    # server's registry), served by the adapter of the latest complete checkpoint ...
    [[after]] = [g.trajectories for g in await groups_of(model, size=1)]
    assert after.calls[0].adapter_step == 1
    assert await model.get_step() == 1
    # ... and training continues from step 1, with its optimizer state.
    again = await model.train(groups, config=TrainConfig(learning_rate=1e-3))
    assert again.step == 2 and complete_steps(folder) == [1, 2]
    await backend.close()


async def test_graceful_stop_finishes_the_step_in_progress(server: ServerProcess) -> None:
    mid_step = asyncio.Event()

    def on_progress(record: dict[str, Any]) -> None:
        if record["event"] == "micro_batch":
            mid_step.set()

    backend = server.backend(on_progress=on_progress, reconnect_timeout=120)
    model = art.TrainableModel(name="graceful", project="faults", base_model="tiny-random")
    await model.register(backend)
    training = asyncio.create_task(
        model.train(
            await groups_of(model, size=4),
            config=TrainConfig(max_tokens_per_batch=16, num_epochs=3),
        )
    )
    await asyncio.wait_for(mid_step.wait(), 60)
    assert await asyncio.to_thread(server.stop) == 0  # SIGTERM: waits for the step
    assert complete_steps(server.path / "faults" / "models" / "graceful") == [1]
    server.start()
    result = await training  # the outcome, read before the stop or after the restart
    assert result.step == 1 == await model.get_step()
    await backend.close()


def test_restart_reconciles_jobs_from_the_checkpoints(tmp_path: Path) -> None:
    """A job left "running" by a crash: done if its checkpoint exists, else interrupted."""
    store = JobStore(tmp_path)
    for job_id, model in (("job_done", "m1"), ("job_lost", "m2")):
        job = store.create(job_id, project="p", model=model)
        job.start(1)
        store.save(job)
    checkpoint = tmp_path / "p" / "models" / "m1" / "checkpoints" / "0002"
    checkpoint.mkdir(parents=True)
    (checkpoint / "adapter_config.json").write_text("{}")
    (checkpoint / "adapter_model.safetensors").write_bytes(b"")
    (checkpoint / "trainer_state.json").write_text(json.dumps({"metrics": {"train/loss": 0.5}}))
    half = tmp_path / "p" / "models" / "m2" / "checkpoints" / ".0002-tmp"
    half.mkdir(parents=True)  # a staging folder a kill left behind: never a checkpoint

    service = Service(LocalBackend(path=tmp_path), ServeSettings(path=tmp_path))
    done, lost = service.jobs.get("job_done"), service.jobs.get("job_lost")
    assert done is not None and done.status == "succeeded"
    assert done.result == {
        "step": 2,
        "metrics": {"train/loss": 0.5},
        "checkpoint_path": str(checkpoint),
    }
    assert lost is not None and lost.status == "interrupted"
    assert lost.error is not None and "still at step 0" in lost.error["message"]
    reloaded = JobStore(tmp_path).get("job_lost")
    assert reloaded is not None and reloaded.status == "interrupted"  # persisted


async def test_rollout_storm_gets_429_with_retry_after_never_a_crash(server: ServerProcess) -> None:
    backend = server.backend()
    model = art.TrainableModel(name="stormy", project="faults", base_model="tiny-random")
    await model.register(backend)
    limits = httpx.Limits(max_connections=400, max_keepalive_connections=400)
    async with httpx.AsyncClient(
        base_url=server.url,
        headers={"Authorization": f"Bearer {server.token}"},
        limits=limits,
        timeout=120,
    ) as client:

        async def one(i: int) -> httpx.Response:
            return await client.post(
                f"/rollouts/storm_{i}/v1/chat/completions",
                json={
                    "model": "stormy",
                    "messages": [{"role": "user", "content": f"#{i}"}],
                    "max_tokens": 4,
                },
            )

        responses = await asyncio.gather(*(one(i) for i in range(300)))
        statuses = [r.status_code for r in responses]
        assert set(statuses) <= {200, 429}, sorted(set(statuses))
        assert statuses.count(200) >= 16 and statuses.count(429) > 0
        for response in responses:
            if response.status_code == 429:
                assert response.headers["retry-after"] == "1"
                assert response.json()["error"]["type"] == "rate_limit_error"
        assert (await client.get("/health")).status_code == 200
    # Clients that honour Retry-After (the openai client does) all get through.
    groups = await groups_of(model, size=64)
    assert len(groups[0].trajectories) == 64 and not groups[0].exceptions
    assert all(len(t.calls) == 1 for t in groups[0])
    await backend.close()


def job_statuses(art_path: Path) -> list[str]:
    folder = art_path / ".server" / "jobs"
    return [json.loads(p.read_text())["status"] for p in folder.glob("*.json")]


async def test_cancelling_the_train_call_cancels_the_step_on_the_server(
    server: ServerProcess,
) -> None:
    mid_step = asyncio.Event()

    def on_progress(record: dict[str, Any]) -> None:
        if record["event"] == "micro_batch" and record["step"] == 2:
            mid_step.set()

    backend = server.backend(on_progress=on_progress)
    model = art.TrainableModel(name="cancelled", project="faults", base_model="tiny-random")
    await model.register(backend)
    folder = server.path / "faults" / "models" / "cancelled"
    await model.train(await groups_of(model, size=4), config=TrainConfig(learning_rate=1e-3))
    before = (folder / "checkpoints" / "0001" / "adapter_model.safetensors").read_bytes()

    groups = await groups_of(model, size=4)
    training = asyncio.create_task(model.train(groups, config=LONG_STEP))
    await asyncio.wait_for(mid_step.wait(), 60)
    training.cancel()  # the client tells the server to stop the step (DELETE /api/jobs/{id})
    with pytest.raises(asyncio.CancelledError):
        await training

    # The step stops within a micro-batch: a chat call is served right away, by step 1.
    [[after]] = [g.trajectories for g in await groups_of(model, size=1)]
    assert after.calls[0].adapter_step == 1
    assert await model.get_step() == 1 and complete_steps(folder) == [1]
    assert (folder / "checkpoints" / "0001" / "adapter_model.safetensors").read_bytes() == before
    assert "cancelled" in job_statuses(server.path)
    # The next step starts from checkpoint 1 (the half-updated weights were dropped).
    again = await model.train(groups, config=TrainConfig(learning_rate=1e-3))
    assert again.step == 2 and complete_steps(folder) == [1, 2]
    await backend.close()


async def test_delete_job_cancels_it_and_answers_with_its_summary(server: ServerProcess) -> None:
    backend = server.backend()
    model = art.TrainableModel(name="deleted", project="faults", base_model="tiny-random")
    await model.register(backend)
    groups = await groups_of(model, size=4)
    headers = {"Authorization": f"Bearer {server.token}"}
    body = {
        "job_id": "job_to_cancel",
        "groups": [g.model_dump(mode="json") for g in groups],
        "config": LONG_STEP.model_dump(mode="json"),
    }
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=120) as http:
        path = "/api/models/faults/deleted/train"
        async with http.stream("POST", path, json=body) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if json.loads(line).get("event") == "micro_batch":
                    break
            cancelled = await http.delete("/api/jobs/job_to_cancel")
        assert cancelled.status_code == 200, cancelled.text
        summary = cancelled.json()
        assert summary["status"] == "cancelled" and "still at step 0" in summary["error"]["message"]
        # The events end with the outcome; a second DELETE changes nothing.
        events = (await http.get("/api/jobs/job_to_cancel/events")).text.splitlines()
        assert json.loads(events[-1])["status"] == "cancelled"
        again = await http.delete("/api/jobs/job_to_cancel")
        assert again.json()["status"] == "cancelled"
        assert (await http.delete("/api/jobs/no_such_job")).status_code == 404
        bad = await http.delete("/api/jobs/job_to_cancel", params={"wait": "nan"})
        assert bad.status_code == 422
        non_ascii = await http.get("/api/jobs/job_to_cancel/events", params={"after": "²"})
        assert non_ascii.status_code == 422
    assert await model.get_step() == 0
    await backend.close()


def test_graceful_stop_cancels_a_step_that_outlasts_the_drain_timeout(tmp_path: Path) -> None:
    async def scenario() -> None:
        server = ServerProcess(
            tmp_path / "art", args=["--drain-timeout", "1", "--max-num-epochs", "1000"]
        ).start()
        try:
            mid_step = asyncio.Event()

            def on_progress(record: dict[str, Any]) -> None:
                if record["event"] == "micro_batch":
                    mid_step.set()

            backend = server.backend(on_progress=on_progress, reconnect_timeout=120)
            model = art.TrainableModel(name="endless", project="faults", base_model="tiny-random")
            await model.register(backend)
            # 10x the step the SIGKILL test interrupts: far longer than the 1 s drain.
            endless = LONG_STEP.model_copy(update={"num_epochs": 600})
            training = asyncio.create_task(
                model.train(await groups_of(model, size=4), config=endless)
            )
            await asyncio.wait_for(mid_step.wait(), 60)
            assert await asyncio.to_thread(server.stop, 60) == 0
            assert job_statuses(server.path) == ["cancelled"]
            assert not (server.path / "faults" / "models" / "endless" / "checkpoints").exists()
            server.start()  # the client reads the outcome, before the stop or after it
            with pytest.raises(art.TrainingCancelled, match="still at step 0"):
                await training
            await backend.close()
        finally:
            server.kill()

    asyncio.run(scenario())


async def test_training_settings_beyond_the_server_limits_are_a_422(server: ServerProcess) -> None:
    backend = server.backend()
    model = art.TrainableModel(name="limited", project="faults", base_model="tiny-random")
    await model.register(backend)
    groups = [g.model_dump(mode="json") for g in await groups_of(model, size=2)]
    headers = {"Authorization": f"Bearer {server.token}"}
    path = "/api/models/faults/limited/train"
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=60) as http:
        for config, named in [
            ({"num_epochs": 10**9}, "num_epochs"),  # beyond TrainConfig's own range
            ({"lora_rank": 20000}, "lora_rank"),
            ({"num_epochs": 500}, "--max-num-epochs"),  # within it, beyond the server's
            ({"lora_rank": 512}, "--max-lora-rank"),
            ({"optimizer_steps_per_epoch": 5000}, "--max-optimizer-steps-per-epoch"),
            ({"learning_rate": "1e999"}, "learning_rate"),  # a JSON number that is inf
        ]:
            body = json.dumps({"groups": groups, "config": config}).replace('"1e999"', "1e999")
            response = await http.post(
                path, content=body, headers={"content-type": "application/json"}
            )
            assert response.status_code == 422, (config, response.text)
            assert named in response.text, (config, response.text)
    assert await model.get_step() == 0
    await backend.close()
