"""Tool-call spans of a rollout: inferred from its conversation, or reported by integrations.

An assistant message asks for a tool call; a later request carries its ``tool`` message, so the
tool ran between the end of the first request and the start of the second. Integrations that
know exact timings (an MCP client, a LangGraph tool node) report them with
``art_core.tracing.record_tool_call``; those records replace the inferred calls they match.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from art_core.tracing import genai
from art_core.tracing.settings import TracingSettings
from art_core.tracing.tree import AttributeValue, SpanNode
from art_core.trajectories import LLMCall


@dataclass(frozen=True)
class ToolRecord:
    """One tool call as an integration saw it (exact timings), see ``record_tool_call``."""

    name: str
    arguments: Any = None
    result: Any = None
    start_time: float | None = None
    end_time: float | None = None
    call_id: str | None = None
    error: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)


def call_end(call: LLMCall) -> float:
    """When a recorded call finished (seconds since the epoch)."""
    return call.created_at + call.latency_s


def clip_value(value: Any, settings: TracingSettings) -> Any:
    return genai.clip(value, settings.max_content_chars) if isinstance(value, str) else value


@dataclass
class ToolCall:
    name: str
    call_id: str | None
    arguments: Any
    start_time: float
    end_time: float | None = None
    result: Any = None
    has_result: bool = False
    error: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    exact: bool = False


def inferred_tool_calls(requests: list[list[LLMCall]], rollout_end: float) -> list[ToolCall]:
    found: list[ToolCall] = []
    by_id: dict[str, ToolCall] = {}
    for request in requests:
        # Tool results this request sends close the calls they answer (first time seen).
        for message in request[0].messages:
            if message.get("role") != "tool":
                continue
            pending = by_id.get(str(message.get("tool_call_id")))
            if pending is not None and not pending.has_result:
                pending.result = message.get("content")
                pending.has_result = True
                pending.end_time = request[0].created_at
        for tool_call in request[0].response_message.get("tool_calls") or []:
            function = tool_call.get("function") or {}
            call = ToolCall(
                name=str(function.get("name", "tool")),
                call_id=tool_call.get("id"),
                arguments=genai.parse_arguments(function.get("arguments")),
                start_time=call_end(request[0]),
            )
            found.append(call)
            if call.call_id:
                by_id[call.call_id] = call
    for call in found:
        if call.end_time is None:
            call.end_time = max(call.start_time, rollout_end)
    return found


def merge_tool_records(
    inferred: list[ToolCall], records: Sequence[ToolRecord], fallback_time: float
) -> list[ToolCall]:
    """Exact records from integrations replace the inferred call with the same id (or, failing
    that, the first one with the same name still unmatched); the others are added."""
    calls = list(inferred)
    matched: set[int] = set()
    for record in records:
        target = None
        for index, call in enumerate(calls):
            if index in matched:
                continue
            if (record.call_id and call.call_id == record.call_id) or (
                not record.call_id and not call.exact and call.name == record.name
            ):
                target = index
                break
        start = record.start_time
        merged = ToolCall(
            name=record.name,
            call_id=record.call_id,
            arguments=record.arguments,
            start_time=start if start is not None else fallback_time,
            end_time=record.end_time,
            result=record.result,
            has_result=record.result is not None,
            error=record.error,
            metadata=record.metadata,
            exact=True,
        )
        if target is None:
            calls.append(merged)
            matched.add(len(calls) - 1)
            continue
        old = calls[target]
        merged.call_id = merged.call_id or old.call_id
        if record.start_time is None:
            merged.start_time = old.start_time
        if record.end_time is None:
            merged.end_time = old.end_time
        if merged.arguments is None:
            merged.arguments = old.arguments
        if not merged.has_result and old.has_result:
            merged.result, merged.has_result = old.result, True
        calls[target] = merged
        matched.add(target)
    return calls


def tool_node(call: ToolCall, rollout_id: str, settings: TracingSettings) -> SpanNode:
    attributes: dict[str, AttributeValue] = {
        genai.OPERATION: "execute_tool",
        genai.TOOL_NAME: call.name,
        genai.TOOL_TYPE: "function",
        genai.CONVERSATION_ID: rollout_id,
        "art.rollout.id": rollout_id,
        "art.tool.timing": "recorded" if call.exact else "inferred",
    }
    if call.call_id:
        attributes[genai.TOOL_CALL_ID] = call.call_id
    attributes.update(genai.flatten("art.tool.metadata", call.metadata))
    inputs: dict[str, Any] = {"name": call.name}
    output: Any = None
    if settings.capture_content:
        attributes[genai.TOOL_ARGUMENTS] = genai.to_json(call.arguments)
        inputs["arguments"] = call.arguments
        if call.has_result:
            result = clip_value(call.result, settings)
            attributes[genai.TOOL_RESULT] = (
                result if isinstance(result, str) else genai.to_json(result)
            )
            output = result
    end = call.end_time if call.end_time is not None else call.start_time
    return SpanNode(
        name=f"execute_tool {call.name}",
        kind="tool",
        start_time=call.start_time,
        end_time=max(end, call.start_time),
        attributes=attributes,
        input=inputs,
        output=output,
        error=call.error,
        display_name=call.name,
    )
