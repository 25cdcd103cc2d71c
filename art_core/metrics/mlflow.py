"""MLflow: each model's metric history (what ``history.jsonl`` holds) as an MLflow run.

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

import logging
import math
import re
import threading
import time
from collections.abc import Mapping
from typing import Any

from art_core.background import Worker
from art_core.metrics.mlflow_rest import (
    ExperimentChoice,
    MlflowError,
    MlflowRest,
    filter_string,
    mlflow_headers,
    resolve_tracking_uri,
    str_field,
)

logger = logging.getLogger("art_core.metrics")

MODEL_TAG = "art.model"  # "project/name": how a model's run is found again
MAX_METRICS_PER_BATCH = 1000  # runs/log-batch limits (mlflow/utils/validation.py)
_METRIC_KEY = re.compile(r"[^\w\-. /]")  # MLflow allows alphanumerics, _ - . space and /


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
        >>> logger.log(model, {"train/reward": 0.4}, step=0)   # needs a network service: an MLflow server there  # doctest: +SKIP
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
            >>> logger.run_id("tests", "tiny")  # needs a network service: an MLflow server  # doctest: +SKIP
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
            run_id = str_field(runs[0], "info", "run_id")
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
        return str_field(created, "run", "info", "run_id")

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
