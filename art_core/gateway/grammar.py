"""Grammars for constrained decoding (llguidance) from OpenAI request fields (a forced tool
call's grammar is its chat format's: ``art_core.chat_formats``).

llguidance was chosen over xgrammar and outlines because it is a 3 MB wheel with no
dependencies (xgrammar pulls triton, ~1 GB, which it does not need on CPU), compiles JSON
schemas and Lark grammars in milliseconds, and computes a token mask in ~10 µs per step.
"""

from __future__ import annotations

import json
from typing import Any

from art_core.chat_formats.schemas import JSON_OPTIONS


def json_grammar(schema: dict[str, Any] | None) -> str:
    """A grammar for ``response_format``: any JSON object, or one matching ``schema``.

    Example:
        >>> json_grammar(None).startswith("start:")
        True
    """
    schema = {"type": "object"} if schema is None else schema
    return f"start: %json {json.dumps({**schema, 'x-guidance': JSON_OPTIONS})}\n"
