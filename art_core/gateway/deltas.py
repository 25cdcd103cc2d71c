"""A call's text as it is sampled: what every streaming wire API sends, in one place.

Each streamed API (chat completions, Responses, Anthropic Messages, completions) shapes the
same two things into its own events: the new text of each choice as it is sampled, and,
once every choice is recorded, the recorded calls. Text is yielded as reasoning and content
deltas, holding back only what could still turn into a stop string (which is cut from the
answer), a reasoning tag, or tool-call markup of the model's format (which never reaches
the content). The deltas of a choice are always a prefix of the recorded answer's
reasoning and content; ``rest`` gives what the recorded answer adds to them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from art_core.chat_formats.format import safe_before
from art_core.gateway.recording import sample_and_record
from art_core.gateway.requests import PreparedCall
from art_core.trajectories import LLMCall

# The text fields an answer streams, in the order a model writes them.
FIELDS = ("reasoning_content", "content")


@dataclass(frozen=True)
class TextDelta:
    """New text of one choice: ``field`` is ``"reasoning_content"`` or ``"content"``."""

    choice: int
    field: str
    text: str


@dataclass(frozen=True)
class Recorded:
    """Every choice sampled and recorded (the last item of ``sampled_deltas``)."""

    calls: list[LLMCall]


class StreamedText:
    """What was sent of each choice's fields, to compute deltas and the final rest."""

    def __init__(self, n: int) -> None:
        self.sent: dict[int, dict[str, str]] = {i: dict.fromkeys(FIELDS, "") for i in range(n)}

    def advance(self, choice: int, now: dict[str, str | None]) -> list[TextDelta]:
        """The new text of each field since last time; a field whose text no longer extends
        what was sent waits for the end (``rest`` settles it)."""
        deltas = []
        sent = self.sent[choice]
        for field in FIELDS:
            text = now.get(field)
            if text and len(text) > len(sent[field]) and text.startswith(sent[field]):
                deltas.append(TextDelta(choice, field, text[len(sent[field]) :]))
                sent[field] = text
        return deltas

    def rest(self, call: LLMCall) -> dict[str, str]:
        """What the recorded answer of ``call`` adds to the text sent of its choice."""
        out = {}
        for field, already in self.sent[call.choice_index].items():
            whole = call.response_message.get(field) or ""
            rest = whole[len(already) :] if whole.startswith(already) else ""
            if rest:
                out[field] = rest
        return out


async def sampled_deltas(
    call: PreparedCall, text: StreamedText | None = None
) -> AsyncIterator[TextDelta | Recorded]:
    """Sample and record ``call``, yielding each choice's text deltas as they come and then
    ``Recorded``. The sampling and recording are not cancelled by a consumer that stops
    early (a client that hangs up): they go on and the calls are recorded. An engine error
    is raised once the deltas sent before it are out.

    Example:
        >>> async for item in sampled_deltas(prepared):  # doctest: +SKIP
        ...     print(item)
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[int, list[int]]] = asyncio.Queue()

    def on_tokens(choice: int, ids: list[int]) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, (choice, ids))

    task = asyncio.ensure_future(sample_and_record(call, on_tokens=on_tokens))
    text = text or StreamedText(call.params.n)
    chat_format = call.served.chat.format
    stops = [s for s in call.params.stop if s]
    sampled: dict[int, list[int]] = {i: [] for i in range(call.params.n)}
    while not task.done() or not queue.empty():
        getter = asyncio.ensure_future(queue.get())
        done, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
        if getter not in done:
            getter.cancel()
            continue
        choice, ids = getter.result()
        sampled[choice].extend(ids)
        decoded = chat_format.decode(sampled[choice], parses_tools=call.parses_tools)
        if decoded.endswith("\ufffd"):
            continue  # an incomplete UTF-8 sequence: wait for the next token
        reasoning, content = chat_format.stream_split(
            safe_before(decoded, stops),
            parses_tools=call.parses_tools,
            opened_reasoning=call.opened_reasoning,
        )
        for delta in text.advance(choice, {"reasoning_content": reasoning, "content": content}):
            yield delta
    yield Recorded(task.result())
