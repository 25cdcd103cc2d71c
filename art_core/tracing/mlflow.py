"""MLflow (3.x tracking server): a trace per rollout (AGENT span, CHAT_MODEL spans with the
conversation, TOOL spans), reward and RULER score as MLflow feedback assessments on the
rollout's trace, and the traces linked to the model's MLflow run.

Spans go over OTLP/HTTP to ``{tracking_uri}/v1/traces`` with the ``x-mlflow-experiment-id``
header (``mlflow/server/otel_api.py``); MLflow stores each OpenTelemetry trace as trace
``tr-<32 hex trace id>``. Each span carries ``mlflow.spanInputs`` / ``mlflow.spanOutputs``
(OpenAI chat format for LLM calls, which MLflow's UI renders as a conversation), and a
rollout's root span ``mlflow.traceTag.*`` attributes, which MLflow's OTLP ingest turns into
trace tags (the trace's name, ``art.rollout_id``, ``art.model``).

Everything else uses MLflow's REST API (``mlflow/server/handlers.py``), from a background
thread, once the rollout's trace is known to be stored (the OTLP request that carried its
root span succeeded; MLflow answers it after the spans are committed):

- ``POST /api/3.0/mlflow/traces/{trace_id}/assessments``: one feedback per score
  (``reward``, ``ruler_score`` with the judge's explanation as rationale,
  ``independent_reward``), with an assessment id derived from the trace and the score name,
- ``PATCH /api/3.0/mlflow/traces/{trace_id}/assessments/{assessment_id}``: a re-scored
  rollout updates that same feedback instead of adding one,
- ``POST /api/2.0/mlflow/traces/link-to-run``: the trace is linked to the model's run when
  ``metrics.enable_mlflow`` logs the model there (MLflow's run page then lists its traces).
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanContext, get_current_span

from art_core.background import Worker, call_with_timeout
from art_core.metrics import state as metrics_state
from art_core.metrics.mlflow_rest import (
    TRACES_PATH,
    ExperimentChoice,
    MlflowError,
    MlflowRest,
    mlflow_headers,
    resolve_tracking_uri,
)
from art_core.tracing import genai
from art_core.tracing.exporters import otlp_exporter
from art_core.tracing.otel import OtelSink
from art_core.tracing.settings import TracingSettings
from art_core.tracing.tree import AttributeValue, Score, ScoreUpdate, SpanNode

logger = logging.getLogger("art_core.tracing")

EXPERIMENT_HEADER = (
    "x-mlflow-experiment-id"  # mlflow.tracing.utils.otlp.MLFLOW_EXPERIMENT_ID_HEADER
)
INPUTS = "mlflow.spanInputs"
OUTPUTS = "mlflow.spanOutputs"
SPAN_TYPE = "mlflow.spanType"
SPAN_TYPES = {"rollout": "AGENT", "llm": "CHAT_MODEL", "tool": "TOOL", "train": "CHAIN"}
TRACE_TAG = "mlflow.traceTag."  # root-span attributes MLflow's OTLP ingest stores as trace tags
KIND_TAG = TRACE_TAG + "art.kind"  # also how the exporter recognises rollout and train spans
SOURCE_ID = "art_core"
RULER_SOURCE_ID = "art_core.ruler"
ASSESSMENTS_PATH = "/api/3.0/mlflow/traces/{trace_id}/assessments"
LINK_PATH = "/api/2.0/mlflow/traces/link-to-run"
TRACE_WAIT_S = 10.0  # how long an assessment retries a trace MLflow does not know yet
# MLflow writes spans to its database inside the OTLP request (and imports its ingestion code
# on the first one): seconds on a loaded machine, where a collector would answer at once. A
# request gets at least this long; shutdown stays bounded (see MlflowSink.shutdown).
MIN_REQUEST_TIMEOUT_S = 30.0
MAX_BACKOFF_S = 60.0
MAX_WAITING = 100_000  # rollouts whose scores wait for their spans to be exported


def mlflow_trace_id(otel_trace_id: int) -> str:
    """MLflow's id of the trace an OpenTelemetry trace id becomes over OTLP
    (``mlflow.tracing.utils.generate_mlflow_trace_id_from_otel_trace_id``).

    Example:
        >>> mlflow_trace_id(0x4BF92F3577B34DA6A3CE929D0E0E4736)
        'tr-4bf92f3577b34da6a3ce929d0e0e4736'
    """
    return f"tr-{otel_trace_id:032x}"


def assessment_id(trace_id: str, name: str) -> str:
    """A stable assessment id (MLflow's ``a-<32 hex>`` form) for score ``name`` of a trace,
    so re-scoring updates the feedback instead of adding one.

    Example:
        >>> assessment_id("tr-0af7651916cd43dd8448eb211c80319c", "reward")[:2]
        'a-'
        >>> len(assessment_id("tr-0af7651916cd43dd8448eb211c80319c", "reward"))
        34
    """
    return "a-" + hashlib.sha256(f"{trace_id}:{name}".encode()).hexdigest()[:32]


def _timestamp(seconds: float) -> str:
    """A protobuf ``Timestamp`` in its JSON form (RFC 3339, UTC)."""
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def assessment_body(
    trace_id: str,
    score: Score,
    *,
    span_id: str | None = None,
    rollout_id: str | None = None,
    explanation: bool = True,
    now: float | None = None,
) -> dict[str, Any]:
    """The ``assessment`` of ``POST /api/3.0/mlflow/traces/{trace_id}/assessments``: a
    feedback named after the score, its value, the RULER explanation as rationale (unless
    ``explanation`` is False), a code source (an LLM-judge source for the RULER score).
    ``span_id`` (16 hex) attaches it to a span instead of the whole trace.

    Example:
        >>> body = assessment_body("tr-0af7651916cd43dd8448eb211c80319c",
        ...                        Score("ruler_score", 0.8, "concise"), rollout_id="r1", now=0)
        >>> body["feedback"], body["rationale"], body["source"]
        ({'value': 0.8}, 'concise', {'source_type': 'LLM_JUDGE', 'source_id': 'art_core.ruler'})
    """
    stamp = _timestamp(time.time() if now is None else now)
    ruler = score.name == "ruler_score"
    value: float | str = score.value
    if not math.isfinite(score.value):  # JSON (and protobuf's Value) has no NaN/inf
        value = str(score.value)
    body: dict[str, Any] = {
        "assessment_id": assessment_id(trace_id, score.name),
        "assessment_name": score.name,
        "trace_id": trace_id,
        "source": {
            "source_type": "LLM_JUDGE" if ruler else "CODE",
            "source_id": RULER_SOURCE_ID if ruler else SOURCE_ID,
        },
        "feedback": {"value": value},
        "create_time": stamp,
        "last_update_time": stamp,
    }
    if span_id:
        body["span_id"] = span_id
    if explanation and score.comment:
        body["rationale"] = score.comment
    if rollout_id:
        body["metadata"] = {"art.rollout_id": rollout_id}
    return body


def _clip(value: Any, max_chars: int | None) -> Any:
    """Every string in a JSON-like value cut to ``max_chars`` (the content limit)."""
    if max_chars is None:
        return value
    if isinstance(value, str):
        return genai.clip(value, max_chars)
    if isinstance(value, Mapping):
        return {k: _clip(v, max_chars) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clip(v, max_chars) for v in value]
    return value


def span_inputs_outputs(node: SpanNode) -> tuple[Any, Any]:
    """What MLflow shows as a span's Inputs and Outputs: an LLM call as an OpenAI chat request
    and completion (its UI renders those as a conversation with tool calls), a tool call's
    arguments and result, a rollout's or train step's own input and output.

    Example:
        >>> node = SpanNode("chat m", "llm", 0, 1, input={"model": "m", "messages": []},
        ...                 output={"model": "m", "choices": [], "usage": {}})
        >>> span_inputs_outputs(node)[1]["object"]
        'chat.completion'
    """
    if node.kind == "llm":
        request = dict(node.input or {})
        params = request.pop("params", None) or {}
        request.pop("prompt_token_ids", None)  # include_token_ids: the span attribute has them
        llm_inputs = {**request, **{k: v for k, v in params.items() if k not in request}}
        output = dict(node.output or {})
        outputs = {
            "object": "chat.completion",
            "model": output.get("model"),
            "choices": output.get("choices", []),
            "usage": output.get("usage", {}),
        }
        return llm_inputs, outputs
    if node.kind == "tool":
        tool = node.input if isinstance(node.input, Mapping) else {}
        return tool.get("arguments", {"name": tool.get("name")}), node.output
    return node.input, node.output


# REST work for one exported rollout or train step (link it, send its scores), and how many
# scores it carries (counted as dropped if its spans never reach MLflow).
Job = tuple[Callable[[], None], int]


class MlflowSpanExporter(SpanExporter):
    """OTLP/HTTP to an MLflow server, experiment resolved on the first export (so enabling
    tracing sends no request and a server that comes up later still gets the spans); after
    each successful export ``on_exported`` hears which spans MLflow now holds.

    Example:
        >>> rest = MlflowRest("http://127.0.0.1:5000")
        >>> exporter = MlflowSpanExporter(rest, ExperimentChoice(id="0"), {}, 5.0)
        >>> exporter.export([])  # needs a network service: an MLflow server there  # doctest: +SKIP
        <SpanExportResult.SUCCESS: 0>
    """

    def __init__(
        self,
        rest: MlflowRest,
        experiment: ExperimentChoice,
        headers: Mapping[str, str],
        timeout_s: float,
        on_exported: Callable[[Sequence[ReadableSpan]], None] | None = None,
    ) -> None:
        self.rest = rest
        self.experiment = experiment
        self.headers = dict(headers)
        self.timeout_s = timeout_s
        self.on_exported = on_exported
        self.experiment_id: str | None = None
        self._inner: SpanExporter | None = None
        self._lock = threading.Lock()

    def _exporter(self) -> SpanExporter:
        with self._lock:
            if self._inner is None:
                try:
                    experiment_id = self.experiment.resolve(self.rest)
                except MlflowError as exc:
                    what = f"experiment {self.experiment.name!r}"
                    raise MlflowError(f"cannot resolve MLflow {what}: {exc}") from exc
                headers = {**self.headers, EXPERIMENT_HEADER: experiment_id}
                self._inner = otlp_exporter(self.rest.url + TRACES_PATH, headers, self.timeout_s)
                self.experiment_id = experiment_id
            return self._inner

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = self._exporter().export(spans)
        if result is SpanExportResult.SUCCESS and self.on_exported is not None:
            try:
                self.on_exported(spans)
            except Exception:  # our bookkeeping must not turn a delivered batch into a failure
                logger.exception("tracing: MLflow post-export bookkeeping failed")
        return result

    def shutdown(self) -> None:
        if self._inner is not None:
            self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class MlflowSink(OtelSink):
    """Send rollouts to an MLflow tracking server (``mlflow server``, MLflow 3.x).

    ``tracking_uri``: the server's base URL (default ``$MLFLOW_TRACKING_URI``, else
    ``http://127.0.0.1:5000``). The experiment: ``experiment_id``, else ``experiment_name``
    (looked up, created when missing), else ``$MLFLOW_EXPERIMENT_ID`` /
    ``$MLFLOW_EXPERIMENT_NAME``, else MLflow's Default ("0"). ``headers`` go with every request
    (``MLFLOW_TRACKING_TOKEN`` / ``_USERNAME`` + ``_PASSWORD`` add authorization).

    Construction sends nothing; a down server is handled like any exporter (spans dropped,
    logged once per outage), and the REST calls (scores, run links) run in a thread of their
    own. Each request is bounded by ``settings.export_timeout_s``, but at least 30 s: MLflow
    writes to its database before it answers.

    Example:
        >>> sink = MlflowSink(TracingSettings(), tracking_uri="http://127.0.0.1:5000",
        ...                   experiment_name="agent-rl")
        >>> sink.tracking_uri, sink.experiment.name
        ('http://127.0.0.1:5000', 'agent-rl')
        >>> sink.shutdown(1.0)
    """

    name = "mlflow"
    # MLflow reads its own mlflow.spanInputs/Outputs and span type (set in ``decorate``);
    # OpenInference's copies of the same messages would only make every span bigger.
    openinference = False

    def __init__(
        self,
        settings: TracingSettings,
        *,
        tracking_uri: str | None = None,
        headers: Mapping[str, str] | None = None,
        experiment_id: str | None = None,
        experiment_name: str | None = None,
    ) -> None:
        self.tracking_uri = resolve_tracking_uri(tracking_uri)
        self.experiment = ExperimentChoice.choose(experiment_id, experiment_name)
        self.headers = mlflow_headers(headers)
        timeout_s = max(settings.export_timeout_s, MIN_REQUEST_TIMEOUT_S)
        self.rest = MlflowRest(self.tracking_uri, self.headers, timeout_s)
        self.exporter = MlflowSpanExporter(
            self.rest, self.experiment, self.headers, timeout_s, on_exported=self._exported
        )
        super().__init__(self.exporter, settings, label="mlflow")
        self.jobs = Worker(max_queue_size=settings.max_queue_size * 4, name="art-mlflow")
        self._lock = threading.Lock()
        self._stored: OrderedDict[int, None] = OrderedDict()  # span ids MLflow holds
        self._waiting: OrderedDict[int, list[Job]] = OrderedDict()
        self._nested: set[str] = set()  # rollouts inside a caller's trace (worker thread only)
        self.assessments_sent = 0
        self.assessments_failed = 0
        self.assessments_dropped = 0  # not sent: MLflow failed just before, or never stored
        self.links_sent = 0
        self.links_failed = 0
        self._failures = 0
        self._paused_until = 0.0

    @property
    def experiment_id(self) -> str | None:
        """The experiment's id once the first export resolved it (None before)."""
        return self.exporter.experiment_id

    # -------------------------------------------------------------- worker side
    def decorate(self, node: SpanNode) -> dict[str, AttributeValue]:
        attributes: dict[str, AttributeValue] = {}
        inputs, outputs = span_inputs_outputs(node)
        chars = self.settings.max_content_chars
        if inputs is not None:
            attributes[INPUTS] = genai.to_json(_clip(inputs, chars))
        if outputs is not None:
            attributes[OUTPUTS] = genai.to_json(_clip(outputs, chars))
        # Our own choice, not whichever convention MLflow's ingest reads first (OpenInference
        # says LLM where the GenAI conventions' "chat" says CHAT_MODEL; a train step is no
        # GenAI operation at all).
        attributes[SPAN_TYPE] = SPAN_TYPES.get(node.kind, "UNKNOWN")
        if node.kind not in ("rollout", "train"):
            return attributes
        attributes[TRACE_TAG + "mlflow.traceName"] = node.display_name or node.name
        attributes[KIND_TAG] = node.kind
        if node.kind == "rollout" and node.key:
            attributes[TRACE_TAG + "art.rollout_id"] = node.key
        model = _model(node)
        if model is not None:
            attributes[TRACE_TAG + "art.model"] = "/".join(model)
        step = node.attributes.get("art.adapter_step", node.attributes.get("art.train.step"))
        if step is not None:
            attributes[TRACE_TAG + "art.step"] = str(step)
        return attributes

    def after_render(self, node: SpanNode, context: SpanContext, parent: Context) -> None:
        if node.kind not in ("rollout", "train"):
            return
        # A rollout that is its own trace is scored at trace level (shown in the trace list);
        # one nested in the caller's trace on its own span.
        nested = get_current_span(parent).get_span_context().is_valid
        if nested and node.key:
            self._nested.add(node.key)
        trace_id = mlflow_trace_id(context.trace_id)
        span_id = format(context.span_id, "016x") if nested else None
        scores, model, key = list(node.scores), _model(node), node.key

        def job() -> None:
            if model is not None:
                self._link(trace_id, model)
            self._send_scores(trace_id, span_id, scores, key, update=False)

        self._when_stored(context.span_id, (job, len(scores)))

    def update_scores(self, update: ScoreUpdate) -> None:
        """Re-scored rollouts: each feedback is updated in place (same assessment id)."""
        context = self.remembered.get(update.key)
        if context is None or not update.scores:
            return
        trace_id = mlflow_trace_id(context.trace_id)
        span_id = format(context.span_id, "016x") if update.key in self._nested else None
        scores = list(update.scores)
        self._when_stored(
            context.span_id,
            (
                lambda: self._send_scores(trace_id, span_id, scores, update.key, update=True),
                len(scores),
            ),
        )

    # -------------------------------------------------------------- export thread
    def _exported(self, spans: Sequence[ReadableSpan]) -> None:
        """MLflow committed these spans: run the REST work waiting for rollouts among them."""
        ready: list[Job] = []
        with self._lock:
            for span in spans:
                attributes = span.attributes or {}
                if KIND_TAG not in attributes or span.context is None:
                    continue
                span_id = span.context.span_id
                self._stored[span_id] = None
                while len(self._stored) > MAX_WAITING:
                    self._stored.popitem(last=False)
                ready += self._waiting.pop(span_id, [])
        for run, _ in ready:
            self.jobs.submit(run)

    def _when_stored(self, span_id: int, job: Job) -> None:
        # The batch processor may export the span before this runs (it ends first): hence
        # the record of stored span ids next to the jobs that wait.
        with self._lock:
            if span_id not in self._stored:
                self._waiting.setdefault(span_id, []).append(job)
                while len(self._waiting) > MAX_WAITING:  # spans dropped while MLflow was down
                    _, jobs = self._waiting.popitem(last=False)
                    self.assessments_dropped += sum(count for _, count in jobs)
                return
        self.jobs.submit(job[0])

    # -------------------------------------------------------------- REST thread
    def _paused(self) -> bool:
        return time.monotonic() < self._paused_until

    def _succeeded(self) -> None:
        if self._failures:
            logger.warning("tracing: MLflow REST calls to %s work again", self.tracking_uri)
        self._failures = 0

    def _failed(self, error: str) -> None:
        # Like GuardedExporter: log once per outage and pause (1 s, 2 s, ... 60 s) so a down
        # MLflow does not cost a request timeout per rollout.
        self._failures += 1
        self._paused_until = time.monotonic() + min(MAX_BACKOFF_S, 2.0 ** (self._failures - 1))
        if self._failures == 1:
            logger.warning(
                "tracing: MLflow REST calls to %s failed (%s); scores and run links are "
                "dropped while it stays down",
                self.tracking_uri,
                error,
            )

    def _link(self, trace_id: str, model: tuple[str, str]) -> None:
        run_id = metrics_state.mlflow_run_id(*model)
        if run_id is None or self._paused():
            return
        try:
            self.rest.request("POST", LINK_PATH, json={"trace_ids": [trace_id], "run_id": run_id})
        except MlflowError as exc:
            self.links_failed += 1
            self._failed(str(exc))
            return
        self.links_sent += 1
        self._succeeded()

    def _send_scores(
        self,
        trace_id: str,
        span_id: str | None,
        scores: Sequence[Score],
        rollout_id: str | None,
        *,
        update: bool,
    ) -> None:
        for score in scores:
            if self._paused():
                self.assessments_dropped += 1
                continue
            body = assessment_body(
                trace_id,
                score,
                span_id=span_id,
                rollout_id=rollout_id,
                explanation=self.settings.capture_content,
            )
            try:
                self._put_assessment(trace_id, body, update=update)
            except MlflowError as exc:
                self.assessments_failed += 1
                self._failed(str(exc))
                continue
            self.assessments_sent += 1
            self._succeeded()

    def _put_assessment(self, trace_id: str, body: dict[str, Any], *, update: bool) -> None:
        """Create the feedback, or update it when it exists (re-scoring, or a retried create
        that had in fact gone through)."""
        if update and self._patch(trace_id, body):
            return
        deadline = time.monotonic() + TRACE_WAIT_S
        delay = 0.05
        path = ASSESSMENTS_PATH.format(trace_id=trace_id)
        while True:
            try:
                reply = self.rest.request("POST", path, json={"assessment": body})
            except MlflowError as exc:
                if exc.error_code == "RESOURCE_DOES_NOT_EXIST" and time.monotonic() < deadline:
                    # Normally stored already (we only get here after its export succeeded);
                    # a bounded backoff covers a server that commits late.
                    time.sleep(delay)
                    delay = min(delay * 2, 1.0)
                    continue
                # MLflow answers a duplicate assessment id with a constraint violation.
                if exc.status == 500 and not update and self._patch(trace_id, body):
                    return
                raise
            _check_assessment(reply, body["assessment_id"])
            return

    def _patch(self, trace_id: str, body: dict[str, Any]) -> bool:
        """Update an existing feedback's value (and rationale); False when it does not exist."""
        mask = ["feedback", "rationale"] if "rationale" in body else ["feedback"]
        path = ASSESSMENTS_PATH.format(trace_id=trace_id) + "/" + body["assessment_id"]
        try:
            reply = self.rest.request(
                "PATCH", path, json={"assessment": body, "update_mask": ",".join(mask)}
            )
        except MlflowError as exc:
            if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
                return False
            raise
        _check_assessment(reply, body["assessment_id"])
        return True

    # -------------------------------------------------------------- lifecycle
    def flush(self, timeout_s: float) -> bool:
        """Export the spans (which queues their REST work), then wait for that work."""
        deadline = time.monotonic() + timeout_s
        ok = super().flush(timeout_s)
        return self.jobs.flush(max(0.1, deadline - time.monotonic())) and ok

    def shutdown(self, timeout_s: float) -> None:
        """Flush, then release the provider and the REST client, waiting at most about
        ``timeout_s`` (an export still in flight to a hung server is left to its daemon
        thread rather than holding up the process's exit)."""
        deadline = time.monotonic() + timeout_s
        self.flush(timeout_s)
        call_with_timeout(
            self.provider.shutdown,
            max(0.1, deadline - time.monotonic()),
            name="art-mlflow-shutdown",
        )
        self.jobs.close(max(0.1, deadline - time.monotonic()))
        self.rest.close()

    def stats(self) -> dict[str, int]:
        with self._lock:
            waiting = sum(count for jobs in self._waiting.values() for _, count in jobs)
        return {
            **super().stats(),
            "assessments_sent": self.assessments_sent,
            "assessments_failed": self.assessments_failed,
            "assessments_dropped": self.assessments_dropped,
            "links_sent": self.links_sent,
            "links_failed": self.links_failed,
            "waiting": waiting,
        }


def _model(node: SpanNode) -> tuple[str, str] | None:
    """(project, name) of the model a rollout or train step belongs to."""
    name = node.attributes.get("art.model.name")
    if not isinstance(name, str) or not name:
        return None
    return str(node.attributes.get("art.project") or "default"), name


def _check_assessment(reply: Mapping[str, Any], expected_id: str) -> None:
    assessment = reply.get("assessment")
    if not isinstance(assessment, Mapping) or assessment.get("assessment_id") != expected_id:
        raise MlflowError(f"unexpected assessment reply from MLflow: {str(reply)[:200]}")
