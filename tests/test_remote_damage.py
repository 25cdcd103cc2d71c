"""Damaged model folders under ``art-core serve`` (a real process, restarted on the damage).

A model folder is validated as one unit when it is loaded: the last whole checkpoint wins
(the engine serves it and the trainer resumes from it), a damaged one is set aside, never
served, resumed or overwritten; a damaged call record is set aside and a new one started; a
model that cannot be loaded is answered with the reason (503) from memory, not loaded again
on every request, and leaks nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

os.environ.setdefault(
    "ART_CORE_MODELS_DIR", str(Path(tempfile.gettempdir()) / "art-core-test-models")
)

from remote_support import ServerProcess, groups_of

import art_core as art
from art_core.training import TrainConfig

pytestmark = pytest.mark.slow


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path / "art").start()
    yield server
    server.kill()


async def trained(server: ServerProcess, name: str, steps: int) -> Path:
    """``name`` trained ``steps`` steps on the server, which is then stopped; its folder."""
    backend = server.backend()
    model = art.TrainableModel(name=name, project="damage", base_model="tiny-random")
    await model.register(backend)
    for _ in range(steps):
        await model.train(await groups_of(model, size=4), config=TrainConfig(learning_rate=1e-3))
    await backend.close()
    assert await asyncio.to_thread(server.stop) == 0
    return server.path / "damage" / "models" / name


async def chat(server: ServerProcess, name: str) -> httpx.Response:
    async with httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {server.token}"}, timeout=120
    ) as http:
        return await http.post(
            "/v1/chat/completions",
            json={"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        )


def set_aside(folder: Path, prefix: str) -> list[str]:
    return sorted(p.name for p in folder.rglob(f"{prefix}*"))


def threads_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("Threads:")).split()[1])


@pytest.mark.parametrize("damage", ["adapter deleted", "trainer state deleted", "adapter cut"])
async def test_a_damaged_last_checkpoint_is_set_aside_and_the_previous_one_serves(
    server: ServerProcess, damage: str
) -> None:
    folder = await trained(server, "m", steps=2)
    last = folder / "checkpoints" / "0002"
    if damage == "adapter deleted":
        (last / "adapter_model.safetensors").unlink()
    elif damage == "trainer state deleted":
        (last / "trainer_state.json").unlink()
    else:
        weights = last / "adapter_model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    server.start()

    # The chat loads the model on demand: served, by step 1.
    reply = await chat(server, "m")
    assert reply.status_code == 200, reply.text
    backend = server.backend()
    model = art.TrainableModel(name="m", project="damage", base_model="tiny-random")
    await model.register(backend)
    assert await model.get_step() == 1
    assert set_aside(folder / "checkpoints", ".incomplete-0002")
    # The trainer agrees: the next step is 2, written fresh, the damaged one kept aside.
    result = await model.train(
        await groups_of(model, size=4), config=TrainConfig(learning_rate=1e-3)
    )
    assert (
        result.step == 2
        and (folder / "checkpoints" / "0002" / "adapter_model.safetensors").is_file()
    )
    assert set_aside(folder / "checkpoints", ".incomplete-0002")
    await backend.close()


async def test_a_truncated_call_record_is_set_aside_and_recording_goes_on(
    server: ServerProcess,
) -> None:
    folder = await trained(server, "m", steps=1)
    calls = folder / "calls.sqlite"
    for side in ("calls.sqlite-wal", "calls.sqlite-shm"):
        (folder / side).unlink(missing_ok=True)
    calls.write_bytes(calls.read_bytes()[: calls.stat().st_size // 2])
    server.start()
    reply = await chat(server, "m")
    assert reply.status_code == 200, reply.text
    assert set_aside(folder, ".damaged-calls.sqlite")
    backend = server.backend()
    model = art.TrainableModel(name="m", project="damage", base_model="tiny-random")
    await model.register(backend)
    # Recording works on the new file: a rollout's calls come back whole and train.
    result = await model.train(
        await groups_of(model, size=4), config=TrainConfig(learning_rate=1e-3)
    )
    assert result.step == 2 and result.metrics["train/trajectories_without_calls"] == 0
    await backend.close()


async def test_a_model_that_cannot_load_is_a_503_from_memory_and_leaks_nothing(
    server: ServerProcess,
) -> None:
    folder = await trained(server, "m", steps=1)
    config = folder / "checkpoints" / "0001" / "adapter_config.json"
    settings = json.loads(config.read_text())
    settings["peft_type"] = "NOT_A_PEFT_TYPE"  # whole files, but an adapter no engine loads
    config.write_text(json.dumps(settings))
    server.start()

    first = await chat(server, "m")
    assert first.status_code == 503, first.text
    message = first.json()["error"]["message"]
    assert "failed to load" in message and str(server.path) not in message
    threads = threads_of(server.pid)
    replies = [await chat(server, "m") for _ in range(20)]
    assert {r.status_code for r in replies} == {503}
    assert all(r.json()["error"]["message"] == message for r in replies)  # from memory
    assert threads_of(server.pid) <= threads  # no engine or thread left by the failed load
    async with httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {server.token}"}, timeout=60
    ) as http:
        api = await http.get("/api/models/damage/m/step")
        assert api.status_code == 503 and api.headers["retry-after"]
        assert (await http.get("/health")).status_code == 200


def test_models_per_server_are_capped(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "art", args=["--max-models", "2"]).start()
    try:
        headers = {"Authorization": f"Bearer {server.token}"}
        with httpx.Client(base_url=server.url, headers=headers, timeout=120) as http:
            for name in ("a", "b", "a"):  # the third re-binds a loaded model: fine
                body = {"name": name, "project": "cap", "base_model": "tiny-random"}
                assert http.post("/api/models/register", json=body).status_code == 200
            body = {"name": "c", "project": "cap", "base_model": "tiny-random"}
            refused = http.post("/api/models/register", json=body)
            assert refused.status_code == 409 and "--max-models" in refused.text
    finally:
        assert server.stop() == 0
