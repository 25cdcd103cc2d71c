"""MLflow: each model's metric history (what ``history.jsonl`` holds) as an MLflow run, and the
small REST client that ``art_core.tracing.mlflow`` shares.

Everything goes through MLflow's documented REST API with ``httpx`` (no ``mlflow`` package:
its dependency set is heavy and pins versions that clash with ours). One run per model, found
again by its ``art.model`` tag (``project/name``) so a restarted training logs into the same
run. Requests run in a background thread; failures are logged (once per outage), never raised
into training.

Routes used (MLflow 3.x, ``mlflow/server/handlers.py``):
``GET /api/2.0/mlflow/experiments/get-by-name``, ``POST /api/2.0/mlflow/experiments/create``,
``POST /api/2.0/mlflow/runs/search``, ``POST /api/2.0/mlflow/runs/create``,
``POST /api/2.0/mlflow/runs/update``, ``POST /api/2.0/mlflow/runs/log-batch``.
"""

from __future__ import annotations

import base64
import logging
import math
import os
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from art_core.tracing.worker import Worker

logger = logging.getLogger("art_core.metrics")

DEFAULT_TRACKING_URI = "http://127.0.0.1:5000"
DEFAULT_EXPERIMENT_ID = "0"  # MLflow's "Default" experiment
MODEL_TAG = "art.model"  # "project/name": how a model's run is found again
TRACES_PATH = "/v1/traces"
MAX_METRICS_PER_BATCH = 1000  # runs/log-batch limits (mlflow/utils/validation.py)
_METRIC_KEY = re.compile(r"[^\w\-. /]")  # MLflow allows alphanumerics, _ - . space and /
_HOST = re.compile(r"^[A-Za-z0-9][\w.\-]*(:\d+)?(/.*)?$")  # host[:port][/path], no scheme


class MlflowError(RuntimeError):
    """A failed MLflow request: unreachable server, an HTTP error (``status`` and MLflow's
    ``error_code``) or a reply that is not what the API documents.

    Example:
        >>> MlflowError("no such run", status=404, error_code="RESOURCE_DOES_NOT_EXIST").status
        404
    """

    def __init__(
        self, message: str, *, status: int | None = None, error_code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error_code = error_code


def resolve_tracking_uri(uri: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The MLflow server's base URL: ``uri``, else ``$MLFLOW_TRACKING_URI``, else
    ``http://127.0.0.1:5000``. ``host:port`` gets ``http://``; a trailing ``/v1/traces`` (the
    OTLP URL some setups pass) is dropped. Only MLflow *servers* work (HTTP): a ``file:``,
    database or ``databricks`` URI is a ``ValueError`` saying so.

    Example:
        >>> resolve_tracking_uri("localhost:5000/"), resolve_tracking_uri(None, {})
        ('http://localhost:5000', 'http://127.0.0.1:5000')
        >>> resolve_tracking_uri("http://mlflow:5000/v1/traces")
        'http://mlflow:5000'
    """
    env = os.environ if environ is None else environ
    raw = (uri or env.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI).strip()
    url = raw
    if "://" not in raw and _HOST.match(raw) and not raw.startswith("databricks"):
        url = f"http://{raw}"
    if urlsplit(url).scheme.lower() not in ("http", "https"):
        raise ValueError(
            f"MLflow tracking URI {raw!r}: art_core talks to an MLflow tracking server over "
            "HTTP (start one with `mlflow server` or `art-core tracing serve mlflow` and pass "
            "its http:// URL); file, database and databricks URIs are not supported"
        )
    url = url.rstrip("/")
    if url.endswith(TRACES_PATH):
        url = url[: -len(TRACES_PATH)].rstrip("/")
    return url


def mlflow_headers(
    headers: Mapping[str, str] | None = None, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Headers for every request: ``headers``, plus MLflow's own client authentication
    variables unless ``headers`` already authorize: ``MLFLOW_TRACKING_TOKEN`` (bearer) or
    ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD`` (basic).

    Example:
        >>> mlflow_headers({"x-team": "rl"}, {"MLFLOW_TRACKING_TOKEN": "t"})
        {'x-team': 'rl', 'authorization': 'Bearer t'}
    """
    env = os.environ if environ is None else environ
    out = dict(headers or {})
    if any(name.lower() == "authorization" for name in out):
        return out
    token = env.get("MLFLOW_TRACKING_TOKEN")
    user, password = env.get("MLFLOW_TRACKING_USERNAME"), env.get("MLFLOW_TRACKING_PASSWORD")
    if token:
        out["authorization"] = f"Bearer {token}"
    elif user and password:
        basic = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        out["authorization"] = f"Basic {basic}"
    return out


def filter_string(value: str) -> str:
    """``value`` as a quoted string literal of an MLflow search filter.

    Example:
        >>> filter_string("tests/tiny"), filter_string("it's")
        ("'tests/tiny'", '"it\\'s"')
    """
    if "'" not in value:
        return f"'{value}'"
    if '"' not in value:
        return f'"{value}"'
    raise ValueError(f"{value!r} has both quote characters: MLflow's filter cannot match it")


class MlflowRest:
    """A small MLflow REST client: JSON in, a JSON object out, every failure an
    ``MlflowError`` with a message that says what and where. Thread-safe (one ``httpx``
    client); every request bounded by ``timeout_s``.

    Example:
        >>> rest = MlflowRest("http://127.0.0.1:5000", timeout_s=2.0)
        >>> rest.request("GET", "/api/2.0/mlflow/experiments/get",
        ...              params={"experiment_id": "0"})  # doctest: +SKIP
        {'experiment': {'experiment_id': '0', 'name': 'Default', ...}}
        >>> rest.close()
    """

    def __init__(
        self, url: str, headers: Mapping[str, str] | None = None, timeout_s: float = 5.0
    ) -> None:
        self.url = url
        self.client = httpx.Client(
            base_url=url,
            headers=dict(headers or {}),
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 3.0)),
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The reply's JSON object (``{}`` for an empty body); ``MlflowError`` otherwise."""
        try:
            reply = self.client.request(method, path, json=json, params=params)
        except httpx.HTTPError as exc:
            raise MlflowError(
                f"cannot reach MLflow at {self.url} ({method} {path}: {type(exc).__name__}: {exc})"
            ) from exc
        try:
            body = reply.json() if reply.content.strip() else {}
        except ValueError:
            body = None
        if reply.status_code >= 400:
            error = body if isinstance(body, dict) else {}
            code = error.get("error_code")
            message = error.get("message") or reply.text[:300]
            raise MlflowError(
                f"MLflow at {self.url}: {method} {path} -> HTTP {reply.status_code} "
                f"{code or ''}: {message}".replace("  ", " "),
                status=reply.status_code,
                error_code=code if isinstance(code, str) else None,
            )
        if not isinstance(body, dict):
            raise MlflowError(
                f"MLflow at {self.url}: {method} {path} answered {reply.text[:200]!r}, "
                "not a JSON object (is this an MLflow tracking server?)",
                status=reply.status_code,
            )
        return body

    def close(self) -> None:
        self.client.close()


