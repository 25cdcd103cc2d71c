"""ART's ``backend._experimental_push_to_s3`` / ``_experimental_pull_from_s3`` against a real
S3 protocol server on loopback (moto's), through boto3 as against AWS.

A model trained here is pushed, pulled into another art folder and served from its
checkpoint; a second push sends only what changed; a hostile bucket cannot write outside the
model's folder; a pull never overwrites or half-writes a checkpoint.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from moto.server import ThreadedMotoServer

import art_core as art
from art_core.backends.s3 import S3SyncError
from art_core.model_folder import ModelFolder

BUCKET = "art-backups"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> boto3.client:
    """boto3's own configuration, as a user sets it: endpoint, keys and bucket by env."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("BACKUP_BUCKET", BUCKET)
    client = boto3.client("s3")
    yield client
    # every test starts from an empty bucket
    for bucket in client.list_buckets().get("Buckets", []):
        for item in client.list_objects_v2(Bucket=bucket["Name"]).get("Contents", []):
            client.delete_object(Bucket=bucket["Name"], Key=item["Key"])
        client.delete_bucket(Bucket=bucket["Name"])


def keys(client: boto3.client, prefix: str = "") -> set[str]:
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return {item["Key"] for item in listed}


def files_named(root: Path, name: str) -> list[Path]:
    return list(root.rglob(name))


