"""Reasoning blocks of thinking models: ``<think>...</think>`` before the answer.

Qwen3 (and QwQ, DeepSeek-R1 and their distills) think inside ``<think>`` tags. The block is
returned as ``reasoning_content`` (not content), kept in the recorded tokens (it is trained
like any sampled token), and on the next turn the prompt is spliced onto the sampled ids, so
the model sees its reasoning whatever the template would render. Some templates open the
block in the generation prompt (``<think>\\n`` at its end): the answer then starts inside it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ThinkTags:
    """``<think>``/``</think>`` (or other tags) around reasoning at the start of an answer.

    Example:
        >>> ThinkTags().split("<think>\\nplan\\n</think>\\n\\nHello", opened=False)
        ('plan', 'Hello')
        >>> ThinkTags().split("plan</think>Hi", opened=True)
        ('plan', 'Hi')
    """

    name: str = "qwen3"
    open: str = "<think>"
    close: str = "</think>"

    def split(self, text: str, *, opened: bool) -> tuple[str | None, str]:
        """(reasoning or None, the rest) of a whole answer. An unclosed block is all
        reasoning (the answer was cut inside it)."""
        body = text
        if not opened:
            stripped = text.lstrip()
            if not stripped.startswith(self.open):
                return None, text
            body = stripped[len(self.open) :]
        reasoning, found, rest = body.partition(self.close)
        return reasoning.strip(), rest.lstrip() if found else ""

    def stream_split(self, text: str, *, opened: bool) -> tuple[str | None, str]:
        """(reasoning so far, content so far) of an answer still being sampled: what can no
        longer change (a text that may still become a tag is held back)."""
        if not opened:
            stripped = text.lstrip()
            if self.open.startswith(stripped):  # may still become the opening tag
                return None, ""
            if not stripped.startswith(self.open):
                return None, text
            text = stripped[len(self.open) :]
        reasoning, found, rest = text.partition(self.close)
        if found:
            return reasoning.strip(), rest.lstrip()
        held = next(
            (
                n
                for n in range(min(len(self.close) - 1, len(text)), 0, -1)
                if self.close.startswith(text[-n:])
            ),
            0,
        )
        return text[: len(text) - held].strip(), ""

    def opened_by(self, prompt_tail: str) -> bool:
        """Whether a generation prompt ending with ``prompt_tail`` opens a block (the
        answer then starts inside it)."""
        return prompt_tail.rstrip().endswith(self.open)