def _str_field(body: Mapping[str, Any], *path: str) -> str:
    """``body[path[0]][path[1]]...`` when it is a non-empty string; ``MlflowError`` else."""
    value: Any = body
    for key in path:
        value = value.get(key) if isinstance(value, Mapping) else None
    if not isinstance(value, str) or not value:
        raise MlflowError(f"MLflow's reply has no {'.'.join(path)}: {str(body)[:200]}")
    return value


@dataclass(frozen=True)
class ExperimentChoice:
    """Which experiment to use, decided without a request: an id, or a name to look up (and
    create when missing) on first use.

    Example:
        >>> ExperimentChoice.choose(None, "agent-rl", {}).name
        'agent-rl'
        >>> ExperimentChoice.choose(None, None, {}).id
        '0'
    """

    id: str | None = None
    name: str | None = None

    @classmethod
    def choose(
        cls,
        experiment_id: str | None,
        experiment_name: str | None,
        environ: Mapping[str, str] | None = None,
    ) -> ExperimentChoice:
        """Arguments first, then ``$MLFLOW_EXPERIMENT_ID``, then ``$MLFLOW_EXPERIMENT_NAME``,
        then MLflow's Default experiment ("0")."""
        if experiment_id is not None and experiment_name is not None:
            raise ValueError("pass experiment_id or experiment_name, not both")
        if experiment_id is not None:
            return cls(id=str(experiment_id))
        if experiment_name:
            return cls(name=experiment_name)
        env = os.environ if environ is None else environ
        if env.get("MLFLOW_EXPERIMENT_ID"):
            return cls(id=env["MLFLOW_EXPERIMENT_ID"])
        if env.get("MLFLOW_EXPERIMENT_NAME"):
            return cls(name=env["MLFLOW_EXPERIMENT_NAME"])
        return cls(id=DEFAULT_EXPERIMENT_ID)

    def resolve(self, rest: MlflowRest) -> str:
        """The experiment id (looks the name up, creating the experiment when missing)."""
        if self.id is not None:
            return self.id
        assert self.name is not None
        return experiment_id_for(rest, self.name)


