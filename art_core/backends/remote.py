"""``RemoteBackend``: the ``LocalBackend`` API against an ``art-core serve`` server over HTTP.

Rollouts talk to the server's gateway directly (``model.inference_base_url`` points there,
the token is the API key); ``register``, ``train``, ``get_step``, ``log``,
``delete_checkpoints`` and the capture of rollout calls go through its ``/api``.

A training step runs on the server as a job of its own. Its progress streams back as
newline-delimited JSON (one record per micro-batch and optimizer step, then the result) and
drives a progress bar. If the connection drops, the step goes on; the client reattaches to
the job's stream (or reads its outcome) until ``reconnect_timeout``. The job id is chosen
here, so a request retried after a drop attaches to the same job and never trains twice.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx
from tqdm.auto import tqdm

from art_core.backends.base import BackendBase, ProgressCallback
from art_core.chat_formats import chat_format_settings
from art_core.clients import shared_ssl_context
from art_core.export.api import ExportFormat, ExportResult
from art_core.export.manifest import MANIFEST_FILE
from art_core.export.staging import build_atomically, check_out, final_path, scratch_dir
from art_core.metrics import hooks as metric_hooks
from art_core.sft.data import check_demonstration, demonstrations
from art_core.tracing import hooks as tracing
from art_core.trajectories import LLMCall, TrajectoryGroup, new_id, require_finished

if TYPE_CHECKING:
    from art_core.model import TrainableModel
    from art_core.sft.data import SFTData
    from art_core.training.config import SFTConfig, TrainConfig, TrainResult

TOKEN_ENV = "ART_CORE_TOKEN"
# Connection-level failures after which the request may or may not have reached the server.
_DROPPED = (httpx.TransportError,)
# Failures where the request certainly was not processed: safe to resend anything.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
_RETRY_STATUS = frozenset({502, 503, 504})
# What an export download may be unless told otherwise (a merged 7B model in bf16 is ~15 GB).
DEFAULT_MAX_EXPORT_BYTES = 64 * 1024**3
logger = logging.getLogger(__name__)


class RemoteError(RuntimeError):
    """The server answered with an error (``status``, its message, the field it names)."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.message, self.param = status, message, param


class RemoteInvalidRequest(RemoteError, ValueError):
    """400/409/413/422: the request itself is wrong (a ``ValueError``, as locally)."""


class RemoteAuthError(RemoteError, PermissionError):
    """401: missing or wrong token."""


class TrainingInterrupted(RuntimeError):
    """The server stopped during the step; the model stayed at its previous step."""


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        error = response.json().get("error") or {}
        message, param = str(error.get("message", response.text)), error.get("param")
    except (json.JSONDecodeError, AttributeError, UnicodeDecodeError):
        message, param = response.text[:500], None
    status = response.status_code
    if status == 401:
        raise RemoteAuthError(status, message, param)
    if status in (400, 409, 413, 422):
        raise RemoteInvalidRequest(status, message, param)
    raise RemoteError(status, message, param)


def _config_payload(model: TrainableModel) -> dict[str, Any]:
    """The model's config as the server stores it: a JSON object ({} for none)."""
    config = model.config_json()
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise ValueError(
            f"model {model.name!r}: a remote backend stores config as a JSON object, got "
            f"{type(config).__name__}"
        )
    return config


