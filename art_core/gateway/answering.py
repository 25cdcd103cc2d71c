"""Sampling a request's calls safely and answering them, once for every wire API.

Not streamed: ``sample_shielded`` samples and records every call; a client that hangs up
does not cancel the sampling or the recording, and an engine's refusal becomes its
``APIError``. Streamed: ``stream_answer`` runs one loop for every API (``deltas``) and
hands what happens to the API's ``StreamEncoder``, which writes the API's own events: its
opening events, each text delta as sampled, and the end (the recorded calls) or a failure
(as an ``APIError``, in the API's error event).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable
from typing import Protocol

from art_core.engines.base import EngineError
from art_core.gateway.deltas import Recorded, StreamedText, TextDelta, sampled_deltas
from art_core.gateway.errors import APIError, engine_error, internal_error
from art_core.gateway.pacing import StreamPacing
from art_core.gateway.recording import Sampled, sample_and_record
from art_core.gateway.requests import PreparedCall
from art_core.gateway.wire import LastEvents
from art_core.trajectories import LLMCall

logger = logging.getLogger(__name__)


class StreamEncoder(Protocol):
    """One API's events for a streamed answer (each method returns the events to send)."""

    def opening(self) -> Iterable[str]:
        """Before anything is sampled."""
        ...

    def delta(self, delta: TextDelta) -> Iterable[str]:
        """New text of one choice."""
        ...

    def finished(self, recorded: list[list[LLMCall]], texts: list[StreamedText]) -> Iterable[str]:
        """Every call recorded (``texts``: what was sent of each call's choices)."""
        ...

    def failed(
        self, error: APIError, recorded: list[list[LLMCall]], texts: list[StreamedText]
    ) -> Iterable[str]:
        """A call failed (``recorded``: the calls that did record, empty lists for the
        others)."""
        ...


async def sample_shielded(calls: list[PreparedCall]) -> list[Sampled]:
    """Every call sampled and recorded, side by side; not cancelled by a client that hangs
    up. An engine's refusal is its ``APIError`` (400 for values it cannot serve, 503 when
    the engine stopped answering).

    Example:
        >>> (sampled,) = await sample_shielded([prepared])  # fragment: a `prepared` call inside the gateway  # doctest: +SKIP
    """
    tasks = [asyncio.ensure_future(sample_and_record(call)) for call in calls]
    try:
        return list(await asyncio.shield(asyncio.gather(*tasks)))
    except EngineError as exc:
        raise engine_error(exc) from None


def refusal(exc: BaseException) -> APIError:
    """What a failure while streaming answers: an engine's refusal as itself, anything else
    as a 500 (logged, without paths).

    Example:
        >>> refusal(EngineError("overloaded")).status
        400
    """
    if isinstance(exc, EngineError):
        return engine_error(exc)
    logger.error("a streamed answer failed", exc_info=exc)
    return internal_error(exc)


async def stream_answer(
    calls: list[PreparedCall],
    encoder: StreamEncoder,
    pacing: StreamPacing | None = None,
) -> AsyncIterator[str]:
    """The events of a streamed request: ``encoder``'s opening, its delta events as the
    text is sampled (paced by ``pacing``: ``deltas.sampled_deltas``), then its end, or its
    failure when a call failed (the calls that did not fail are still recorded and handed
    to it). Each item is one write: the opening goes with the first text, and the end,
    the last item, is a ``LastEvents`` (written with the end of the body).

    Example:
        >>> event_stream(stream_answer([prepared], ChatEncoder(prepared)))  # fragment: a `prepared` call inside the gateway  # doctest: +SKIP
    """
    # Written with the first text: each write costs a syscall and turns of the loop, and
    # the response's headers already tell the client that the answer has started.
    opening = "".join(encoder.opening())
    texts = [StreamedText(call.params.n, i) for i, call in enumerate(calls)]
    recorded = Recorded([[] for _ in calls])
    failure: BaseException | None = None
    try:
        async for item in sampled_deltas(calls, texts, pacing):
            if isinstance(item, Recorded):
                recorded = item
                continue
            # One write for the batch's events.
            events = "".join(event for delta in item for event in encoder.delta(delta))
            if events:
                yield opening + events
                opening = ""
    except Exception as exc:  # not the sampling's (it goes on and records)
        failure = exc
    failure = failure or recorded.failure
    ending = (
        encoder.failed(refusal(failure), recorded.calls, texts)
        if failure is not None
        else encoder.finished(recorded.calls, texts)
    )
    yield LastEvents(opening + "".join(ending))