def experiment_id_for(rest: MlflowRest, name: str) -> str:
    """The id of experiment ``name``, created when missing (``experiments/get-by-name``, then
    ``experiments/create``). A deleted experiment of that name is an error: MLflow keeps the
    name taken until it is restored or purged.

    Example:
        >>> experiment_id_for(MlflowRest("http://127.0.0.1:5000"), "agent-rl")  # doctest: +SKIP
        '1'
    """
    for _ in range(2):  # a second look when another process created it at the same moment
        try:
            found = rest.request(
                "GET", "/api/2.0/mlflow/experiments/get-by-name", params={"experiment_name": name}
            )
        except MlflowError as exc:
            if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
        else:
            experiment = found.get("experiment")
            if isinstance(experiment, Mapping) and experiment.get("lifecycle_stage") == "deleted":
                raise MlflowError(
                    f"MLflow experiment {name!r} is deleted: restore it (MLflow UI, or "
                    "`mlflow experiments restore`) or use another name"
                )
            return _str_field(found, "experiment", "experiment_id")
        try:
            created = rest.request(
                "POST", "/api/2.0/mlflow/experiments/create", json={"name": name}
            )
        except MlflowError as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            continue
        return _str_field(created, "experiment_id")
    raise MlflowError(f"MLflow experiment {name!r} could not be found or created")


def numeric_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of a record (bools and NaN/inf out), keys made valid MLflow metric
    names (characters other than letters, digits, ``_ - . /`` and space become ``_``).

    Example:
        >>> numeric_metrics({"train/reward": 0.5, "ok": True, "loss": float("nan"), "a:b": 1})
        {'train/reward': 0.5, 'a_b': 1.0}
    """
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if not math.isfinite(value):
            continue
        out[_METRIC_KEY.sub("_", str(key))[:250]] = float(value)
    return out


class _Outage:
    """Logs a failing backend once per outage (and once when it works again)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.failures = 0

    def failed(self, error: str) -> None:
        self.failures += 1
        if self.failures == 1:
            logger.warning("%s failed (%s); retrying with the next record", self.what, error)

    def succeeded(self) -> None:
        if self.failures:
            logger.warning("%s works again", self.what)
        self.failures = 0