class RemoteBackend(BackendBase):
    """Serve and train models on an ``art-core serve`` server.

    Example:
        >>> import art_core as art
        >>> backend = RemoteBackend("http://gpu-box:7999")  # the token: $ART_CORE_TOKEN
        >>> backend.base_url
        'http://gpu-box:7999/v1'
        >>> model = art.TrainableModel(name="agent-001", project="demo", base_model="smollm2-135m")
        >>> await model.register(backend)  # needs a network service: an `art-core serve` server  # doctest: +SKIP
        >>> async with art.capture(model) as run: ...  # rollouts use the server's gateway  # needs a network service  # doctest: +SKIP
        >>> await model.train(groups)  # needs a network service  # doctest: +SKIP
    """

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:7999",
        token: str | None = None,
        *,
        timeout: float = 60.0,
        reconnect_timeout: float = 600.0,
        progress: bool = True,
        on_progress: ProgressCallback | None = None,
    ) -> None:
        root = base_url.rstrip("/").removesuffix("/v1").rstrip("/")
        if not root.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        self.root = root
        self.token = token if token is not None else os.environ.get(TOKEN_ENV) or None
        self.timeout = timeout
        self.reconnect_timeout = reconnect_timeout
        self.progress = progress
        # Called with every progress record of every training step (after the progress bar).
        self.on_progress = on_progress
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        # The models registered through this backend: their shared clients close with it.
        self._registered: dict[tuple[str, str], TrainableModel] = {}

    async def __aenter__(self) -> RemoteBackend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def base_url(self) -> str:
        """The server's OpenAI base URL (``.../v1``), which rollouts use."""
        return f"{self.root}/v1"

    # ------------------------------------------------------------------------------ http
    def _http(self) -> httpx.AsyncClient:
        # An httpx client belongs to the event loop it first ran on: one per loop.
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
            self._client = httpx.AsyncClient(
                base_url=self.root,
                headers=headers,
                timeout=httpx.Timeout(self.timeout, connect=10.0),
                verify=shared_ssl_context(),
            )
            self._client_loop = loop
        return self._client

    async def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        idempotent: bool,
        attempts: int = 6,
        params: dict[str, str] | None = None,
        read_timeout_s: float | None = None,
    ) -> Any:
        """Send a request; resend it after connection failures when that is safe."""
        content = None if body is None else json.dumps(body).encode()
        headers = {"content-type": "application/json"} if content is not None else None
        delay = 0.25
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                extra: dict[str, Any] = {}
                if read_timeout_s is not None:
                    extra["timeout"] = read_timeout_s
                response = await self._http().request(
                    method, path, content=content, headers=headers, params=params, **extra
                )
            except _NOT_SENT:
                if last:
                    raise
            except _DROPPED:
                if last or not idempotent:
                    raise
            else:
                if response.status_code not in _RETRY_STATUS or last:
                    _raise_for(response)
                    return response.json()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
        raise AssertionError("unreachable")

    @staticmethod
    def _model_path(model: TrainableModel) -> str:
        return f"/api/models/{quote(model.project, safe='')}/{quote(model.name, safe='')}"

    # ------------------------------------------------------------------------------ register
    async def register(self, model: TrainableModel) -> None:
        """Load ``model`` on the server (resuming from its latest checkpoint) and point its
        inference settings at the server's gateway."""
        info = await self._request(
            "POST",
            "/api/models/register",
            {
                "name": model.name,
                "project": model.project,
                "base_model": model.base_model,
                "config": _config_payload(model),
                **chat_format_settings(getattr(model, "_internal_config", None)),
            },
            idempotent=True,  # registering twice is the same as once
        )
        model.inference_base_url = self.base_url
        model.inference_api_key = self.token or model.inference_api_key or "art-remote"
        model.inference_model_name = str(info.get("inference_model_name") or model.name)
        self._registered[(model.project, model.name)] = model

    # ------------------------------------------------------------------------------ capture
    async def rollout_calls(
        self, model: TrainableModel, rollout_id: str, *, release: bool = False
    ) -> list[LLMCall]:
        path = f"{self._model_path(model)}/rollouts/{quote(rollout_id, safe='')}"
        if release:
            # Safe to resend: a released rollout is read back from the server's disk record.
            data = await self._request("POST", f"{path}/release", {}, idempotent=True)
        else:
            data = await self._request("GET", f"{path}/calls", idempotent=True)
        return [LLMCall.model_validate(call) for call in data["calls"]]

    # ------------------------------------------------------------------------------ training
    async def train(
        self,
        model: TrainableModel,
        trajectory_groups: Iterable[TrajectoryGroup],
        config: TrainConfig | None = None,
        *,
        on_progress: ProgressCallback | None = None,
        serve_while_training: bool = False,
        **overrides: Any,
    ) -> TrainResult:
        """One training step on the server, its progress streamed back (see the module)."""
        config = self.train_config(config, overrides, model=model)
        groups = list(trajectory_groups)
        require_finished(groups)
        payload = {
            "groups": [g.model_dump(mode="json") for g in groups],
            "config": config.model_dump(mode="json"),
            "serve_while_training": serve_while_training,
        }
        started = time.time()
        result = await self._train_job(model, "train", payload, on_progress)
        # Traces and metrics go where the rollouts were traced: this process, not the server.
        tracing.train_step_finished(model, groups, config, result, started)
        return result

    async def train_sft(
        self,
        model: TrainableModel,
        trajectories: SFTData,
        config: SFTConfig | None = None,
        *,
        on_progress: ProgressCallback | None = None,
        **overrides: Any,
    ) -> TrainResult:
        """Supervised epochs on the server (``LocalBackend.train_sft`` there), streamed like a
        ``train`` step. Files are read here; each record is checked here and sent with its
        label, so an error on the server still names ``chat.jsonl:7``."""

        config = self.sft_config(config, overrides)
        demos = await asyncio.to_thread(demonstrations, trajectories)
        for demo in demos:
            check_demonstration(demo, config.assistant_turns)
        if not demos:
            raise ValueError("train_sft needs at least one record to train on")
        payload = {
            "trajectories": [demo.trajectory.model_dump(mode="json") for demo in demos],
            "labels": [demo.label for demo in demos],
            "config": config.model_dump(mode="json"),
        }
        started = time.time()
        result = await self._train_job(model, "train_sft", payload, on_progress)
        tracing.train_step_finished(model, [], config, result, started)
        return result

    async def _train_job(
        self,
        model: TrainableModel,
        route: str,
        body: dict[str, Any],
        on_progress: ProgressCallback | None,
    ) -> TrainResult:
        """Run a training call (``train``, ``train_sft``) as a server job and follow it."""
        # Pydantic models: kept off `import art_core` (~15 ms).
        from art_core.training.config import TrainResult

        job_id = new_id("job")
        payload = {"job_id": job_id, **body}
        callbacks = [c for c in (self.on_progress, on_progress) if c is not None]

        def report(event: dict[str, Any]) -> None:
            for callback in callbacks:
                callback(event)

        bar = tqdm(
            total=None,
            desc=f"train {model.name}",
            unit="batch",
            disable=not self.progress,
            leave=False,
        )
        try:
            outcome = await self._follow_job(model, job_id, payload, bar, report, route=route)
        except asyncio.CancelledError:
            # The caller gave up on the step (task cancelled, Ctrl-C): stop it on the server
            # too, rather than let it train on unseen. A dropped connection is not this: the
            # step goes on and the client reattaches.
            await asyncio.shield(self._cancel_quietly(job_id))
            raise
        finally:
            bar.close()
        result = TrainResult.model_validate(outcome)
        metric_hooks.train_step_finished(model, result.metrics, result.step)
        return result

    async def _follow_job(
        self,
        model: TrainableModel,
        job_id: str,
        payload: dict[str, Any],
        bar: Any,
        report: ProgressCallback,
        *,
        route: str = "train",
    ) -> dict[str, Any]:
        """Start (or attach to) the job and follow its stream to the outcome, reattaching
        after dropped connections until the server has been unreachable for
        ``reconnect_timeout``."""
        content = json.dumps(payload).encode()
        seen = 0  # the next progress event wanted
        accepted = False  # the server acknowledged the job
        deadline = time.monotonic() + self.reconnect_timeout
        delay = 0.25
        while True:
            if accepted:
                request = self._http().build_request(
                    "GET", f"/api/jobs/{job_id}/events", params={"after": seen}
                )
            else:
                request = self._http().build_request(
                    "POST",
                    f"{self._model_path(model)}/{route}",
                    content=content,
                    headers={"content-type": "application/json"},
                )
            try:
                response = await self._http().send(request, stream=True)
                try:
                    if response.status_code == 404 and accepted:
                        raise RemoteError(404, f"the server lost job {job_id}")
                    if response.status_code >= 400 and response.status_code not in _RETRY_STATUS:
                        await response.aread()
                        _raise_for(response)
                    if response.status_code < 400:
                        async for line in response.aiter_lines():
                            if not line.strip():
                                continue
                            event = json.loads(line)
                            kind = event.get("event")
                            seq = event.get("seq")
                            # The server is reachable (heartbeats count): the clock and the
                            # backoff restart from here for the next drop.
                            deadline = time.monotonic() + self.reconnect_timeout
                            delay = 0.25
                            if kind == "result":
                                return dict(event["result"])
                            if kind == "error":
                                raise self._job_error(event)
                            if isinstance(seq, int):
                                if seq < seen:
                                    continue  # replayed after a reattach
                                seen = seq + 1
                                accepted = True
                            self._show(event, bar, model)
                            if kind not in ("heartbeat", "job"):
                                report(event)
                finally:
                    await response.aclose()
            except _DROPPED:
                pass  # the step goes on server-side: reattach below
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"lost the connection to {self.root} during training job {job_id} for "
                    f"{self.reconnect_timeout:.0f} s; the server may still finish it: "
                    f"await backend.job_status({job_id!r})"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def _cancel_quietly(self, job_id: str) -> None:
        try:
            await asyncio.wait_for(self.cancel_job(job_id, wait_s=0), timeout=10)
        except Exception as exc:  # the server may be gone: nothing more to stop
            logger.warning("could not cancel training job %s on the server: %s", job_id, exc)

    async def cancel_job(self, job_id: str, *, wait_s: float = 60.0) -> dict[str, Any]:
        """Cancel a training job on the server; its summary once it ended (or after
        ``wait_s``). A cancelled step writes no checkpoint: the model stays at its previous
        step and serves it. Cancelling the task that awaits ``train`` does this too.

        Example:
            >>> (await backend.cancel_job("job_3f9c..."))["status"]  # needs a network service: an `art-core serve` server  # doctest: +SKIP
            'cancelled'
        """
        result: dict[str, Any] = await self._request(
            "DELETE",
            f"/api/jobs/{quote(job_id, safe='')}",
            params={"wait": str(wait_s)},
            idempotent=True,
            read_timeout_s=wait_s + 30,
        )
        return result

    @staticmethod
    def _job_error(event: dict[str, Any]) -> Exception:
        # The training package: kept off `import art_core`.
        from art_core.training.cancel import TrainingCancelled

        error = event.get("error") or {}
        kind, message = str(error.get("type", "Error")), str(error.get("message", ""))
        # Imported here: art_core.training loads torch, which a remote client need not.

        if event.get("status") == "cancelled" or kind == "TrainingCancelled":
            return TrainingCancelled(message)
        if event.get("status") == "interrupted" or kind == "TrainingInterrupted":
            return TrainingInterrupted(message)
        if kind in ("ValueError", "TypeError"):
            return ValueError(f"training failed on the server: {kind}: {message}")
        return RuntimeError(f"training failed on the server: {kind}: {message}")

    @staticmethod
    def _show(event: dict[str, Any], bar: Any, model: TrainableModel) -> None:
        kind = event.get("event")
        if kind == "started":
            bar.set_description(f"train {model.name} step {int(event.get('step', 0)) + 1}")
        elif kind == "micro_batch":
            total = event.get("num_micro_batches")
            if isinstance(total, int) and bar.total != total:
                bar.total = total
                bar.refresh()
            bar.update(1)
            if isinstance(event.get("loss"), int | float):
                bar.set_postfix(loss=f"{event['loss']:.4f}")

    async def job_status(self, job_id: str) -> dict[str, Any]:
        """A training job's status and outcome (``succeeded`` / ``failed`` / ``interrupted``).

        Example:
            >>> (await backend.job_status("job_3f9c..."))["status"]  # needs a network service: an `art-core serve` server  # doctest: +SKIP
            'succeeded'
        """
        result: dict[str, Any] = await self._request(
            "GET", f"/api/jobs/{quote(job_id, safe='')}", idempotent=True
        )
        return result

    # ------------------------------------------------------------------------------ the rest
    async def get_step(self, model: TrainableModel) -> int:
        data = await self._request("GET", f"{self._model_path(model)}/step", idempotent=True)
        return int(data["step"])

    async def log(
        self,
        model: TrainableModel,
        trajectory_groups: Iterable[TrajectoryGroup] | None = None,
        *,
        split: str = "val",
        metrics: Mapping[str, float | None] | None = None,
        step: int | None = None,
    ) -> None:
        groups = list(trajectory_groups or [])
        require_finished(groups)
        body: dict[str, Any] = {
            "groups": [g.model_dump(mode="json") for g in groups],
            "split": split,
        }
        if metrics is not None:
            body["metrics"] = dict(metrics)
        if step is not None:
            body["step"] = step
        await self._request(
            "POST",
            f"{self._model_path(model)}/log",
            body,
            idempotent=False,  # appends: resent only when it surely did not arrive
        )

    async def delete_checkpoints(
        self, model: TrainableModel, best_checkpoint_metric: str = "val/reward"
    ) -> list[int]:
        data = await self._request(
            "POST",
            f"{self._model_path(model)}/delete_checkpoints",
            {"best_checkpoint_metric": best_checkpoint_metric},
            idempotent=True,  # deleting what is already gone deletes nothing more
        )
        return [int(step) for step in data["deleted"]]

    # ------------------------------------------------------------------------------ export
    async def export(
        self,
        model: TrainableModel,
        out: str | Path,
        *,
        format: ExportFormat = "peft",
        step: int | None = None,
        best: str | None = None,
        higher_is_better: bool | None = None,
        overwrite: bool = False,
        gguf_type: str = "f16",
        max_bytes: int = DEFAULT_MAX_EXPORT_BYTES,
    ) -> ExportResult:
        """The server builds the export (as ``LocalBackend.export`` does there) and sends it
        as one tar; it is downloaded and unpacked beside ``out``, checked (only files, no
        path outside the folder, at most ``max_bytes``), then renamed into place. ``out``
        existing is refused before anything is asked (unless ``overwrite``); a failure leaves
        nothing at ``out``.

        Example:
            >>> await backend.export(model, "exports/agent", format="merged")  # needs a network service: an `art-core serve` server  # doctest: +SKIP
            ExportResult(path=PosixPath('/home/me/exports/agent'), format='merged', ...)
        """
        from art_core.export.archive import relocate, unpack  # tarfile: kept off `import art_core`

        target = final_path(out)
        check_out(target, overwrite)
        body = {
            "format": format,
            "step": step,
            "best": best,
            "higher_is_better": higher_is_better,
            "gguf_type": gguf_type,
        }
        download = scratch_dir(target, "download")
        archive = download / "export.tar"
        try:
            async with self._http().stream(
                "POST",
                f"{self._model_path(model)}/export",
                content=json.dumps(body).encode(),
                headers={"content-type": "application/json"},
                # Building a merged model or a GGUF takes a while before the first byte.
                timeout=httpx.Timeout(None, connect=10.0),
            ) as response:
                if response.status_code >= 400:
                    await response.aread()
                    _raise_for(response)
                length = int(response.headers.get("content-length") or 0)
                if length > max_bytes:
                    raise ValueError(
                        f"the export is {length} bytes, more than max_bytes={max_bytes}"
                    )
                received = 0
                with archive.open("wb") as file:
                    async for chunk in response.aiter_bytes():
                        received += len(chunk)
                        if received > max_bytes:
                            raise ValueError(f"the export is more than max_bytes={max_bytes}")
                        await asyncio.to_thread(file.write, chunk)

            def build(staging: Path) -> None:
                unpack(archive, staging, max_bytes=max_bytes)
                relocate(staging, target)

            await asyncio.to_thread(build_atomically, target, build, overwrite=overwrite)
        finally:
            await asyncio.to_thread(shutil.rmtree, download, True)
        manifest = json.loads((target / MANIFEST_FILE).read_text(encoding="utf-8"))
        base = manifest.get("base_model") or {}
        return ExportResult(
            path=target,
            format=str(manifest.get("format", format)),
            step=int(manifest["step"]),
            base_model=str(base.get("hub_id") or base.get("name") or ""),
            metrics=dict(manifest.get("metrics") or {}),
        )

    async def close(self) -> None:
        """Close the HTTP connections, the registered models' shared clients' too (the
        server and its models keep running)."""
        registered, self._registered = list(self._registered.values()), {}
        for model in registered:
            await model.close_openai_client()
        if self._client is not None:
            client, self._client = self._client, None
            try:
                await client.aclose()
            except RuntimeError:  # its event loop is gone already
                pass
