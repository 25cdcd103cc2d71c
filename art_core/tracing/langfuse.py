"""Langfuse (SDK 5, OpenTelemetry based): a trace per rollout, LLM calls as generations with
usage, tool calls as tool observations, reward and RULER score as Langfuse scores.

Our spans go through the Langfuse client's own span processor (its batching, masking and
endpoint), decorated with Langfuse's ``langfuse.observation.*`` attributes; scores go
through ``Langfuse.create_score`` (its batched score queue).
"""

from __future__ import annotations

import hashlib
import json
import threading
from typing import Any

from opentelemetry.context import Context
from opentelemetry.trace import SpanContext, get_current_span

from art_core.background import call_with_timeout
from art_core.tracing import genai, openinference
from art_core.tracing.otel import TRACER_NAME, OtelSink, new_provider
from art_core.tracing.settings import TracingSettings
from art_core.tracing.tree import AttributeValue, Score, ScoreUpdate, SpanNode

OBSERVATION_TYPES = {"rollout": "agent", "llm": "generation", "tool": "tool", "train": "span"}
# Langfuse's trace-level attribute names (langfuse._client.attributes.LangfuseOtelSpanAttributes;
# the SDK writes the session as ``session.id``, Langfuse's docs also list
# ``langfuse.session.id``: both are set).
TRACE_NAME = "langfuse.trace.name"
TRACE_TAGS = "langfuse.trace.tags"
TRACE_METADATA = "langfuse.trace.metadata"
SESSION_IDS = ("session.id", "langfuse.session.id")


def metadata_value(value: Any) -> str:
    """One metadata value as Langfuse's SDK encodes it: JSON, strings included, compact,
    non-ASCII kept (so ``"3"`` and ``3`` stay distinct when Langfuse decodes them).

    Example:
        >>> metadata_value("s0"), metadata_value({"a": 1})
        ('"s0"', '{"a":1}')
    """
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


def langfuse_trace_attributes(root: SpanNode) -> dict[str, AttributeValue]:
    """The trace-level attributes of ``root``'s trace: name, tags, session and metadata
    (one ``langfuse.trace.metadata.KEY`` each, so Langfuse can filter on it).

    Example:
        >>> sorted(langfuse_trace_attributes(SpanNode("r", "rollout", 0, 1, key="r1")))
        ['langfuse.trace.metadata.rollout_id', 'langfuse.trace.name', 'langfuse.trace.tags']
    """
    attributes: dict[str, AttributeValue] = {
        TRACE_NAME: root.display_name or root.name,
        TRACE_TAGS: openinference.trace_tags(root),
    }
    session = openinference.session_id(root)
    if session:
        attributes.update(dict.fromkeys(SESSION_IDS, session))
    for key, value in openinference.trace_metadata(root).items():
        attributes[f"{TRACE_METADATA}.{key}"] = metadata_value(value)
    return attributes


def _export_ours_and_default(span: Any) -> bool:
    """Langfuse's default filter, plus every span of ours (train steps carry no gen_ai.*)."""
    from langfuse.span_filter import is_default_export_span

    scope = span.instrumentation_scope
    return (scope is not None and scope.name == TRACER_NAME) or is_default_export_span(span)


def score_id(observation_id: str, name: str) -> str:
    """A stable score id, so re-scoring a rollout updates its score instead of adding one.

    Example:
        >>> score_id("00f067aa0ba902b7", "reward") == score_id("00f067aa0ba902b7", "reward")
        True
    """
    return hashlib.sha256(f"{observation_id}:{name}".encode()).hexdigest()[:32]


