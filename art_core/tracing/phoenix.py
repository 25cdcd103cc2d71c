"""Arize Phoenix: a trace per rollout (OpenInference span kinds, messages, tools, sessions),
reward and RULER score as Phoenix span annotations on the rollout's root span.

Spans go over OTLP/HTTP to ``{endpoint}/v1/traces`` from a private ``TracerProvider`` whose
resource names the Phoenix project (``openinference.project.name``); Phoenix renders them from
the OpenInference attributes every ``OtelSink`` span carries. Scores go through Phoenix's REST
API, ``POST /v1/span_annotations`` (``annotator_kind`` ``LLM`` for RULER, else ``CODE``), with a fixed
``identifier``: Phoenix upserts on (name, span, identifier), so re-scoring a rollout replaces
its annotation instead of adding one.

Phoenix ingests spans asynchronously (an OTLP request returns before the span is in its
database) and rejects a synchronous annotation of an unknown span with 404, so an annotation
is sent after the rollout's spans were flushed, retried briefly on 404, and finally handed to
Phoenix's own queue (``sync=false``), which keeps retrying unknown spans for minutes.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanContext

from art_core.clients import shared_ssl_context
from art_core.tracing.exporters import otlp_exporter
from art_core.tracing.otel import OtelSink
from art_core.tracing.settings import TracingSettings
from art_core.tracing.tree import Score, ScoreUpdate, SpanNode

logger = logging.getLogger("art_core.tracing")

DEFAULT_ENDPOINT = "http://127.0.0.1:6006"
DEFAULT_PROJECT = "default"  # Phoenix's own default project (phoenix.config.DEFAULT_PROJECT_NAME)
PROJECT_ATTRIBUTE = "openinference.project.name"  # read by phoenix.utilities.project
TRACES_PATH = "/v1/traces"
ANNOTATIONS_PATH = "/v1/span_annotations"
# Who gave a score (Phoenix's annotator kinds): RULER's verdict is an LLM judge's; the reward
# and any other score were set by the training code.
ANNOTATOR_KINDS = {"ruler_score": "LLM"}
ANNOTATOR_KIND = "CODE"
# Ours, not "" (what Phoenix's UI uses without auth): a person annotating "reward" in the UI
# gets an annotation of their own instead of overwriting ours, or the other way round.
IDENTIFIER = "art-core"
SPAN_WAIT_S = 10.0  # how long a synchronous annotation waits for its span to be ingested
SLOW_INGESTION_S = 60.0  # after a span took longer: queue annotations on Phoenix this long
MAX_BACKOFF_S = 60.0


def phoenix_base_url(endpoint: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """Phoenix's base URL: ``endpoint``, else ``$PHOENIX_COLLECTOR_ENDPOINT``, else the local
    default; a trailing ``/v1/traces`` (the collector URL some setups pass) is dropped.

    Example:
        >>> phoenix_base_url("http://phoenix:6006/v1/traces/")
        'http://phoenix:6006'
        >>> phoenix_base_url(None, {})
        'http://127.0.0.1:6006'
    """
    env = os.environ if environ is None else environ
    url = (endpoint or env.get("PHOENIX_COLLECTOR_ENDPOINT") or DEFAULT_ENDPOINT).strip()
    if "://" not in url:
        url = f"http://{url}"
    url = url.rstrip("/")
    if url.endswith(TRACES_PATH):
        url = url[: -len(TRACES_PATH)].rstrip("/")
    return url


def phoenix_headers(
    headers: Mapping[str, str] | None = None, api_key: str | None = None
) -> dict[str, str]:
    """The headers of every request to Phoenix: ``headers``, plus ``Authorization: Bearer``
    from ``api_key`` unless ``headers`` already authorize.

    Example:
        >>> phoenix_headers({"x-team": "rl"}, api_key="px-key")
        {'x-team': 'rl', 'authorization': 'Bearer px-key'}
    """
    out = dict(headers or {})
    if api_key and not any(name.lower() == "authorization" for name in out):
        out["authorization"] = f"Bearer {api_key}"
    return out


def annotation_body(
    span_id: str,
    score: Score,
    *,
    metadata: Mapping[str, Any] | None = None,
    explanation: bool = True,
) -> dict[str, Any]:
    """One item of ``POST /v1/span_annotations``' ``data`` list (Phoenix's
    ``SpanAnnotationData``: name, annotator_kind, result {score, label, explanation},
    metadata, identifier).

    Example:
        >>> annotation_body("00f067aa0ba902b7", Score("ruler_score", 0.8, "concise"))
        ... # doctest: +NORMALIZE_WHITESPACE
        {'span_id': '00f067aa0ba902b7', 'name': 'ruler_score', 'annotator_kind': 'LLM',
         'result': {'score': 0.8, 'explanation': 'concise'}, 'metadata': {},
         'identifier': 'art-core'}
    """
    result: dict[str, Any] = {"score": score.value}
    if explanation and score.comment:
        result["explanation"] = score.comment
    return {
        "span_id": span_id,
        "name": score.name,
        "annotator_kind": ANNOTATOR_KINDS.get(score.name, ANNOTATOR_KIND),
        "result": result,
        "metadata": dict(metadata or {}),
        "identifier": IDENTIFIER,
    }


def _inserted_ids(reply: httpx.Response, expected: int) -> list[str] | None:
    """The annotation ids of a synchronous ``/v1/span_annotations`` reply, or None when it is
    not the ``{"data": [{"id": ...}, ...]}`` Phoenix documents (one per annotation sent)."""
    try:
        data = reply.json().get("data")
    except (ValueError, AttributeError):
        return None
    if not isinstance(data, list) or len(data) != expected:
        return None
    ids = [
        item["id"] for item in data if isinstance(item, dict) and isinstance(item.get("id"), str)
    ]
    return ids if len(ids) == expected else None


class PhoenixSink(OtelSink):
    """Send rollouts to Arize Phoenix (``phoenix serve`` or Phoenix Cloud).

    ``endpoint``: Phoenix's base URL (default ``$PHOENIX_COLLECTOR_ENDPOINT``, else
    ``http://127.0.0.1:6006``). ``project_name``: the Phoenix project (default
    ``$PHOENIX_PROJECT_NAME``, else ``default``). ``api_key`` (default ``$PHOENIX_API_KEY``)
    is sent as ``Authorization: Bearer`` with the spans and the annotations, as are
    ``headers``.

    Example:
        >>> sink = PhoenixSink(TracingSettings(), endpoint="http://127.0.0.1:6006/v1/traces",
        ...                    project_name="agent")
        >>> sink.url, sink.project_name
        ('http://127.0.0.1:6006', 'agent')
        >>> sink.shutdown(1.0)
    """

    name = "phoenix"

    def __init__(
        self,
        settings: TracingSettings,
        *,
        endpoint: str | None = None,
        headers: Mapping[str, str] | None = None,
        project_name: str | None = None,
        api_key: str | None = None,
    ) -> None:
        self.url = phoenix_base_url(endpoint)
        self.project_name = (
            project_name or os.environ.get("PHOENIX_PROJECT_NAME") or DEFAULT_PROJECT
        )
        self.headers = phoenix_headers(headers, api_key or os.environ.get("PHOENIX_API_KEY"))
        # Our own resource: the project is a resource attribute, and the shared provider of
        # other sinks must not carry it.
        resource = Resource.create(
            {"service.name": settings.service_name, PROJECT_ATTRIBUTE: self.project_name}
        )
        provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        exporter = otlp_exporter(self.url + TRACES_PATH, self.headers, settings.export_timeout_s)
        super().__init__(exporter, settings, label="phoenix", provider=provider)
        self.owns_provider = True
        self._client: httpx.Client | None = None
        self.annotations_sent = 0
        self.annotations_queued = 0  # handed to Phoenix's own retry queue (span not in yet)
        self.annotations_failed = 0
        self.annotations_dropped = 0  # not sent: Phoenix failed just before
        self._failures = 0
        self._paused_until = 0.0
        self._queue_until = 0.0

    # -------------------------------------------------------------- worker side
    def after_render(self, node: SpanNode, context: SpanContext, parent: Context) -> None:
        if node.scores:
            self._annotate(context, node.scores, node.key)

    def update_scores(self, update: ScoreUpdate) -> None:
        """Re-scored rollouts: the annotations are upserted (same name and identifier)."""
        context = self.remembered.get(update.key)
        if context is not None and update.scores:
            self._annotate(context, update.scores, update.key)

    def _client_for_rest(self) -> httpx.Client:
        if self._client is None:
            self._client = httpx.Client(
                base_url=self.url,
                headers=self.headers,
                timeout=httpx.Timeout(self.settings.export_timeout_s),
                verify=shared_ssl_context(),
            )
        return self._client

    def _annotate(self, context: SpanContext, scores: Sequence[Score], key: str | None) -> None:
        """Annotate one span with ``scores``; never raises, waits at most about
        ``SPAN_WAIT_S`` plus two request timeouts."""
        if time.monotonic() < self._paused_until:
            self.annotations_dropped += len(scores)
            return
        span_id = format(context.span_id, "016x")
        metadata = {"rollout_id": key} if key else {}
        body = {
            "data": [
                annotation_body(
                    span_id, s, metadata=metadata, explanation=self.settings.capture_content
                )
                for s in scores
            ]
        }
        # The span must be on the server first: send what the batch processor holds.
        if self.processor is not None:
            self.processor.force_flush(int(self.settings.export_timeout_s * 1000))
        try:
            self._post(body, len(scores))
        except Exception as exc:  # transport errors, a broken reply: log, never raise
            self._failed(len(scores), f"{type(exc).__name__}: {exc}")

    def _post(self, body: dict[str, Any], count: int) -> None:
        client = self._client_for_rest()
        if time.monotonic() < self._queue_until:
            # A span took longer than SPAN_WAIT_S a moment ago: Phoenix ingests slowly, so
            # queue on it directly rather than make every rollout wait in our worker.
            self._queue(client, body, count)
            return
        deadline = time.monotonic() + SPAN_WAIT_S
        delay = 0.05
        while True:
            reply = client.post(ANNOTATIONS_PATH, params={"sync": "true"}, json=body)
            if reply.status_code == 200:
                if _inserted_ids(reply, count) is None:
                    self._failed(count, f"unexpected reply {reply.text[:200]!r}")
                    return
                self._succeeded()
                self.annotations_sent += count
                return
            if reply.status_code != 404:
                self._failed(count, f"HTTP {reply.status_code}: {reply.text[:200]}")
                return
            # 404: the span is still in Phoenix's ingestion queue.
            if time.monotonic() + delay > deadline:
                break
            time.sleep(delay)  # a bounded backoff, not a synchronisation
            delay = min(delay * 2, 1.0)
        self._queue_until = time.monotonic() + SLOW_INGESTION_S
        logger.info(
            "tracing: span %s not in Phoenix after %.0f s; annotations are queued there "
            "(Phoenix retries them) for the next %.0f s",
            body["data"][0]["span_id"],
            SPAN_WAIT_S,
            SLOW_INGESTION_S,
        )
        self._queue(client, body, count)

    def _queue(self, client: httpx.Client, body: dict[str, Any], count: int) -> None:
        """Hand annotations to Phoenix's insertion queue (``sync=false``), which retries an
        unknown span every 10 s for 10 minutes (``phoenix/db/insertion/constants.py``)."""
        reply = client.post(ANNOTATIONS_PATH, json=body)
        if reply.status_code != 200:
            self._failed(count, f"HTTP {reply.status_code}: {reply.text[:200]}")
            return
        self._succeeded()
        self.annotations_queued += count

    def _succeeded(self) -> None:
        if self._failures:
            logger.warning("tracing: Phoenix annotations at %s work again", self.url)
        self._failures = 0

    def _failed(self, count: int, error: str) -> None:
        # Like GuardedExporter: log once per outage and pause (1 s, 2 s, ... 60 s) so a down
        # Phoenix does not cost a request timeout per rollout.
        self.annotations_failed += count
        self._failures += 1
        self._paused_until = time.monotonic() + min(MAX_BACKOFF_S, 2.0 ** (self._failures - 1))
        if self._failures == 1:
            logger.warning(
                "tracing: Phoenix annotations at %s failed (%s); scores are dropped while it "
                "stays down",
                self.url,
                error,
            )

    # -------------------------------------------------------------- lifecycle
    def shutdown(self, timeout_s: float) -> None:
        super().shutdown(timeout_s)
        client, self._client = self._client, None
        if client is not None:
            client.close()

    def stats(self) -> dict[str, int]:
        return {
            **super().stats(),
            "annotations_sent": self.annotations_sent,
            "annotations_queued": self.annotations_queued,
            "annotations_failed": self.annotations_failed,
            "annotations_dropped": self.annotations_dropped,
        }
