"""From an exporter name or object to a tracing sink (``make_sink``).

Imports every sink's module (and OpenTelemetry with them), so ``state.enable`` loads it only
once tracing is enabled; each sink imports its own SDK (Langfuse, Weave, MLflow) on first use.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from art_core.tracing.exporters import console_exporter, otlp_exporter
from art_core.tracing.langfuse import LangfuseSink
from art_core.tracing.mlflow import MlflowSink
from art_core.tracing.otel import OtelSink
from art_core.tracing.phoenix import PhoenixSink
from art_core.tracing.settings import EXPORTER_NAMES, TracingSettings
from art_core.tracing.weave import WeaveSink

if TYPE_CHECKING:
    from art_core.tracing.pipeline import Sink


def make_sink(
    spec: Any,
    settings: TracingSettings,
    *,
    endpoint: str | None = None,
    headers: Mapping[str, str] | None = None,
    weave_project: str | None = None,
    langfuse_options: Mapping[str, Any] | None = None,
    mlflow_options: Mapping[str, Any] | None = None,
    phoenix_options: Mapping[str, Any] | None = None,
) -> Sink:
    """An exporter from a name (``"otlp"``, ``"console"``, ``"langfuse"``, ``"weave"``,
    ``"mlflow"``, ``"phoenix"``), an OpenTelemetry ``SpanExporter``, a ``langfuse.Langfuse``
    client, a Weave client, or a ready sink object.

    ``endpoint`` / ``headers`` go to ``"otlp"``, and to ``"mlflow"`` / ``"phoenix"`` as the
    server's base URL and extra headers."""
    if isinstance(spec, str):
        name = spec.strip().lower()
        if name == "otlp":
            return OtelSink(otlp_exporter(endpoint, headers, settings.export_timeout_s), settings)
        if name == "console":
            return OtelSink(console_exporter(), settings, label="console")
        if name == "langfuse":
            return LangfuseSink(settings, **dict(langfuse_options or {}))
        if name == "mlflow":
            # Options win over the shared endpoint/headers: with several servers at once,
            # each preset names its own (mlflow={"tracking_uri": ...}).
            options = {"tracking_uri": endpoint, "headers": headers, **dict(mlflow_options or {})}
            return MlflowSink(settings, **options)
        if name == "phoenix":
            options = {"endpoint": endpoint, "headers": headers, **dict(phoenix_options or {})}
            return PhoenixSink(settings, **options)
        if name == "weave":
            project = weave_project or os.environ.get("ART_WEAVE_PROJECT")
            return WeaveSink(settings, project=project)
        raise ValueError(f"unknown tracing exporter {spec!r}; known: {EXPORTER_NAMES}")
    module = type(spec).__module__
    if all(hasattr(spec, m) for m in ("emit", "flush", "shutdown", "capture_parent")):
        return spec
    if module.startswith("langfuse"):
        return LangfuseSink(settings, client=spec)
    if module.startswith("weave"):
        return WeaveSink(settings, client=spec)
    if hasattr(spec, "export") and hasattr(spec, "shutdown"):
        return OtelSink(spec, settings, label=type(spec).__name__)
    raise TypeError(
        f"cannot trace to a {type(spec).__name__}: pass an exporter name {EXPORTER_NAMES}, an "
        "OpenTelemetry SpanExporter, a langfuse.Langfuse client or a weave client"
    )
