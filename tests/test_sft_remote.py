"""``train_sft`` through ``RemoteBackend`` against ``art-core serve`` (a real process): the
data file read by the client, progress streamed, errors naming the client's records, 422s
for bad requests, and the token-exact path for rollouts recorded by the server's gateway."""

from __future__ import annotations

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

from remote_support import ServerProcess
from rollout_checks import three_turn_rollout
from test_sft_backend import digits_traces

import art_core as art


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path_factory.mktemp("remote-sft") / "art").start()
    yield server
    assert server.stop() == 0, server.describe()


@pytest.fixture
async def backend(server: ServerProcess) -> AsyncIterator[art.RemoteBackend]:
    backend = server.backend()
    yield backend
    await backend.close()


async def test_sft_from_a_file_then_grpo_on_the_server(
    server: ServerProcess, backend: art.RemoteBackend, tmp_path: Path
) -> None:
    progress: list[dict[str, Any]] = []
    model = art.TrainableModel(name="sft", project="remote", base_model="tiny-random")
    await model.register(backend)
    data = tmp_path / "demos.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in digits_traces(6)))
    config = art.SFTConfig(learning_rate=1e-3, epochs=2, batch_size=2, precision="fp32")
    result = await backend.train_sft(model, data, config, on_progress=progress.append)
    assert result.step == 1 == await model.get_step()
    assert result.metrics["sft/optimizer_steps"] == 6
    assert result.metrics["sft/records_rendered"] == 6
    assert [e["event"] for e in progress].count("optimizer_step") == 6

    # Rollouts served by the SFT adapter are recorded by the server: SFT on them is
    # token-exact there, and GRPO continues.
    trajectory, _ = await three_turn_rollout(model, 1)
    assert {c.adapter_step for c in trajectory.calls} == {1}
    again = await model.train_sft([trajectory], config=art.SFTConfig(precision="fp32"))
    assert again.step == 2 and again.metrics["sft/records_token_exact"] == 1
    other, _ = await three_turn_rollout(model, 0)
    grpo = await model.train([art.TrajectoryGroup([trajectory, other])])
    assert grpo.step == 3


async def test_bad_records_are_named_and_nothing_is_trained(
    server: ServerProcess, backend: art.RemoteBackend, tmp_path: Path
) -> None:
    model = art.TrainableModel(name="bad-sft", project="remote", base_model="tiny-random")
    await model.register(backend)
    good = digits_traces(2)
    with pytest.raises(ValueError, match=r"data\[2\]: no assistant turn"):  # checked here
        await model.train_sft([*good, {"messages": [{"role": "user", "content": "hi"}]}])
    long = tmp_path / "long.jsonl"
    long.write_text(
        json.dumps(good[0])
        + "\n"
        + json.dumps(
            {
                "messages": [
                    {"role": "user", "content": "one two " * 1500},
                    {"role": "assistant", "content": "3000"},
                ]
            }
        )
        + "\n"
    )
    # Over the context is found on the server (its tokenizer), still named as the client knows it.
    with pytest.raises(ValueError, match=r"long\.jsonl:2: \d+ tokens, over the model's context"):
        await model.train_sft(long)
    assert await model.get_step() == 0

    # A request that skips the client's checks gets a 422 naming the record.
    headers = {"Authorization": f"Bearer {server.token}"}
    url = f"{server.url}/api/models/remote/bad-sft/train_sft"
    no_answer = art.Trajectory(messages_and_choices=[{"role": "user", "content": "x"}])
    async with httpx.AsyncClient(headers=headers, timeout=30) as client:
        response = await client.post(
            url, json={"trajectories": [no_answer.model_dump(mode="json")], "labels": ["mine:1"]}
        )
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert (
            error["param"] == "trajectories.0" and "mine:1: no assistant turn" in error["message"]
        )
        response = await client.post(url, json={"trajectories": []})
        assert response.status_code == 422
        response = await client.post(
            url,
            json={"trajectories": [no_answer.model_dump(mode="json")], "labels": ["a", "b"]},
        )
        assert response.status_code == 422 and "2 labels for 1 trajectories" in response.text
        response = await client.post(
            url,
            json={
                "trajectories": [no_answer.model_dump(mode="json")],
                "config": {"batch_size": -1},
            },
        )
        assert response.status_code == 422 and "batch_size" in response.text
    assert await model.get_step() == 0
