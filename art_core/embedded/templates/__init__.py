"""Chat templates shipped with the package."""

from functools import cache
from pathlib import Path


@cache
def tool_chat_template() -> str:
    """The tool-capable ChatML template (Hermes/Qwen style ``<tool_call>`` blocks)."""
    return (Path(__file__).parent / "tool_chatml.jinja").read_text(encoding="utf-8")


@cache
def family_template(family: str) -> str:
    """The chat template written for ``tiny-<family>`` (``templates/<family>.jinja``)."""
    return (Path(__file__).parent / f"{family}.jinja").read_text(encoding="utf-8")


def tool_template_for(template: str) -> str:
    """A tool-capable template in the turn format of ``template`` (a model's own template
    that cannot render tools): Gemma's turns for Gemma, else ChatML.

    Example:
        >>> "<start_of_turn>" in tool_template_for("{{ '<start_of_turn>user' }}")
        True
    """
    if "<start_of_turn>" in template:
        return family_template("gemma3")
    return tool_chat_template()
