"""Parse ``<tool_call>{...}</tool_call>`` blocks (Hermes / Qwen format) out of model text."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass
class ParsedAssistant:
    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message


def parse_tool_calls(text: str, tool_names: set[str]) -> ParsedAssistant:
    """Split model text into content and OpenAI ``tool_calls``.

    A block whose JSON is invalid or names an unknown tool is left in the content, as the
    model wrote it: the agent (and the reward) should see the mistake, not a silent drop.

    Example:
        >>> p = parse_tool_calls('<tool_call>\\n{"name": "f", "arguments": {"x": 1}}\\n</tool_call>', {"f"})
        >>> p.tool_calls[0]["function"]
        {'name': 'f', 'arguments': '{"x": 1}'}
    """
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    position = 0
    for match in TOOL_CALL_RE.finditer(text):
        call = _parse_one(match.group(1), tool_names)
        if call is None:
            continue
        kept.append(text[position : match.start()])
        position = match.end()
        calls.append(call)
    kept.append(text[position:])
    content = "".join(kept).strip() if calls else text
    return ParsedAssistant(content=content or None if calls else content, tool_calls=calls)


def _parse_one(body: str, tool_names: set[str]) -> dict[str, Any] | None:
    try:
        payload = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(payload, dict):
        return None
    name = payload.get("name")
    arguments = payload.get("arguments", payload.get("parameters", {}))
    if not isinstance(name, str) or name not in tool_names or not isinstance(arguments, dict):
        return None
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }
