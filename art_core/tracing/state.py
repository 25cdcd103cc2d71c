"""The process-wide tracing switch: which pipeline (if any) is active.

One ``ProcessSwitch`` (see there why it is process-wide), changed only through ``enable`` /
``disable``; ``ART_TRACING`` applies on the first read. Per-task state (whether a rollout runs
inside ``gather``) lives in a ContextVar in ``hooks``. Standard library only until tracing is
enabled.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from art_core.switch import ProcessSwitch
from art_core.tracing.settings import TracingSettings, exporters_from_env

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

    ``exporter``: a name, an exporter object, or a list of them (see ``sinks.make_sink``); None:
    the names in ``ART_TRACING``, else ``"otlp"``.
    ``endpoint``/``headers``: for ``"otlp"`` (default: the ``OTEL_EXPORTER_OTLP_*`` variables).
    ``weave_project``: for ``"weave"`` when ``weave.init`` was not called. ``langfuse``: keyword
    arguments for ``langfuse.Langfuse``. ``options``: ``TracingSettings`` fields, e.g.
    ``capture_content=False``, ``include_token_ids=True``.

    Example:
        >>> import art_core.tracing as tracing
        >>> tracing.enable("otlp", endpoint="http://127.0.0.1:4318/v1/traces")  # changes process-wide state: tracing for every rollout from then on  # doctest: +SKIP
        >>> tracing.enable(["langfuse", "weave"], weave_project="team/agent")  # changes process-wide state, and needs a network service: Langfuse, W&B  # doctest: +SKIP
        >>> tracing.enable("phoenix", endpoint="http://127.0.0.1:6006")  # changes process-wide state  # doctest: +SKIP
    """
    # Loaded once tracing is enabled.
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
            if all(hasattr(spec, m) for m in ("emit", "flush", "shutdown", "capture_parent")):
                sinks.append(spec)  # a ready sink: no exporter module (nor OpenTelemetry) needed
                continue
            # The exporters' modules, and OpenTelemetry with them, load only when one is named.
            from art_core.tracing.sinks import make_sink

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
