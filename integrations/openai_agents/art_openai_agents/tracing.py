"""A ``TracingProcessor`` that keeps the SDK's spans with the rollout they belong to.

The SDK calls its processors synchronously where a span starts and ends, i.e. inside the
rollout's task, so the processor finds the rollout's ``SpanLog`` through a ContextVar and one
processor serves any number of concurrent rollouts. Spans outside a captured rollout are
ignored.

Finished tool calls (function spans, MCP tools included) also go to the project's tracing
(``art_openai_agents.project_tracing``).

By default the SDK exports every trace to OpenAI's servers. ``configure_tracing`` replaces the
SDK's processors with ours, so nothing leaves the machine unless the user asks for it
(``export_to_openai=True``). That holds also for a trace that was already open when the
provider was made (inside ``agents.trace(...)``): the SDK's exporter queues a trace as it
starts and sends it from a worker thread seconds later, so what it queued is dropped too.
"""

from __future__ import annotations

import queue
from collections.abc import Sequence
from typing import Any

from agents.tracing import (
    Span,
    Trace,
    TracingProcessor,
    get_trace_provider,
    set_trace_processors,
)
from agents.tracing.span_data import FunctionSpanData

from art_openai_agents.project_tracing import report_tool_call
from art_openai_agents.spans import current_span_log


class ArtTracingProcessor(TracingProcessor):
    """Records the SDK's spans into the current rollout's ``SpanLog``.

    Example:
        >>> from agents import set_trace_processors
        >>> set_trace_processors([ArtTracingProcessor()])  # what configure_tracing() does
    """

    def on_trace_start(self, trace: Trace) -> None:
        log = current_span_log()
        if log is not None:
            log.add_trace(trace.trace_id)

    def on_trace_end(self, trace: Trace) -> None:
        return None

    def on_span_start(self, span: Span[Any]) -> None:
        log = current_span_log()
        if log is not None:
            log.update(span)

    def on_span_end(self, span: Span[Any]) -> None:
        log = current_span_log()
        if log is not None:
            log.update(span)
        if isinstance(span.span_data, FunctionSpanData):
            report_tool_call(span)

    def shutdown(self) -> None:
        return None

    def force_flush(self) -> None:
        return None


# Stateless (it routes by ContextVar), so one instance can be registered process-wide.
_PROCESSOR = ArtTracingProcessor()


def tracing_processor() -> ArtTracingProcessor:
    """The processor to include when you set the SDK's trace processors yourself.

    Example:
        >>> from agents import set_trace_processors
        >>> set_trace_processors([tracing_processor(), my_processor])  # fragment: `my_processor`, your own  # doctest: +SKIP
    """
    return _PROCESSOR


def configure_tracing(
    *, export_to_openai: bool = False, processors: Sequence[TracingProcessor] = ()
) -> None:
    """Route the SDK's spans to the rollouts (and to ``processors``); no export to OpenAI.

    This replaces the SDK's trace processors. ``export_to_openai=True`` keeps the SDK's own
    exporter as well (it needs ``OPENAI_API_KEY`` and the network).

    Example:
        >>> configure_tracing()                       # rollouts get their spans, nothing exported
        >>> configure_tracing(export_to_openai=True)  # changes process-wide state: the SDK would export every trace to OpenAI  # doctest: +SKIP
    """
    chosen: list[TracingProcessor] = [_PROCESSOR, *processors]
    if export_to_openai:
        from agents.tracing.processors import default_processor

        chosen.append(default_processor())
    set_trace_processors(chosen)
    if not export_to_openai:
        discard_queued_exports()


def discard_queued_exports() -> int:
    """Drop what the SDK's OpenAI exporter has queued and not sent yet; how many items.

    The SDK's ``BatchTraceProcessor`` queues a trace when it starts (and spans as they end)
    and a worker thread sends them about every 5 s. Once it is no longer among the
    processors, nothing new is queued, but what it already holds (a trace opened before the
    provider was made) would still go out. The SDK has no public call to drop it: this reads
    its module's processor and queue, and does nothing when they are not there (never
    created, or another SDK version).

    Example:
        >>> discard_queued_exports()
        0
    """
    from agents.tracing import processors as sdk_processors

    pending = getattr(getattr(sdk_processors, "_global_processor", None), "_queue", None)
    if not isinstance(pending, queue.Queue):
        return 0
    dropped = 0
    while True:
        try:
            pending.get_nowait()
        except queue.Empty:
            return dropped
        dropped += 1


def tracing_installed() -> bool:
    """Whether the rollout recorder is among the SDK's trace processors.

    The SDK has no public getter for its processors: this reads the default provider's list
    and answers False when it cannot (a custom trace provider), so callers configure again.

    Example:
        >>> configure_tracing(); tracing_installed()
        True
    """
    multi = getattr(get_trace_provider(), "_multi_processor", None)
    return _PROCESSOR in tuple(getattr(multi, "_processors", ()))
