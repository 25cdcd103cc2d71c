"""The export route of ``art-core serve`` under hostile clients (issue 48): a client that
starts a download and stops reading is cut after ``--export-send-timeout`` and its scratch
copy removed; the scratch of exports in flight is bounded (``--max-export-scratch-mb``:
past it, 503 + Retry-After, nothing written); and a download names no path of the server.

Each test runs a real ``art-core serve`` on loopback over a copy of a model trained here
(``remote_support.ServerProcess``); a stalled reader is a raw socket with a small receive
buffer that reads the response head and then nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import shutil
import socket
import tarfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from remote_support import ServerProcess
from test_export_remote import trained_one_step

import art_core as art
from art_core.embedded import resolve_base_model
from art_core.export.api import estimate_export_bytes
from art_core.model_folder import ModelFolder
from art_core.server.export_space import ExportSpace, ExportSpaceFull

PROJECT, NAME, TOKEN = "export", "hardened-export", "hardening-token"
EXPORT_PATH = f"/api/models/{PROJECT}/{NAME}/export"
# Bounded waits (never assertions on speed): how long a test polls for what must happen.
WAIT_S = 90.0
MODELS_ENV = "ART_CORE_MODELS_DIR"
PADDING_BYTES = 24 * 2**20


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def trained(backend: art.LocalBackend, art_path: Path) -> ModelFolder:
    """A model trained one step on the session's backend (its folder, under ``art_path``)."""
    return await trained_one_step(backend, art_path, NAME, PROJECT)


@contextlib.contextmanager
def models_dir(folder: Path) -> Iterator[None]:
    """Base models resolved under ``folder`` meanwhile (a server started now inherits it)."""
    saved = os.environ.get(MODELS_ENV)
    os.environ[MODELS_ENV] = str(folder)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(MODELS_ENV, None)
        else:
            os.environ[MODELS_ENV] = saved


def padded_base(remote_art: Path, art_path: Path) -> Path:
    """A copy of tiny-random inside the server's art folder with a 24 MiB file added: a PEFT
    export (which copies the base) then outgrows what loopback sockets buffer (a few MiB),
    so a reader that stops stalls the server's sends. Returns the models folder."""
    models = remote_art / "base_models"
    shutil.copytree(resolve_base_model("tiny-random", art_path), models / "tiny-random")
    (models / "tiny-random" / "padding.dat").write_bytes(b"\0" * PADDING_BYTES)
    return models


@contextlib.asynccontextmanager
async def serve(
    trained: ModelFolder, root: Path, art_path: Path, args: Callable[[Path], list[str]]
) -> AsyncIterator[ServerProcess]:
    """``art-core serve`` over a copy of the trained model (registered) and of its base
    (``padded_base``), with the options ``args(server's art folder)`` gives."""
    remote_art = root / "art"
    shutil.copytree(trained.root, remote_art / PROJECT / "models" / NAME)
    with models_dir(padded_base(remote_art, art_path)):
        server = ServerProcess(remote_art, token=TOKEN, args=args(remote_art)).start()
    try:
        backend = server.backend()
        model = art.TrainableModel(name=NAME, project=PROJECT, base_model="tiny-random")
        await model.register(backend)
        await backend.close()
        yield server
    finally:
        server.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def quick_cut(
    trained: ModelFolder, art_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[ServerProcess]:
    """A server that cuts a download stalled for 1 s."""
    root = tmp_path_factory.mktemp("quick-cut")
    async with serve(trained, root, art_path, lambda _: ["--export-send-timeout", "1"]) as server:
        yield server


class StalledDownload:
    """A raw HTTP client that asks for an export, reads the response head, then stops reading
    (its receive buffer is made small, so the server's sends stall soon)."""

    def __init__(self, server: ServerProcess, body: dict[str, Any] | None = None) -> None:
        self.server = server
        self.body = body or {"format": "peft"}
        self.sock: socket.socket | None = None
        self.status = 0
        self.headers: dict[str, str] = {}
        self.received = 0

    def start(self) -> StalledDownload:
        host, port = self.server.url.removeprefix("http://").rsplit(":", 1)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(WAIT_S)
        sock.connect((host, int(port)))
        payload = json.dumps(self.body).encode()
        sock.sendall(
            (
                f"POST {EXPORT_PATH} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                f"Authorization: Bearer {self.server.token}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
            ).encode()
            + payload
        )
        head = b""
        while b"\r\n\r\n" not in head:
            data = sock.recv(4096)
            assert data, f"the server closed before answering: {head!r}"
            head += data
        head, _, rest = head.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        self.status = int(lines[0].split()[1])
        self.headers = {
            key.strip().lower(): value.strip()
            for key, value in (line.split(":", 1) for line in lines[1:])
        }
        self.received = len(rest)
        self.sock = sock
        return self

    @property
    def length(self) -> int:
        return int(self.headers["content-length"])

    def drain(self) -> int:
        """Read on until the server closes (or resets) the connection; the body bytes got."""
        assert self.sock is not None
        try:
            while data := self.sock.recv(1 << 16):
                self.received += len(data)
        except ConnectionResetError:
            pass
        return self.received

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()  # unread data: the server gets a reset


async def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"still not {what} after {WAIT_S:.0f} s")
        await asyncio.sleep(0.1)


def scratch(server: ServerProcess) -> list[str]:
    folder = server.path / ".exports"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


