"""Per-call metadata: which agent (and guardrail, tool, MCP servers) made a model call.

The SDK does not pass the agent to ``Model.get_response``, but it calls the model inside the
agent's ``turn`` span, which names the agent and the turn. That span is the SDK's "current
span" (a ContextVar) even when tracing is disabled (then it is a no-op span that still carries
its data). When the rollout's ``SpanLog`` is available, the span's ancestors add the context
of nested runs: a guardrail that runs an agent, an agent used as a tool.
"""

from __future__ import annotations

from typing import Any

from agents.tracing import Span, get_current_span
from agents.tracing.span_data import AgentSpanData, TurnSpanData

from art_openai_agents.spans import SpanLog, current_span_log

FRAMEWORK = "openai-agents"


def _from_span(span: Span[Any] | None) -> dict[str, Any]:
    data = span.span_data if span is not None else None
    if isinstance(data, TurnSpanData):
        return {"agent": data.agent_name, "turn": data.turn}
    if isinstance(data, AgentSpanData):
        return {"agent": data.name}
    return {}


def _from_log(span: Span[Any], log: SpanLog) -> dict[str, Any]:
    found: dict[str, Any] = {}
    servers: set[str] = set()
    for record in log.ancestors(span.span_id):
        if "agent_span_id" not in found:
            # The SDK lists an agent's MCP tools in its turn span, just before the model call.
            servers.update(
                str(r.data.get("server")) for r in log.children(record.span_id, "mcp_tools")
            )
        if record.type == "agent" and "agent_span_id" not in found:
            found["agent_span_id"] = record.span_id
        elif record.type == "guardrail":
            found.setdefault("guardrail", record.name)
        elif record.type == "function":
            found.setdefault("tool", record.name)
    if servers:
        found["mcp_servers"] = sorted(servers)
    return found


def call_metadata(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Metadata for the model call about to be made in this context.

    Example:
        >>> call_metadata()  # outside any agent run
        {'framework': 'openai-agents'}
    """
    span = get_current_span()
    metadata: dict[str, Any] = {"framework": FRAMEWORK, **_from_span(span)}
    log = current_span_log()
    if span is not None and log is not None and log.get(span.span_id) is not None:
        metadata.update(_from_log(span, log))
        metadata["span_id"] = span.span_id
        metadata["trace_id"] = span.trace_id
    metadata.update(extra or {})
    return metadata
