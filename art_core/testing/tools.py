"""Tool definitions for tests and benchmarks, in OpenAI's ``tools`` format.

Their arguments are enums, so a grammar-forced call from a random test model always parses.
"""

from __future__ import annotations

from typing import Any

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