class LangfuseSink(OtelSink):
    """Send rollouts to Langfuse.

    Pass a ``langfuse.Langfuse`` client, or the keyword arguments to build one (``public_key``,
    ``secret_key``, ``base_url``, ``span_exporter``, ...; the ``LANGFUSE_*`` environment
    variables fill in the rest). A client built here gets a private ``TracerProvider`` and is
    shut down with tracing; a client passed in is only flushed.

    Example:
        >>> from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        >>> sink = LangfuseSink(TracingSettings(), public_key="pk-lf-doc", secret_key="sk-lf-doc",
        ...                     span_exporter=InMemorySpanExporter())  # changes process-wide state: Langfuse registers the client by its key  # doctest: +SKIP
    """

    name = "langfuse"
    # Langfuse reads its own langfuse.observation.* input/output; OpenInference's copies of
    # the same messages would double every span's size.
    openinference = False

    def __init__(
        self, settings: TracingSettings, client: Any = None, **langfuse_kwargs: Any
    ) -> None:
        try:
            from langfuse import Langfuse
        except ImportError as exc:
            raise ImportError(
                "Langfuse tracing needs `langfuse`: pip install 'art-core[langfuse]'"
            ) from exc
        self.owns_client = client is None
        if client is None:
            langfuse_kwargs.setdefault("tracer_provider", new_provider(settings))
            langfuse_kwargs.setdefault("should_export_span", _export_ours_and_default)
            client = Langfuse(**langfuse_kwargs)
        elif langfuse_kwargs:
            raise TypeError("pass either a Langfuse client or the arguments to build one, not both")
        resources = getattr(client, "_resources", None)
        provider = getattr(resources, "tracer_provider", None)
        if provider is None:
            raise ValueError(
                "the Langfuse client is disabled (no public/secret key, or tracing_enabled=False): "
                "set LANGFUSE_PUBLIC_KEY and LANGFUSE_SECRET_KEY or pass public_key/secret_key"
            )
        self.client = client
        super().__init__(None, settings, label="langfuse", provider=provider)
        # Langfuse owns the provider's processor; shutting down is the client's job.
        self.owns_provider = False
        self._nested: set[str] = set()  # rollouts scored on their observation (worker only)

    def trace_attributes(self, root: SpanNode, nested: bool) -> dict[str, AttributeValue]:
        """Langfuse's trace-level attributes, on every span of the trace as its SDK's
        ``propagate_attributes`` writes them (Langfuse filters observations by them). A rollout
        nested in the caller's trace (``@observe``) leaves that trace's name and tags alone."""
        attributes = super().trace_attributes(root, nested)
        if nested:
            return attributes
        return {**attributes, **langfuse_trace_attributes(root)}

    def decorate(self, node: SpanNode) -> dict[str, AttributeValue]:
        attributes: dict[str, AttributeValue] = {
            "langfuse.observation.type": OBSERVATION_TYPES.get(node.kind, "span"),
        }
        if node.input is not None:
            attributes["langfuse.observation.input"] = genai.to_json(self._input(node))
        if node.output is not None:
            attributes["langfuse.observation.output"] = genai.to_json(self._output(node))
        if node.error:
            attributes["langfuse.observation.level"] = "ERROR"
            attributes["langfuse.observation.status_message"] = node.error
        if node.kind == "llm":
            usage = (node.output or {}).get("usage", {})
            attributes["langfuse.observation.model.name"] = str(
                node.attributes.get(genai.REQUEST_MODEL, "")
            )
            attributes["langfuse.observation.usage_details"] = genai.to_json(
                {
                    "input": usage.get("prompt_tokens", 0),
                    "output": usage.get("completion_tokens", 0),
                    "total": usage.get("total_tokens", 0),
                }
            )
            params = (node.input or {}).get("params")
            if params:
                attributes["langfuse.observation.model.parameters"] = genai.to_json(params)
            # Langfuse shows input/output above; do not ship the messages twice.
            attributes.pop(genai.INPUT_MESSAGES, None)
        return attributes

    @staticmethod
    def _input(node: SpanNode) -> Any:
        if node.kind == "llm":
            return node.input.get("messages", node.input)
        if node.kind == "tool":
            return node.input.get("arguments", node.input)
        return node.input

    @staticmethod
    def _output(node: SpanNode) -> Any:
        if node.kind == "llm":
            choices = node.output.get("choices") or []
            messages = [c.get("message") for c in choices if c.get("message") is not None]
            if len(messages) == 1:
                return messages[0]
            return messages or node.output
        return node.output

    def after_render(self, node: SpanNode, context: SpanContext, parent: Context) -> None:
        if not node.scores:
            return
        # A rollout that is its own trace is scored at trace level (visible in the trace list);
        # one nested in the caller's trace (@observe) is scored on its observation.
        nested = get_current_span(parent).get_span_context().is_valid
        if nested and node.key:
            self._nested.add(node.key)
        self._send_scores(node.scores, context, nested)

    def _send_scores(self, scores: list[Score], context: SpanContext, nested: bool) -> None:
        trace_id = format(context.trace_id, "032x")
        observation_id = format(context.span_id, "016x")
        for score in scores:
            self.client.create_score(
                name=score.name,
                value=score.value,
                trace_id=trace_id,
                observation_id=observation_id if nested else None,
                score_id=score_id(observation_id, score.name),
                data_type="NUMERIC",
                comment=score.comment,
            )

    def update_scores(self, update: ScoreUpdate) -> None:
        context = self.remembered.get(update.key)
        if context is not None:
            self._send_scores(update.scores, context, nested=update.key in self._nested)

    def flush(self, timeout_s: float) -> bool:
        # Langfuse's flush has no timeout (it retries a down host for seconds): bound it.
        return call_with_timeout(self.client.flush, timeout_s, name="art-langfuse-flush")

    def shutdown(self, timeout_s: float) -> None:
        self.flush(timeout_s)
        if self.owns_client:
            threading.Thread(
                target=self.client.shutdown, name="art-langfuse-shutdown", daemon=True
            ).start()
