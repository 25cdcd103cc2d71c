"""Tool calls seen by the SDK, reported to art-core's tracing with their exact timings.

art-core's tracing infers each tool call of a rollout from the conversation (the tool ran
between the request that asked for it and the one carrying its result). The SDK's function
spans know better: when the tool started and ended, its error, the agent and MCP server. The
record replaces the inferred span (matched by tool name, in order). It is a no-op while the
project's tracing is off or outside ``capture``.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from agents.tracing import Span

from art_core.tracing import record_tool_call
from art_openai_agents.spans import current_span_log, span_data_record


def _epoch(timestamp: str | None) -> float | None:
    return datetime.fromisoformat(timestamp).timestamp() if timestamp else None


def _arguments(raw: Any) -> Any:
    """The SDK keeps tool arguments as the model's JSON text: send them as JSON values."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw
    return raw


def report_tool_call(span: Span[Any]) -> None:
    """Hand a finished tool call to the project's tracing (it ignores calls outside capture).

    Example:
        >>> report_tool_call(span)  # from ArtTracingProcessor.on_span_end  # fragment: a finished function `span` of the SDK  # doctest: +SKIP
    """
    data = span_data_record(span)
    metadata: dict[str, Any] = {"framework": "openai-agents", "span_id": span.span_id}
    log = current_span_log()
    agent = next(
        (r.name for r in (log.ancestors(span.parent_id) if log else ()) if r.type == "agent"),
        None,
    )
    if agent is not None:
        metadata["agent"] = agent
    mcp = data.get("mcp_data")
    if isinstance(mcp, dict) and mcp.get("server"):
        metadata["mcp_server"] = mcp["server"]
    error = span.error
    record_tool_call(
        span.span_data.name,
        _arguments(data.get("input")),
        data.get("output"),
        start_time=_epoch(span.started_at),
        end_time=_epoch(span.ended_at),
        error=str(error.get("message")) if error else None,
        metadata=metadata,
    )