async def trained_model(path: Path) -> tuple[art.LocalBackend, art.TrainableModel]:
    """A registered tiny-random model with one SFT checkpoint and a served call recorded."""
    backend = art.LocalBackend(path=path)
    model = art.TrainableModel(name="agent", project="backup", base_model="tiny-random")
    await model.register(backend)
    data = path / "traces.jsonl"
    records = [
        {"messages": [{"role": "user", "content": "Say 7."}, {"role": "assistant", "content": "7"}]}
    ] * 4
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    await model.train_sft(str(data), config=art.SFTConfig(epochs=1, batch_size=4))
    client = model.openai_client()
    await client.chat.completions.create(
        model=model.get_inference_name(), messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    return backend, model


async def test_push_then_pull_restores_a_model_that_serves_its_checkpoint(
    s3: boto3.client, tmp_path: Path
) -> None:
    backend, model = await trained_model(tmp_path / "here")
    try:
        report = await backend._experimental_push_to_s3(model)  # bucket from $BACKUP_BUCKET
        pushed = keys(s3)
        prefix = "backup/models/agent/"
        assert {
            prefix + "checkpoints/0001/adapter_model.safetensors",
            prefix + "checkpoints/0001/trainer_state.json",
            prefix + "history.jsonl",
            prefix + "calls.sqlite",
        } <= pushed
        assert not any(k.endswith(("-wal", "-shm")) for k in pushed)
        assert len(report.copied) == len(pushed) and not report.unchanged

        # Nothing changed: a second push sends nothing.
        again = await backend._experimental_push_to_s3(model)
        assert not again.copied and len(again.unchanged) == len(pushed)

        # A pull under a registered model is refused: its engine already reads the folder.
        with pytest.raises(RuntimeError, match=r"before model\.register"):
            await backend._experimental_pull_from_s3(model)
    finally:
        await backend.close()

    elsewhere = art.LocalBackend(path=tmp_path / "elsewhere")
    restored = art.TrainableModel(name="agent", project="backup", base_model="tiny-random")
    try:
        pulled = await elsewhere._experimental_pull_from_s3(restored)
        assert len(pulled.copied) == len(pushed)
        folder = elsewhere.model_folder(restored)
        original = ModelFolder.of(tmp_path / "here", "backup", "agent")
        for name in ("adapter_model.safetensors", "adapter_config.json", "trainer_state.json"):
            assert (folder.checkpoint(1) / name).read_bytes() == (
                original.checkpoint(1) / name
            ).read_bytes()
        # The call record came over whole, from a consistent snapshot.
        with sqlite3.connect(folder.calls_db) as db:
            assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        await restored.register(elsewhere)
        assert await restored.get_step() == 1
        recorded = elsewhere.store(restored).count()
        assert recorded >= 1  # the call served before the push
        reply = await restored.openai_client().chat.completions.create(
            model=restored.get_inference_name(),
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=4,
        )
        assert reply.choices[0].message.content is not None
        assert elsewhere.store(restored).count() == recorded + 1
    finally:
        await elsewhere.close()


async def test_pull_of_one_step_and_delete_on_push(s3: boto3.client, tmp_path: Path) -> None:
    backend, model = await trained_model(tmp_path / "here")
    try:
        await backend._experimental_push_to_s3(model, prefix="runs")
        stray = "runs/backup/models/agent/logs/old.log"
        s3.put_object(Bucket=BUCKET, Key=stray, Body=b"from an older run")
        report = await backend._experimental_push_to_s3(model, prefix="runs", delete=True)
        assert report.deleted == ["logs/old.log"] and stray not in keys(s3)
    finally:
        await backend.close()

    other = art.LocalBackend(path=tmp_path / "other")
    model = art.TrainableModel(name="agent", project="backup", base_model="tiny-random")
    report = await other._experimental_pull_from_s3(model, step=1, prefix="runs")
    folder = other.model_folder(model)
    assert all(path.startswith("checkpoints/0001/") for path in report.copied)
    assert folder.checkpoint_steps() == [1] and not folder.history.exists()


async def test_a_pull_never_writes_outside_the_folder_or_over_a_checkpoint(
    s3: boto3.client, tmp_path: Path
) -> None:
    s3.create_bucket(Bucket=BUCKET)
    prefix = "backup/models/agent/"
    backend = art.LocalBackend(path=tmp_path / "art")
    model = art.TrainableModel(name="agent", project="backup", base_model="tiny-random")
    folder = backend.model_folder(model)

    # A key that climbs out of the folder: refused, nothing written anywhere.
    s3.put_object(Bucket=BUCKET, Key=prefix + "../../../../escaped.txt", Body=b"x")
    with pytest.raises(S3SyncError, match="not a plain path"):
        await backend._experimental_pull_from_s3(model)
    assert not files_named(tmp_path, "escaped.txt")
    s3.delete_object(Bucket=BUCKET, Key=prefix + "../../../../escaped.txt")

    # A checkpoint that exists here is never replaced by the bucket's.
    local = folder.checkpoint(1)
    local.mkdir(parents=True)
    for name in ("adapter_config.json", "adapter_model.safetensors", "trainer_state.json"):
        (local / name).write_text("local")
        s3.put_object(Bucket=BUCKET, Key=f"{prefix}checkpoints/0001/{name}", Body=b"remote")
    s3.put_object(Bucket=BUCKET, Key=prefix + "checkpoints/0002/adapter_config.json", Body=b"{}")
    report = await backend._experimental_pull_from_s3(model)
    assert (local / "adapter_model.safetensors").read_text() == "local"
    # A remote checkpoint missing files arrives whole or not at all: here, whole as it is
    # in the bucket, and the folder calls it incomplete (never served or resumed).
    assert "checkpoints/0002/adapter_config.json" in report.copied
    assert folder.checkpoint_steps() == [1]
    assert not [p for p in folder.checkpoints.iterdir() if p.name.startswith(".pull-")]


async def test_no_bucket_is_a_clear_error(
    s3: boto3.client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BACKUP_BUCKET")
    backend = art.LocalBackend(path=tmp_path)
    model = art.TrainableModel(name="agent", project="backup", base_model="tiny-random")
    with pytest.raises(S3SyncError, match="BACKUP_BUCKET"):
        await backend._experimental_pull_from_s3(model)
    with pytest.raises(S3SyncError, match="no model folder"):
        await backend._experimental_push_to_s3(model, s3_bucket=BUCKET)