class MlflowLogger:
    """Log metric records of ``TrainableModel`` s to MLflow: one run per model (tag
    ``art.model`` = ``project/name``, run name = the model's name), its numeric metrics with
    their step, and ``base_model`` / ``art_project`` as parameters.

    Construction sends nothing (an unreachable server costs training nothing); requests run in
    a background thread, each bounded by ``timeout_s`` (generous: MLflow writes to its
    database before it answers, seconds on a loaded machine; connecting takes at most 3 s).

    Example:
        >>> logger = MlflowLogger("http://127.0.0.1:5000", experiment_name="agent-rl")
        >>> logger.log(model, {"train/reward": 0.4}, step=0)   # doctest: +SKIP
        >>> logger.close(5.0)
    """

    def __init__(
        self,
        tracking_uri: str | None = None,
        experiment_name: str | None = None,
        experiment_id: str | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.tracking_uri = resolve_tracking_uri(tracking_uri)
        self.experiment = ExperimentChoice.choose(experiment_id, experiment_name)
        self.rest = MlflowRest(self.tracking_uri, mlflow_headers(headers), timeout_s)
        self.worker = Worker(max_queue_size=10_000, name="art-mlflow-metrics")
        self._lock = threading.Lock()  # runs are resolved from the worker and from tracing
        self._experiment_id: str | None = None
        self._runs: dict[str, str] = {}
        self._params_logged: set[str] = set()
        self._outage = _Outage(f"metrics: MLflow logging to {self.tracking_uri}")
        self.logged = 0  # records sent
        self.failed = 0  # records that could not be sent

    # -------------------------------------------------------------- caller side
    def log(self, model: Any, metrics: Mapping[str, Any], step: int) -> None:
        """Queue one record of ``model`` at ``step`` (the history's step)."""
        project = str(getattr(model, "project", None) or "default")
        name = str(getattr(model, "name", None) or "model")
        base_model = getattr(model, "base_model", None)
        values = numeric_metrics(metrics)
        self.worker.submit(lambda: self._log(project, name, base_model, values, step))

    def run_id(self, project: str, name: str) -> str | None:
        """The id of model ``project/name``'s run, created when missing; None when MLflow
        cannot be reached (logged). Blocks for at most a few request timeouts: call it from a
        background thread.

        Example:
            >>> logger.run_id("tests", "tiny")  # doctest: +SKIP
            'fa8ed60b3e2641779cd114d736fcd7ad'
        """
        try:
            return self._ensure_run(project, name)
        except Exception as exc:
            self._outage.failed(f"{type(exc).__name__}: {exc}")
            return None

    # -------------------------------------------------------------- worker side
    def experiment_id(self) -> str:
        """The experiment's id (looked up, or created, on first use)."""
        with self._lock:
            if self._experiment_id is None:
                self._experiment_id = self.experiment.resolve(self.rest)
            return self._experiment_id

    def _ensure_run(self, project: str, name: str) -> str:
        key = f"{project}/{name}"
        with self._lock:
            found = self._runs.get(key)
        if found is not None:
            return found
        experiment_id = self.experiment_id()
        with self._lock:  # one lookup at a time: two threads must not create two runs
            found = self._runs.get(key)
            if found is None:
                found = self._find_or_create_run(experiment_id, project, name)
                self._runs[key] = found
            return found

    def _find_or_create_run(self, experiment_id: str, project: str, name: str) -> str:
        key = f"{project}/{name}"
        reply = self.rest.request(
            "POST",
            "/api/2.0/mlflow/runs/search",
            json={
                "experiment_ids": [experiment_id],
                "filter": f"tags.`{MODEL_TAG}` = {filter_string(key)}",
                "order_by": ["attributes.start_time ASC"],  # the first one, if a race made two
                "max_results": 1,
            },
        )
        runs = reply.get("runs")
        if isinstance(runs, list) and runs:
            run_id = _str_field(runs[0], "info", "run_id")
            if runs[0].get("info", {}).get("status") != "RUNNING":  # a resumed training
                self.rest.request(
                    "POST",
                    "/api/2.0/mlflow/runs/update",
                    json={"run_id": run_id, "status": "RUNNING"},
                )
            return run_id
        created = self.rest.request(
            "POST",
            "/api/2.0/mlflow/runs/create",
            json={
                "experiment_id": experiment_id,
                "run_name": name,
                "start_time": int(time.time() * 1000),
                "tags": [
                    {"key": MODEL_TAG, "value": key},
                    {"key": "art.project", "value": project},
                    {"key": "mlflow.source.name", "value": "art_core"},
                ],
            },
        )
        return _str_field(created, "run", "info", "run_id")

    def _log(
        self,
        project: str,
        name: str,
        base_model: Any,
        values: dict[str, float],
        step: int,
    ) -> None:
        try:
            run_id = self._ensure_run(project, name)
            body: dict[str, Any] = {"run_id": run_id}
            key = f"{project}/{name}"
            if key not in self._params_logged:
                # Parameters are immutable in MLflow: the same value again is accepted, so a
                # resumed run logs them again without harm.
                params = {"art_project": project}
                if base_model:
                    params["base_model"] = str(base_model)
                body["params"] = [{"key": k, "value": v} for k, v in params.items()]
            now = int(time.time() * 1000)
            items = [
                {"key": k, "value": v, "timestamp": now, "step": int(step)}
                for k, v in values.items()
            ]
            for start in range(0, max(len(items), 1), MAX_METRICS_PER_BATCH):
                body["metrics"] = items[start : start + MAX_METRICS_PER_BATCH]
                self.rest.request("POST", "/api/2.0/mlflow/runs/log-batch", json=body)
                body.pop("params", None)
            self._params_logged.add(key)
        except Exception as exc:  # logged once per outage, never raised into training
            self.failed += 1
            self._outage.failed(f"{type(exc).__name__}: {exc}")
            return
        self.logged += 1
        self._outage.succeeded()

    def _finish_all(self) -> None:
        with self._lock:
            runs = list(self._runs.values())
        for run_id in runs:
            try:
                self.rest.request(
                    "POST",
                    "/api/2.0/mlflow/runs/update",
                    json={
                        "run_id": run_id,
                        "status": "FINISHED",
                        "end_time": int(time.time() * 1000),
                    },
                )
            except MlflowError as exc:
                logger.warning("metrics: MLflow run %s could not be finished: %s", run_id, exc)

    # -------------------------------------------------------------- lifecycle
    def flush(self, timeout_s: float) -> bool:
        """Wait until every queued record was sent (or failed); False on timeout."""
        return self.worker.flush(timeout_s)

    def close(self, timeout_s: float) -> None:
        """Send what is queued, mark the runs FINISHED (waiting at most ``timeout_s``)."""
        self.worker.submit(self._finish_all)
        self.worker.close(timeout_s)
        self.rest.close()

    def stats(self) -> dict[str, int]:
        return {"logged": self.logged, "failed": self.failed, "dropped": self.worker.dropped}
