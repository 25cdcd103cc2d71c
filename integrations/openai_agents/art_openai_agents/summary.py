"""What an agent run did, from its spans: agents, tool calls, handoffs, guardrails, MCP.

This becomes ``trajectory.metadata["openai_agents"]``: JSON a person (or a reward function,
or the project's tracing) can read without replaying the run.
"""

from __future__ import annotations

from typing import Any

from art_openai_agents.spans import SpanLog, SpanRecord


def _agent_of(record: SpanRecord, log: SpanLog) -> str | None:
    """The agent a span ran under: the nearest agent span above it."""
    for ancestor in log.ancestors(record.parent_id):
        if ancestor.type == "agent":
            return ancestor.name
    return None


def run_summary(log: SpanLog) -> dict[str, Any]:
    """Agents (in order of first turn), tool calls with outputs, handoffs, guardrails, spans.

    Example:
        >>> run_summary(SpanLog())["agents"]
        []
    """
    agents: list[str] = []
    for record in log.records("agent"):
        if record.name not in agents:
            agents.append(record.name)
    tool_calls = []
    for record in log.records("function"):
        call: dict[str, Any] = {
            "agent": _agent_of(record, log),
            "tool": record.name,
            "input": record.data.get("input"),
            "output": record.data.get("output"),
        }
        mcp = record.data.get("mcp_data")
        if isinstance(mcp, dict) and mcp.get("server"):
            call["mcp_server"] = mcp["server"]
        if record.error:
            call["error"] = record.error
        tool_calls.append(call)
    return {
        "agents": agents,
        "tool_calls": tool_calls,
        "handoffs": [
            {"from": r.data.get("from_agent"), "to": r.data.get("to_agent")}
            for r in log.records("handoff")
        ],
        "guardrails": [
            {"name": r.name, "triggered": bool(r.data.get("triggered")), "agent": _agent_of(r, log)}
            for r in log.records("guardrail")
        ],
        "mcp_servers": sorted(
            {str(r.data.get("server")) for r in log.records("mcp_tools") if r.data.get("server")}
        ),
        "trace_ids": list(log.trace_ids),
        "spans": [r.model_dump(mode="json") for r in log.records()],
    }