async def download(server: ServerProcess, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(
        base_url=server.url, headers={"authorization": f"Bearer {TOKEN}"}, timeout=WAIT_S
    ) as client:
        return await client.post(EXPORT_PATH, json=body)


async def test_a_stalled_download_is_cut_and_its_scratch_removed(
    quick_cut: ServerProcess,
) -> None:
    stalled = await asyncio.to_thread(StalledDownload(quick_cut).start)
    try:
        assert stalled.status == 200
        # It reads nothing more: after the send timeout (1 s) the server cuts it and removes
        # the scratch copy, without waiting for the client to hang up.
        await wait_for(lambda: scratch(quick_cut) == [], "removed")
        # The connection was cut: reading on ends before the announced length.
        received = await asyncio.to_thread(stalled.drain)
        assert 0 < received < stalled.length > PADDING_BYTES
    finally:
        stalled.close()
    # The server goes on serving exports.
    response = await download(quick_cut, {"format": "peft"})
    assert response.status_code == 200
    assert int(response.headers["content-length"]) == len(response.content) == stalled.length
    await wait_for(lambda: scratch(quick_cut) == [], "removed after a full download")


async def test_concurrent_exports_are_bounded_in_scratch_bytes(
    trained: ModelFolder, art_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    def bounded(remote_art: Path) -> list[str]:
        # Room for one export at its estimate, not for a second beside it.
        with models_dir(remote_art / "base_models"):
            one = estimate_export_bytes(
                ModelFolder.of(remote_art, PROJECT, NAME), format="peft", art_path=remote_art
            )
        return ["--max-export-scratch-mb", f"{(one + 65536) / 2**20:.6f}"]

    root = tmp_path_factory.mktemp("bounded")
    async with serve(trained, root, art_path, bounded) as server:
        first = await asyncio.to_thread(StalledDownload(server).start)
        try:
            assert first.status == 200 and len(scratch(server)) == 1
            refused = await download(server, {"format": "peft"})
            assert refused.status_code == 503, refused.text
            assert int(refused.headers["retry-after"]) >= 1
            error = refused.json()["error"]
            assert error["type"] == "server_error" and error["code"] == "export_space_full"
            assert "scratch" in error["message"] and str(server.path) not in error["message"]
            assert len(scratch(server)) == 1  # the refused export wrote nothing
        finally:
            first.close()
        await wait_for(lambda: scratch(server) == [], "removed once the first client left")

        # With the first one gone, the second succeeds (the space is freed as the folder is
        # removed: a request racing that gets 503 and retries).
        deadline = time.monotonic() + WAIT_S
        while (response := await download(server, {"format": "peft"})).status_code == 503:
            assert time.monotonic() < deadline, response.text
            await asyncio.sleep(0.2)
        assert response.status_code == 200, response.text
        with tarfile.open(fileobj=io.BytesIO(response.content)) as tar:
            assert "export.json" in tar.getnames()
        await wait_for(lambda: scratch(server) == [], "removed after the download")


def test_export_space_counts_bytes_in_flight() -> None:
    space = ExportSpace(max_bytes=1000)
    first = space.reserve(600)
    with pytest.raises(ExportSpaceFull) as busy:
        space.reserve(600)
    assert busy.value.retry_after_s is not None and space.in_flight == 600
    first.resize(300)  # packed: its tar's exact size
    second = space.reserve(600)
    first.release()
    first.release()  # idempotent
    assert space.in_flight == 600
    second.release()
    # Alone larger than the bound: waiting will not help, so no Retry-After.
    with pytest.raises(ExportSpaceFull) as too_large:
        space.reserve(1001)
    assert too_large.value.retry_after_s is None and space.in_flight == 0


def _strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


@pytest.mark.parametrize("format", ["peft", "merged"])
async def test_a_download_names_no_server_path(quick_cut: ServerProcess, format: str) -> None:
    response = await download(quick_cut, {"format": format})
    assert response.status_code == 200, response.text
    model_folder = ModelFolder.of(quick_cut.path, PROJECT, NAME).root
    secrets = [str(quick_cut.path), str(quick_cut.path.resolve()), str(model_folder)]
    secrets += [str(quick_cut.path / ".exports"), ".exports"]
    with tarfile.open(fileobj=io.BytesIO(response.content)) as tar:
        members = tar.getmembers()
        for member in members:
            assert not any(s in member.name for s in secrets), member.name
            if not member.isfile():
                continue
            data = tar.extractfile(member).read()  # type: ignore[union-attr]
            for secret in secrets:
                assert secret.encode() not in data, f"{member.name} names {secret}"
        manifest = json.loads(tar.extractfile("export.json").read())  # type: ignore[union-attr]
    for text in _strings(manifest):
        assert not text.startswith("/"), f"export.json holds the absolute path {text!r}"
    assert manifest["source"] == {
        "project": PROJECT,
        "name": NAME,
        "folder": f"{PROJECT}/models/{NAME}",
        "checkpoint": "checkpoints/0001",
    }
    # The base lives inside the server's art folder here: named relative to it.
    assert manifest["base_model"]["path"] == "base_models/tiny-random"
    if format == "peft":
        assert manifest["base_model"]["referenced_as"] == "base"
        with tarfile.open(fileobj=io.BytesIO(response.content)) as tar:
            config = json.loads(tar.extractfile("adapter_config.json").read())  # type: ignore[union-attr]
        assert config["base_model_name_or_path"] == "base"
    await wait_for(lambda: scratch(quick_cut) == [], "removed after the download")
