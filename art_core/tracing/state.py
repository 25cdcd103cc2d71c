"""The process-wide tracing switch: which pipeline (if any) is active.

One ``ProcessSwitch`` (see there why it is process-wide), changed only through ``enable`` /
``disable``; ``ART_TRACING`` applies on the first read. Per-task state (whether a rollout runs
inside ``gather``) lives in a ContextVar in ``hooks``. Standard library only until tracing is
enabled.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from art_core.tracing.settings import EXPORTER_NAMES, TracingSettings, exporters_from_env
from art_core.tracing.switch import ProcessSwitch

if TYPE_CHECKING:
    from art_core.tracing.pipeline import Pipeline, Sink

logger = logging.getLogger("art_core.tracing")

EXIT_TIMEOUT_S = 5.0


def _configure_from_env() -> None:
    names = exporters_from_env()
    if names:
        enable(names)


def _exit() -> None:
    disable(EXIT_TIMEOUT_S)


_state: ProcessSwitch[Pipeline] = ProcessSwitch(
    _configure_from_env, _exit, "tracing: ART_TRACING could not be applied; tracing stays off"
)


def active() -> Pipeline | None:
    """The running pipeline, or None. The first call reads ``ART_TRACING``."""
    return _state.get()


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
            from art_core.tracing.exporters import otlp_exporter
            from art_core.tracing.otel import OtelSink

            return OtelSink(otlp_exporter(endpoint, headers, settings.export_timeout_s), settings)
        if name == "console":
            from art_core.tracing.exporters import console_exporter
            from art_core.tracing.otel import OtelSink

            return OtelSink(console_exporter(), settings, label="console")
        if name == "langfuse":
            from art_core.tracing.langfuse import LangfuseSink

            return LangfuseSink(settings, **dict(langfuse_options or {}))
        if name == "mlflow":
            from art_core.tracing.mlflow import MlflowSink

            # Options win over the shared endpoint/headers: with several servers at once,
            # each preset names its own (mlflow={"tracking_uri": ...}).
            options = {"tracking_uri": endpoint, "headers": headers, **dict(mlflow_options or {})}
            return MlflowSink(settings, **options)
        if name == "phoenix":
            from art_core.tracing.phoenix import PhoenixSink

            options = {"endpoint": endpoint, "headers": headers, **dict(phoenix_options or {})}
            return PhoenixSink(settings, **options)
        if name == "weave":
            from art_core.tracing.weave import WeaveSink

            project = weave_project or os.environ.get("ART_WEAVE_PROJECT")
            return WeaveSink(settings, project=project)
        raise ValueError(f"unknown tracing exporter {spec!r}; known: {EXPORTER_NAMES}")
    module = type(spec).__module__
    if all(hasattr(spec, m) for m in ("emit", "flush", "shutdown", "capture_parent")):
        return spec  # type: ignore[no-any-return]
    if module.startswith("langfuse"):
        from art_core.tracing.langfuse import LangfuseSink

        return LangfuseSink(settings, client=spec)
    if module.startswith("weave"):
        from art_core.tracing.weave import WeaveSink

        return WeaveSink(settings, client=spec)
    if hasattr(spec, "export") and hasattr(spec, "shutdown"):
        from art_core.tracing.otel import OtelSink

        return OtelSink(spec, settings, label=type(spec).__name__)
    raise TypeError(
        f"cannot trace to a {type(spec).__name__}: pass an exporter name {EXPORTER_NAMES}, an "
        "OpenTelemetry SpanExporter, a langfuse.Langfuse client or a weave client"
    )


def enable(
    exporter: Any = None,
    *,
    endpoint: str | None = None,
    headers: Mapping[str, str] | None = None,
    weave_project: str | None = None,
    langfuse: Mapping[str, Any] | None = None,
    mlflow: Mapping[str, Any] | None = None,
    phoenix: Mapping[str, Any] | None = None,
    settings: TracingSettings | None = None,
    **options: Any,
) -> None:
    """Trace every rollout and train step from now on (replacing an earlier ``enable``).

    ``exporter``: a name, an exporter object, or a list of them (see ``make_sink``); None:
    the names in ``ART_TRACING``, else ``"otlp"``.
    ``endpoint``/``headers``: for ``"otlp"`` (default: the ``OTEL_EXPORTER_OTLP_*`` variables).
    ``weave_project``: for ``"weave"`` when ``weave.init`` was not called. ``langfuse``: keyword
    arguments for ``langfuse.Langfuse``. ``options``: ``TracingSettings`` fields, e.g.
    ``capture_content=False``, ``include_token_ids=True``.

    Example:
        >>> import art_core.tracing as tracing
        >>> tracing.enable("otlp", endpoint="http://127.0.0.1:4318/v1/traces")  # doctest: +SKIP
        >>> tracing.enable(["langfuse", "weave"], weave_project="team/agent")  # doctest: +SKIP
        >>> tracing.enable("phoenix", endpoint="http://127.0.0.1:6006")  # doctest: +SKIP
    """
    from art_core.tracing.pipeline import Pipeline

    base = settings or TracingSettings.from_env()
    merged = base.replace(**options) if options else base
    if exporter is None:
        exporter = exporters_from_env() or ["otlp"]
    specs: Sequence[Any] = exporter if isinstance(exporter, list | tuple) else [exporter]
    if not specs:
        raise ValueError("enable() needs at least one exporter")
    sinks: list[Sink] = []
    try:
        for spec in specs:
            sinks.append(
                make_sink(
                    spec,
                    merged,
                    endpoint=endpoint,
                    headers=headers,
                    weave_project=weave_project,
                    langfuse_options=langfuse,
                    mlflow_options=mlflow,
                    phoenix_options=phoenix,
                )
            )
    except BaseException:
        for sink in sinks:  # release what was built before the failure
            sink.shutdown(1.0)
        raise
    previous = _state.swap(Pipeline(sinks, merged))
    if previous is not None:
        previous.shutdown(EXIT_TIMEOUT_S)


def disable(timeout_s: float = EXIT_TIMEOUT_S) -> None:
    """Stop tracing: send what is queued (waiting at most ``timeout_s``) and release exporters."""
    previous = _state.swap(None)
    if previous is not None:
        previous.shutdown(timeout_s)


def flush(timeout_s: float = 30.0) -> bool:
    """Wait until every rollout traced so far has been handed to its backend (True) or
    ``timeout_s`` passed (False). Tests and short scripts call this before reading traces."""
    pipeline = _state.value
    return pipeline.flush(timeout_s) if pipeline is not None else True


def is_enabled() -> bool:
    """Whether rollouts are being traced."""
    return active() is not None


def stats() -> dict[str, Any]:
    """Counters of the running pipeline ({} when tracing is off)."""
    pipeline = _state.value
    return pipeline.stats() if pipeline is not None else {}
