"""Tracing: every rollout and train step as OpenTelemetry spans (GenAI semantic conventions),
sent to any OTLP endpoint, Langfuse or Weave. (Metric history, W&B and ``art-core plot`` are
``art_core.metrics``.)

Off by default. One switch: ``enable(...)`` in code, or ``ART_TRACING=otlp|langfuse|weave|console``
(comma-separated) in the environment. Export runs in background threads with bounded queues:
a slow or dead backend never blocks or fails a rollout.

Example:
    >>> import art_core.tracing as tracing
    >>> tracing.enable("otlp", endpoint="http://127.0.0.1:4318/v1/traces")  # changes process-wide state: tracing for every rollout from then on  # doctest: +SKIP
    >>> # ... gather rollouts, train ...
    >>> tracing.flush()  # changes process-wide state  # doctest: +SKIP

This package imports only the standard library until tracing is enabled.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from art_core.run_context import current_run
from art_core.tracing.settings import TracingSettings
from art_core.tracing.state import active, disable, enable, flush, is_enabled, stats

__all__ = [
    "TracingSettings",
    "disable",
    "enable",
    "flush",
    "is_enabled",
    "record_tool_call",
    "stats",
]


def __getattr__(name: str) -> Any:
    # W&B logging moved to art_core.metrics; these names stay reachable here for code written
    # against earlier versions (``tracing.enable_wandb(...)``).
    if name in ("enable_wandb", "disable_wandb"):
        from art_core import metrics

        return getattr(metrics, name)
    raise AttributeError(f"module 'art_core.tracing' has no attribute {name!r}")


def record_tool_call(
    name: str,
    arguments: Any = None,
    result: Any = None,
    *,
    start_time: float | None = None,
    end_time: float | None = None,
    call_id: str | None = None,
    error: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    rollout_id: str | None = None,
) -> None:
    """Report a tool call of the current rollout with its exact timing (for integrations).

    Without it, tool spans are inferred from the conversation (the tool ran between the
    request that asked for it and the one that carried its result). A record with the same
    ``call_id`` (the OpenAI tool-call id) replaces the inferred span. Does nothing when
    tracing is off or outside ``capture``.

    Example:
        >>> started = time.time()
        >>> record_tool_call("get_weather", {"city": "Paris"}, "12°C", start_time=started,
        ...                  end_time=time.time(), call_id="call_1")
    """
    pipeline = active()
    if pipeline is None:
        return
    if rollout_id is None:
        run = current_run()
        if run is None:
            return
        rollout_id = run.rollout_id
    # Span building: loaded once tracing is on.
    from art_core.tracing.tools import ToolRecord

    pipeline.tool_call(
        rollout_id,
        ToolRecord(
            name=name,
            arguments=arguments,
            result=result,
            start_time=start_time,
            end_time=end_time if end_time is not None else (time.time() if start_time else None),
            call_id=call_id,
            error=error,
            metadata=dict(metadata or {}),
        ),
    )
