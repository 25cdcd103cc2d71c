"""Render span trees as OpenTelemetry spans on a private ``TracerProvider``.

The provider is our own (never the global one), so tracing rollouts does not change what a
program's other instrumentation exports, and ``weave.init`` / Langfuse setting the global
provider does not change ours. Spans are batched (``BatchSpanProcessor``, bounded queue) and
exported by a background thread through a ``GuardedExporter``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode

from art_core.tracing import genai, openinference
from art_core.tracing.exporters import GuardedExporter
from art_core.tracing.settings import TracingSettings
from art_core.tracing.tree import AttributeValue, ScoreUpdate, SpanNode

TRACER_NAME = "art_core.tracing"
MAX_REMEMBERED = 100_000  # exported rollouts whose span context we keep (links, late scores)


def ns(seconds: float) -> int:
    """Seconds since the epoch as OpenTelemetry's nanoseconds."""
    return int(seconds * 1e9)


def new_provider(settings: TracingSettings) -> TracerProvider:
    """A private provider named after ``settings.service_name`` (no exit hook: we flush)."""
    resource = Resource.create({"service.name": settings.service_name})
    return TracerProvider(resource=resource, shutdown_on_exit=False)


def current_parent() -> Context | None:
    """The caller's current span as a parent context (None when there is no valid span)."""
    span_context = trace.get_current_span().get_span_context()
    if not span_context.is_valid:
        return None
    return trace.set_span_in_context(NonRecordingSpan(span_context), Context())


class Remembered:
    """A bounded map from traced keys (rollout ids) to their exported span contexts."""

    def __init__(self, limit: int = MAX_REMEMBERED) -> None:
        self._items: OrderedDict[str, SpanContext] = OrderedDict()
        self._limit = limit

    def put(self, key: str, value: SpanContext) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self._limit:
            self._items.popitem(last=False)

    def get(self, key: str) -> SpanContext | None:
        return self._items.get(key)


Decorate = Callable[[SpanNode], dict[str, AttributeValue]]


def weave_thread_attributes(root: SpanNode) -> dict[str, AttributeValue]:
    """Weave's thread attributes for spans it ingests over OTLP: a rollout is a thread
    (``wandb.thread_id``, on every span of its trace) whose model and tool calls are its
    turns (``wandb.is_turn``, added per span by ``OtelSink``).

    Example:
        >>> weave_thread_attributes(SpanNode("r", "rollout", 0, 1, key="r1"))
        {'wandb.thread_id': 'r1'}
    """
    if root.kind == "rollout" and root.key:
        return {WEAVE_THREAD_ID: root.key}
    return {}


WEAVE_THREAD_ID = "wandb.thread_id"
WEAVE_IS_TURN = "wandb.is_turn"


