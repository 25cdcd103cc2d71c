"""OpenTelemetry GenAI semantic conventions: attribute names and the message JSON format.

Chat messages are exported in the conventions' "parts" form
(``[{"role": "user", "parts": [{"type": "text", "content": "..."}]}]``), as JSON strings in
``gen_ai.input.messages`` / ``gen_ai.output.messages``. Reference:
https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from art_core.tracing.tree import AttributeValue

PROVIDER = "art"  # gen_ai.provider.name / gen_ai.system: the gateway serving our model

OPERATION = "gen_ai.operation.name"
PROVIDER_NAME = "gen_ai.provider.name"
SYSTEM = "gen_ai.system"  # the older name of gen_ai.provider.name; many backends still read it
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
RESPONSE_ID = "gen_ai.response.id"
FINISH_REASONS = "gen_ai.response.finish_reasons"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
TOOL_DEFINITIONS = "gen_ai.tool.definitions"
CONVERSATION_ID = "gen_ai.conversation.id"
AGENT_NAME = "gen_ai.agent.name"
AGENT_ID = "gen_ai.agent.id"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
TOOL_ARGUMENTS = "gen_ai.tool.call.arguments"
TOOL_RESULT = "gen_ai.tool.call.result"
EVALUATION_EVENT = "gen_ai.evaluation.result"
EVALUATION_NAME = "gen_ai.evaluation.name"
EVALUATION_SCORE = "gen_ai.evaluation.score.value"
EVALUATION_EXPLANATION = "gen_ai.evaluation.explanation"

# Request fields mapped to gen_ai.request.* attributes.
REQUEST_PARAMS = {
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "max_tokens": "gen_ai.request.max_tokens",
    "max_completion_tokens": "gen_ai.request.max_tokens",
    "seed": "gen_ai.request.seed",
    "n": "gen_ai.request.choice.count",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
    "presence_penalty": "gen_ai.request.presence_penalty",
}


def clip(text: str, max_chars: int | None) -> str:
    """``text`` cut to ``max_chars`` characters, marking the cut.

    Example:
        >>> clip("abcdef", 3)
        'abc…[3 more chars]'
    """
    if max_chars is None or len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}…[{len(text) - max_chars} more chars]"


def parse_arguments(raw: Any) -> Any:
    """Tool-call arguments as JSON when they parse (OpenAI sends them as a string)."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def _content_parts(content: Any, max_chars: int | None) -> list[dict[str, Any]]:
    if content is None or content == "":
        return []
    if isinstance(content, str):
        return [{"type": "text", "content": clip(content, max_chars)}]
    parts: list[dict[str, Any]] = []
    if isinstance(content, list):
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text":
                parts.append(
                    {"type": "text", "content": clip(str(part.get("text", "")), max_chars)}
                )
            elif isinstance(part, Mapping):
                # Images, audio, files: keep the kind, never the (possibly huge) payload.
                parts.append({"type": str(part.get("type", "unknown"))})
        return parts
    return [{"type": "text", "content": clip(str(content), max_chars)}]


def semconv_message(message: Mapping[str, Any], max_chars: int | None = None) -> dict[str, Any]:
    """One OpenAI chat message in the GenAI conventions' parts form.

    Example:
        >>> semconv_message({"role": "tool", "tool_call_id": "c1", "content": "12°C"})
        {'role': 'tool', 'parts': [{'type': 'tool_call_response', 'id': 'c1', 'response': '12°C'}]}
    """
    role = str(message.get("role", "user"))
    content = message.get("content")
    if role == "tool":
        response = clip(content, max_chars) if isinstance(content, str) else content
        parts: list[dict[str, Any]] = [
            {"type": "tool_call_response", "id": message.get("tool_call_id"), "response": response}
        ]
    else:
        parts = _content_parts(content, max_chars)
    for tool_call in message.get("tool_calls") or []:
        function = tool_call.get("function") or {}
        parts.append(
            {
                "type": "tool_call",
                "id": tool_call.get("id"),
                "name": function.get("name"),
                "arguments": parse_arguments(function.get("arguments")),
            }
        )
    return {"role": role, "parts": parts}


def semconv_messages(
    messages: Iterable[Mapping[str, Any]], max_chars: int | None = None
) -> list[dict[str, Any]]:
    """Every message of a conversation in the parts form."""
    return [semconv_message(m, max_chars) for m in messages]


def to_json(value: Any) -> str:
    """Compact JSON for an attribute value (anything not JSON-able becomes its ``str``)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def attribute_value(value: Any) -> AttributeValue | None:
    """``value`` as an OpenTelemetry attribute value: scalars and homogeneous lists as they are,
    NaN/inf as strings, anything else as JSON; None stays None (the caller drops it).

    Example:
        >>> attribute_value({"a": 1}), attribute_value([1, 2]), attribute_value(float("nan"))
        ('{"a":1}', [1, 2], 'nan')
    """
    if value is None:
        return None
    if isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, list | tuple) and value:
        kinds = {type(v) for v in value}
        if len(kinds) == 1 and kinds <= {str, bool, int, float}:
            return list(value)
    return to_json(value)


def flatten(prefix: str, values: Mapping[str, Any]) -> dict[str, AttributeValue]:
    """``{prefix}.{key}`` attributes for a mapping (values through ``attribute_value``).

    Example:
        >>> flatten("art.metrics", {"chars": 3, "ok": True})
        {'art.metrics.chars': 3, 'art.metrics.ok': True}
    """
    out: dict[str, AttributeValue] = {}
    for key, value in values.items():
        converted = attribute_value(value)
        if converted is not None:
            out[f"{prefix}.{key}"] = converted
    return out


def request_attributes(params: Mapping[str, Any]) -> dict[str, AttributeValue]:
    """``gen_ai.request.*`` attributes from a chat-completion request's fields."""
    out: dict[str, AttributeValue] = {}
    for name, attribute in REQUEST_PARAMS.items():
        value = params.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[attribute] = value
    stop = params.get("stop")
    if isinstance(stop, str):
        out["gen_ai.request.stop_sequences"] = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop) and stop:
        out["gen_ai.request.stop_sequences"] = list(stop)
    return out
