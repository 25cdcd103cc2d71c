"""A small client of MLflow's REST API (MLflow 3.x), shared by the metric logger
(``art_core.metrics.mlflow``) and the tracing exporter (``art_core.tracing.mlflow``).

``httpx`` against MLflow's documented routes, no ``mlflow`` package (its dependency set is
heavy and pins versions that clash with ours): the tracking URI and its authorization, typed
errors, the experiment a run or trace goes to (found by name or created).
"""

from __future__ import annotations

import base64
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

logger = logging.getLogger("art_core.metrics")

DEFAULT_TRACKING_URI = "http://127.0.0.1:5000"
DEFAULT_EXPERIMENT_ID = "0"  # MLflow's "Default" experiment
TRACES_PATH = "/v1/traces"
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
        ...              params={"experiment_id": "0"})  # needs a network service: an MLflow server there  # doctest: +SKIP
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


def str_field(body: Mapping[str, Any], *path: str) -> str:
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
        >>> experiment_id_for(MlflowRest("http://127.0.0.1:5000"), "agent-rl")  # needs a network service: an MLflow server there  # doctest: +SKIP
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
            return str_field(found, "experiment", "experiment_id")
        try:
            created = rest.request(
                "POST", "/api/2.0/mlflow/experiments/create", json={"name": name}
            )
        except MlflowError as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            continue
        return str_field(created, "experiment_id")
    raise MlflowError(f"MLflow experiment {name!r} could not be found or created")
