"""Local tracing servers with a web UI, each in its own virtual environment: MLflow and Phoenix.

Both install from PyPI and run offline, but their dependency sets are heavy and pin versions
that clash with ours (MLflow pins its own OpenTelemetry and pandas ranges, Phoenix its own
FastAPI and SQLAlchemy), so each gets a venv under the runtimes folder
(``$ART_CORE_RUNTIMES_DIR``, default ``~/.cache/art_core/runtimes``), like vLLM's runtime.

``art-core tracing install mlflow phoenix`` creates them; ``art-core tracing serve mlflow``
runs one in the foreground; ``TracingServer`` runs one for a test or a script.

Example:
    >>> with TracingServer("mlflow", data_dir=Path("/tmp/mlflow-data")) as server:  # needs an install: MLflow's venv  # doctest: +SKIP
    ...     tracing.enable("mlflow", endpoint=server.url)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from art_core import venvs
from art_core.engines.process import free_port
from art_core.engines.vllm_runtime import runtimes_dir
from art_core.files import atomic_write_text

MARKER = ".art-tracing-server.json"
START_TIMEOUT_S = 180.0  # the first start migrates an empty database (Phoenix: ~20 s here)


@dataclass(frozen=True)
class ServerSpec:
    """How to install, start and probe one tracing server."""

    pins: tuple[str, ...]
    default_port: int
    health_path: str


SERVERS: dict[str, ServerSpec] = {
    "mlflow": ServerSpec(("mlflow==3.17.2",), 5000, "/health"),
    "phoenix": ServerSpec(("arize-phoenix==20.26.1",), 6006, "/healthz"),
}


def _spec(name: str) -> ServerSpec:
    if name not in SERVERS:
        raise ValueError(f"unknown tracing server {name!r}; known: {sorted(SERVERS)}")
    return SERVERS[name]


def server_dir(name: str) -> Path:
    """The virtual environment of tracing server ``name``.

    Example:
        >>> server_dir("mlflow").name
        'tracing-mlflow'
    """
    _spec(name)
    return runtimes_dir() / f"tracing-{name}"


def is_installed(name: str) -> bool:
    """Whether ``name``'s venv exists with the pinned versions.

    Example:
        >>> isinstance(is_installed("phoenix"), bool)
        True
    """
    marker = server_dir(name) / MARKER
    try:
        return bool(json.loads(marker.read_text()).get("pins") == list(_spec(name).pins))
    except (OSError, ValueError):
        return False


def install_tracing_server(name: str, *, quiet: bool = True) -> Path:
    """Create ``name``'s venv with its pinned packages (idempotent); returns the folder.

    Example:
        >>> install_tracing_server("mlflow")  # needs an install: this is the install (a venv from PyPI)  # doctest: +SKIP
        PosixPath('/root/.cache/art_core/runtimes/tracing-mlflow')
    """
    spec = _spec(name)
    target = server_dir(name)
    if is_installed(name):
        return target
    if target.exists():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    python = venvs.create_venv(target)
    venvs.install(python, spec.pins, quiet=quiet)
    atomic_write_text(target / MARKER, json.dumps({"pins": list(spec.pins)}))
    return target


def server_command(
    name: str, *, host: str, port: int, data_dir: Path
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that start ``name`` on ``host:port``, keeping its
    data (database, artifacts) in ``data_dir``. Nothing of theirs phones home.

    Example:
        >>> command, env = server_command("phoenix", host="127.0.0.1", port=6006,
        ...                               data_dir=Path("/tmp/phoenix"))
        >>> command[-1], env["PHOENIX_PORT"]
        ('serve', '6006')
    """
    _spec(name)
    bin_dir = server_dir(name) / "bin"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    if name == "mlflow":
        command = [
            str(bin_dir / "mlflow"),
            "server",
            "--host",
            host,
            "--port",
            str(port),
            "--backend-store-uri",
            f"sqlite:///{data_dir / 'mlflow.db'}",
            "--default-artifact-root",
            str(data_dir / "artifacts"),
            "--workers",
            "1",
        ]
        env["MLFLOW_DISABLE_TELEMETRY"] = "true"
        # No background job consumers (7 processes; they make a stop take seconds): the
        # server's judge/optimizer jobs are not used by tracing.
        env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
        env["DO_NOT_TRACK"] = "true"
        return command, env
    env.update(
        PHOENIX_HOST=host,
        PHOENIX_PORT=str(port),
        PHOENIX_GRPC_PORT=str(free_port(host)),
        PHOENIX_WORKING_DIR=str(data_dir),
        PHOENIX_TELEMETRY_ENABLED="false",
        PHOENIX_ALLOW_EXTERNAL_RESOURCES="false",
    )
    return [str(bin_dir / "phoenix"), "serve"], env


class TracingServer:
    """Run a tracing server (installed with ``install_tracing_server``) until closed.

    ``url`` is its base URL (``http://127.0.0.1:PORT``); OTLP goes to ``url + "/v1/traces"``.
    ``data_dir`` defaults to a temporary folder removed on close. The server's output goes to
    ``data_dir/server.log``, which the start error quotes.

    Example:
        >>> with TracingServer("phoenix") as phoenix:  # needs an install: Phoenix's venv  # doctest: +SKIP
        ...     print(phoenix.url)
        http://127.0.0.1:41235
    """

    def __init__(
        self,
        name: str,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        data_dir: Path | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        self.spec = _spec(name)
        self.name = name
        self.host = host
        self.port = port or free_port(host)
        self._temporary = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix=f"art-{name}-"))
        self.start_timeout_s = start_timeout_s
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "server.log"

    def start(self) -> TracingServer:
        """Start the process and wait until its health endpoint answers."""
        if not is_installed(self.name):
            raise RuntimeError(
                f"the {self.name} tracing server is not installed: "
                f"art-core tracing install {self.name}"
            )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command, env = server_command(
            self.name, host=self.host, port=self.port, data_dir=self.data_dir
        )
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                command,
                env=env,
                cwd=self.data_dir,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + self.start_timeout_s
        health = self.url + self.spec.health_path
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                with urllib.request.urlopen(health, timeout=2) as reply:
                    if reply.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        tail = self.log_path.read_text(errors="replace")[-3000:]
        self.close()
        raise RuntimeError(f"{self.name} did not become healthy at {health}:\n{tail}")

    def close(self) -> None:
        """Stop the server (its whole process group) and drop a temporary data folder."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            try:
                os.killpg(process.pid, 15)
                process.wait(timeout=15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(process.pid, 9)
                except ProcessLookupError:
                    pass
                process.wait(timeout=15)
        if self._temporary:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> TracingServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