class OtelSink:
    """Export span trees through an OpenTelemetry ``SpanExporter`` (OTLP, console, in-memory).

    Each span carries the GenAI attributes of its node, the OpenInference ones beside them
    (``openinference = False`` in a subclass turns those off), and its trace's attributes
    (``trace_attributes``: session, thread) on every span of the tree.

    Example:
        >>> from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        >>> memory = InMemorySpanExporter()
        >>> sink = OtelSink(memory, TracingSettings(), label="memory")
        >>> sink.emit(SpanNode("rollout", "rollout", 0.0, 1.0), None)
        >>> sink.flush(5.0), [s.name for s in memory.get_finished_spans()]
        (True, ['rollout'])
        >>> sink.shutdown(5.0)
    """

    name = "otlp"
    openinference = True

    def __init__(
        self,
        exporter: SpanExporter | None,
        settings: TracingSettings,
        *,
        label: str = "otlp",
        provider: TracerProvider | None = None,
    ) -> None:
        self.settings = settings
        self.label = label
        self.owns_provider = provider is None
        self.provider = provider or new_provider(settings)
        self.guard: GuardedExporter | None = None
        self.processor: BatchSpanProcessor | None = None
        if exporter is not None:
            self.guard = GuardedExporter(exporter, label)
            self.processor = BatchSpanProcessor(
                self.guard,
                max_queue_size=settings.max_queue_size * 4,
                schedule_delay_millis=1000,
                export_timeout_millis=int(settings.export_timeout_s * 1000),
            )
            self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer(TRACER_NAME)
        self.remembered = Remembered()

    # -------------------------------------------------------------- caller side
    def capture_parent(self) -> Any:
        return current_parent()

    # -------------------------------------------------------------- worker side
    def decorate(self, node: SpanNode) -> dict[str, AttributeValue]:
        """Extra attributes for one span (exporter-specific conventions); none here."""
        return {}

    def trace_attributes(self, root: SpanNode, nested: bool) -> dict[str, AttributeValue]:
        """Attributes for every span of ``root``'s tree. ``nested``: the tree is rendered
        inside the caller's own trace (whose trace-level attributes are not ours to set)."""
        out: dict[str, AttributeValue] = weave_thread_attributes(root)
        if self.openinference:
            out.update(openinference.trace_attributes(root))
        return out

    def emit(self, node: SpanNode, parent: Any) -> None:
        """Create the tree's spans (ended, with their recorded times)."""
        context = parent if isinstance(parent, Context) else Context()
        nested = trace.get_current_span(context).get_span_context().is_valid
        self._render(node, context, self.trace_attributes(node, nested), root=True)

    def _render(
        self,
        node: SpanNode,
        parent: Context,
        inherited: dict[str, AttributeValue],
        root: bool = False,
    ) -> SpanContext:
        attributes = {**node.attributes, **inherited}
        if self.openinference:
            chars = self.settings.max_content_chars
            attributes.update(openinference.span_attributes(node, chars))
            if root:
                attributes.update(openinference.root_attributes(node))
        if WEAVE_THREAD_ID in inherited and node.kind in ("llm", "tool"):
            attributes[WEAVE_IS_TURN] = True
        attributes.update(self.decorate(node))
        links = [Link(ctx) for key in node.links if (ctx := self.remembered.get(key)) is not None]
        span = self.tracer.start_span(
            node.name,
            context=parent,
            kind=SpanKind.CLIENT if node.kind == "llm" else SpanKind.INTERNAL,
            attributes=attributes,
            links=links,
            start_time=ns(node.start_time),
        )
        for score in node.scores:
            span.add_event(
                EVALUATION_EVENT,
                _evaluation(score.name, score.value, score.comment),
                timestamp=ns(node.end_time),
            )
        if node.error:
            span.set_status(Status(StatusCode.ERROR, node.error))
        inner = trace.set_span_in_context(span, Context())
        for child in node.children:
            self._render(child, inner, inherited)
        span.end(end_time=ns(node.end_time))
        context = span.get_span_context()
        if node.key:
            self.remembered.put(node.key, context)
        self.after_render(node, context, parent)
        return context

    def after_render(self, node: SpanNode, context: SpanContext, parent: Context) -> None:
        """Hook for exporters that send more than spans (Langfuse scores)."""

    def update_scores(self, update: ScoreUpdate) -> None:
        """Scores set after the rollout was exported: one short child span per score."""
        context = self.remembered.get(update.key)
        if context is None:
            return
        parent = trace.set_span_in_context(NonRecordingSpan(context), Context())
        for score in update.scores:
            span = self.tracer.start_span(
                f"evaluate {score.name}",
                context=parent,
                attributes={
                    genai.OPERATION: "evaluate",
                    **_evaluation(score.name, score.value, score.comment),
                },
                start_time=ns(update.time),
            )
            span.add_event(
                EVALUATION_EVENT,
                _evaluation(score.name, score.value, score.comment),
                timestamp=ns(update.time),
            )
            span.end(end_time=ns(update.time))

    def flush(self, timeout_s: float) -> bool:
        return bool(self.provider.force_flush(int(timeout_s * 1000)))

    def shutdown(self, timeout_s: float) -> None:
        self.flush(timeout_s)
        if self.owns_provider:
            self.provider.shutdown()
        elif self.processor is not None:
            self.processor.shutdown()

    def stats(self) -> dict[str, int]:
        return self.guard.stats() if self.guard else {}


EVALUATION_EVENT = genai.EVALUATION_EVENT


def _evaluation(name: str, value: float, comment: str | None) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {
        genai.EVALUATION_NAME: name,
        genai.EVALUATION_SCORE: value,
    }
    if comment:
        attributes[genai.EVALUATION_EXPLANATION] = comment
    return attributes
