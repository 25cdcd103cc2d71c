"""Chat templates shipped with the package."""

from functools import cache
from pathlib import Path


@cache
def tool_chat_template() -> str:
    """The tool-capable ChatML template (Hermes/Qwen style ``<tool_call>`` blocks)."""
    return (Path(__file__).parent / "tool_chatml.jinja").read_text(encoding="utf-8")
