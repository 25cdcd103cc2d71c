"""``RemoteBackend.export``: a real ``art-core serve`` builds the export of a model trained in
this test and sends it as a tar; the client unpacks it beside ``out`` and renames it in. The
adapter, downloaded, is byte for byte the checkpoint's and names its copied base by the new
path; refusals name the problem and leave nothing behind, on either side."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import pytest_asyncio
from peft import PeftModel
from remote_support import ServerProcess
from transformers import AutoModelForCausalLM

import art_core as art
from art_core.backends.remote import RemoteAuthError, RemoteInvalidRequest
from art_core.model_folder import ADAPTER_WEIGHTS_FILE, ModelFolder
from art_core.testing.pytest_plugin import register_tiny_model
from art_core.training import TrainConfig


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


async def trained_one_step(
    backend: art.LocalBackend, art_path: Path, name: str, project: str
) -> ModelFolder:
    """A tiny model trained one step on the session's backend: its folder under ``art_path``."""
    model = await register_tiny_model(backend, name, project)

    async def rollout(seed: int) -> art.Trajectory:
        async with art.capture(model) as run:
            await run.openai_client().chat.completions.create(
                model=run.model_name,
                messages=[{"role": "user", "content": "Say a number."}],
                max_tokens=6,
                temperature=1.0,
                seed=seed,
            )
        return run.trajectory(reward=float(seed % 2))

    groups = await art.gather_trajectory_groups(
        [art.TrajectoryGroup(rollout(seed) for seed in range(4))], pbar_desc=None
    )
    await model.train(groups, config=TrainConfig(learning_rate=1e-2, precision="fp32"))
    return ModelFolder.of(art_path, project, name)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def served(
    backend: art.LocalBackend, art_path: Path, tmp_path_factory: pytest.TempPathFactory
):  # type: ignore[no-untyped-def]
    source = await trained_one_step(backend, art_path, "remote-export", "export")
    remote_art = tmp_path_factory.mktemp("remote-art")
    shutil.copytree(source.root, remote_art / "export" / "models" / "remote-export")
    server = ServerProcess(remote_art, token="export-token").start()
    yield server, ModelFolder.of(remote_art, "export", "remote-export")
    server.stop()


async def test_remote_export_downloads_the_adapter_and_relocates_its_base(
    served: tuple[ServerProcess, ModelFolder], tmp_path: Path
) -> None:
    server, folder = served
    backend = server.backend()
    model = art.TrainableModel(name="remote-export", project="export", base_model="tiny-random")
    await model.register(backend)
    out = tmp_path / "downloads" / "agent"
    result = await model.export(out, format="peft")
    assert result.path == out.resolve() and result.step == 1 and result.format == "peft"
    assert (out / ADAPTER_WEIGHTS_FILE).read_bytes() == (
        folder.checkpoint(1) / ADAPTER_WEIGHTS_FILE
    ).read_bytes()
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(out.resolve() / "base")
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["step"] == 1 and manifest["base_model"]["referenced_as"] == str(
        out.resolve() / "base"
    )
    base = AutoModelForCausalLM.from_pretrained(config["base_model_name_or_path"])
    assert isinstance(PeftModel.from_pretrained(base, out), PeftModel)
    # The client kept no download, the server no scratch copy.
    assert listing(out.parent) == ["agent"]
    assert listing(server.path / ".exports") == []

    # Refused before anything is asked: out exists.
    with pytest.raises(FileExistsError, match="overwrite"):
        await model.export(out)
    replaced = await model.export(out, format="merged", overwrite=True)
    assert replaced.format == "merged" and (out / "model.safetensors").is_file()
    assert not (out / "adapter_config.json").exists()
    await backend.close()


async def test_remote_export_refusals_leave_nothing(
    served: tuple[ServerProcess, ModelFolder], tmp_path: Path
) -> None:
    server, _ = served
    backend = server.backend()
    model = art.TrainableModel(name="remote-export", project="export", base_model="tiny-random")
    await model.register(backend)
    out = tmp_path / "agent"
    with pytest.raises(RemoteInvalidRequest, match="checkpoint") as refused:
        await model.export(out, step=7)
    assert refused.value.status == 400 and str(server.path) not in str(refused.value)
    with pytest.raises(RemoteInvalidRequest, match="val/nothing"):
        await model.export(out, best="val/nothing")
    with pytest.raises(RemoteInvalidRequest) as bad_format:
        await backend.export(model, out, format="onnx")  # type: ignore[arg-type]
    assert bad_format.value.status == 422
    with pytest.raises(ValueError, match="max_bytes"):
        await backend.export(model, out, max_bytes=1000)
    with pytest.raises(RemoteAuthError):
        await art.RemoteBackend(server.url, token="wrong").export(model, out)
    assert listing(tmp_path) == []
    assert listing(server.path / ".exports") == []
    await backend.close()
