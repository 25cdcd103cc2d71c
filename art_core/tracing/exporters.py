"""OpenTelemetry span exporters, guarded so a dead endpoint costs nothing and raises nothing.

Imported only when tracing is enabled (it needs ``opentelemetry-sdk``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

logger = logging.getLogger("art_core.tracing")

MAX_BACKOFF_S = 60.0


class GuardedExporter(SpanExporter):
    """Wrap an exporter: exceptions become failures, failures are logged (once per outage),
    and after a failure batches are dropped without a request for a growing pause (1 s,
    2 s, ... up to a minute), so a down endpoint never keeps the export thread (or process
    exit) busy with retries.

    ``exported`` / ``failed`` / ``dropped`` count spans, for health checks and benchmarks.

    Example:
        >>> from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        >>> GuardedExporter(InMemorySpanExporter(), "memory").export([])
        <SpanExportResult.SUCCESS: 0>
    """

    def __init__(self, inner: SpanExporter, label: str) -> None:
        self.inner = inner
        self.label = label
        self.exported = 0
        self.failed = 0
        self.dropped = 0
        self._failures = 0
        self._paused_until = 0.0
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        now = time.monotonic()
        with self._lock:
            if now < self._paused_until:
                self.dropped += len(spans)
                return SpanExportResult.FAILURE
        try:
            result = self.inner.export(spans)
        except Exception as exc:  # an exporter bug or a transport error must not escape
            result = SpanExportResult.FAILURE
            error: str = f"{type(exc).__name__}: {exc}"
        else:
            error = "the exporter reported a failure"
        with self._lock:
            if result is SpanExportResult.SUCCESS:
                if self._failures:
                    logger.warning("tracing export to %s works again", self.label)
                self._failures = 0
                self.exported += len(spans)
                return result
            self._failures += 1
            self.failed += len(spans)
            pause = min(MAX_BACKOFF_S, 2.0 ** (self._failures - 1))
            self._paused_until = time.monotonic() + pause
            if self._failures == 1:
                logger.warning(
                    "tracing export to %s failed (%s); spans are dropped while it stays down",
                    self.label,
                    error,
                )
        return result

    def shutdown(self) -> None:
        try:
            self.inner.shutdown()
        except Exception as exc:
            logger.warning("tracing exporter %s failed to shut down: %s", self.label, exc)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        try:
            return bool(self.inner.force_flush(timeout_millis))
        except Exception:
            return False

    def stats(self) -> dict[str, int]:
        return {"exported": self.exported, "failed": self.failed, "dropped": self.dropped}


def otlp_exporter(
    endpoint: str | None = None,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 5.0,
) -> SpanExporter:
    """The standard OTLP/HTTP (protobuf) span exporter.

    ``endpoint`` is the full traces URL (``http://host:4318/v1/traces``); without it the
    exporter reads ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT``
    (+ ``/v1/traces``) and ``OTEL_EXPORTER_OTLP_HEADERS`` like any OpenTelemetry program.

    Example:
        >>> otlp_exporter("http://127.0.0.1:4318/v1/traces")  # doctest: +ELLIPSIS
        <opentelemetry.exporter.otlp.proto.http.trace_exporter.OTLPSpanExporter object at ...>
    """
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        raise ImportError(
            "OTLP export needs `opentelemetry-exporter-otlp-proto-http`: "
            "pip install 'art-core[tracing]'"
        ) from exc
    kwargs: dict[str, Any] = {"timeout": timeout_s}
    if endpoint:
        kwargs["endpoint"] = endpoint
    if headers:
        kwargs["headers"] = dict(headers)
    return OTLPSpanExporter(**kwargs)


def console_exporter() -> SpanExporter:
    """Spans printed to stdout as JSON, one per line (for a quick look)."""
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    return ConsoleSpanExporter(formatter=lambda span: span.to_json(indent=None) + "\n")
