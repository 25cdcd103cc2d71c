"""A request's text as it is sampled: what every streaming wire API sends, in one place.

Each streamed API (chat completions, Responses, Anthropic Messages, completions) shapes the
same two things into its own events: the new text of each choice as it is sampled, and,
once every call is recorded, the recorded calls. Text is yielded as reasoning and content
deltas (as each call's reader makes them, ``answers``), holding back only what could still
turn into a stop string (which is cut from the answer), a reasoning tag, or tool-call
markup of the model's format (which never reaches the content). The deltas of a choice are
always a prefix of the recorded answer's reasoning and content; ``rest`` gives what the
recorded answer adds to them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from art_core.chat_formats.decoding import TextStream
from art_core.gateway.pacing import StreamPacing
from art_core.gateway.recording import sample_and_record
from art_core.gateway.relay import TokenInbox
from art_core.gateway.requests import PreparedCall
from art_core.trajectories import LLMCall

# The text fields an answer streams, in the order a model writes them.
FIELDS = ("reasoning_content", "content")


@dataclass(frozen=True)
class TextDelta:
    """New text of one choice: ``field`` is ``"reasoning_content"`` or ``"content"``;
    ``call`` is the request's call it belongs to (Completions: one per prompt)."""

    choice: int
    field: str
    text: str
    call: int = 0


@dataclass(frozen=True)
class Recorded:
    """Every call sampled and recorded (the last item of ``sampled_deltas``): each call's
    choices in order (empty for a call whose sampling failed) and the first failure."""

    calls: list[list[LLMCall]]
    failure: BaseException | None = None


class StreamedText:
    """What was sent of each choice's fields (of call ``call``), to compute deltas and the
    final rest.

    Example:
        >>> text = StreamedText(1)
        >>> text.advance(0, {"content": "Hel"}), text.advance(0, {"content": "Hello"})[0].text
        ([TextDelta(choice=0, field='content', text='Hel', call=0)], 'lo')
    """

    def __init__(self, n: int, call: int = 0) -> None:
        self.call = call
        self.sent: dict[int, dict[str, str]] = {i: dict.fromkeys(FIELDS, "") for i in range(n)}

    def advance(self, choice: int, now: dict[str, str | None]) -> list[TextDelta]:
        """The new text of each field since last time; a field whose text no longer extends
        what was sent waits for the end (``rest`` settles it)."""
        deltas = []
        sent = self.sent[choice]
        for field in FIELDS:
            text = now.get(field)
            if text and len(text) > len(sent[field]) and text.startswith(sent[field]):
                deltas.append(TextDelta(choice, field, text[len(sent[field]) :], self.call))
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
    calls: list[PreparedCall],
    texts: list[StreamedText],
    pacing: StreamPacing | None = None,
) -> AsyncIterator[list[TextDelta] | Recorded]:
    """Sample and record ``calls`` side by side, yielding the text deltas of the tokens
    sampled since last time, as they come (``texts[i]`` keeps what was sent of call ``i``),
    and then ``Recorded``. The sampling and recording are not cancelled by a consumer that
    stops early (a client that hangs up): they go on and the calls are recorded. A call
    that fails is in ``Recorded.failure``.

    The first deltas come as soon as they are sampled; after each batch it yields, it waits
    ``pacing``'s interval (None: no wait) and then takes every token sampled meanwhile
    together: each new id is decoded once (``TextStream``), and the batch's deltas come as
    one list (one write to the client). ``Recorded`` comes as soon as every call is
    recorded.

    Example:
        >>> async for item in sampled_deltas([prepared], [StreamedText(1)]):  # fragment: a `prepared` call inside the gateway  # doctest: +SKIP
        ...     print(item)
    """
    inbox = TokenInbox()
    loop = asyncio.get_running_loop()
    # One relay carries the ids of all the request's calls (any relay to this loop would).
    relay = calls[0].served.token_relay(loop)
    tasks = [
        call.served.start_sampling(sample_and_record(call, on_tokens=relay.listener(inbox, i)))
        for i, call in enumerate(calls)
    ]
    unfinished = len(tasks)

    def finished(_: object) -> None:
        nonlocal unfinished
        unfinished -= 1
        if not unfinished:
            inbox.finish()

    for task in tasks:
        task.add_done_callback(finished)
    with pacing.stream() if pacing is not None else contextlib.nullcontext():
        # Each choice's text, its ids decoded once each as they come (not the whole again
        # at every write: a long stream would cost its length squared).
        sampled: dict[tuple[int, int], TextStream] = {}
        while True:
            relay.collect()
            items = inbox.take()
            if not items:
                # A call's tokens are all put before it finishes: nothing more will come.
                if inbox.finished:
                    break
                await relay.wait(inbox)
                continue
            touched: dict[tuple[int, int], None] = {}  # in arrival order
            for i, choice, ids in items:
                if (i, choice) not in sampled:
                    sampled[(i, choice)] = calls[i].reader.text_stream(calls[i])
                sampled[(i, choice)].extend(ids)
                touched[(i, choice)] = None
            deltas = []
            for i, choice in touched:
                now = calls[i].reader.streamed(calls[i], sampled[(i, choice)].text)
                if now is not None:
                    deltas += texts[i].advance(choice, now)
            if deltas:
                written = loop.time()
                yield deltas
                if pacing is not None:
                    await inbox.pause(written + pacing.interval())
    failures = [task.exception() for task in tasks]
    yield Recorded(
        [
            [] if failed else task.result().calls
            for task, failed in zip(tasks, failures, strict=True)
        ],
        next((failed for failed in failures if failed is not None), None),
    )
