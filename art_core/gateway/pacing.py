"""How often a streamed answer writes: each stream at most once an interval, and every
stream of a gateway together at most so many times a second.

Each write of a stream costs the gateway's event loop a syscall and a turn through the
HTTP stack, on the thread that shares the interpreter with the engine's, and costs the
client a parse of one more event: written at every token, 32 streams took a third of the
engine's speed on two cores (``benchmarks/decode_overhead.py``). The tokens sampled between
two writes go in one. A stream's first text is written as soon as it is sampled and its end
as soon as it is recorded; only what comes between is paced.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

# 20 ms is under what a reader of streamed text notices, and still one write per token for
# a model decoding fewer than 50 tokens a second. vLLM and SGLang bound the same thing in
# tokens (``--stream-interval``, default 1 token).
DEFAULT_STREAM_INTERVAL_S = 0.02
# With many streams open, each writes less often so that all together write about this
# often: 500 writes a second cost the loop ~5% of a core here, whatever the number of
# streams (at 32 streams each then writes every 64 ms; at 10 or fewer, every 20 ms).
DEFAULT_MAX_STREAM_WRITES_PER_S = 500.0


class StreamPacing:
    """The interval between two writes of a stream: ``interval_s`` (0: none), lengthened
    while more streams are open than ``max_writes_per_s`` allows at that interval
    (``inf``: no bound). ``open`` counts the streams open (touched on the event loop only).

    Example:
        >>> pacing = StreamPacing(interval_s=0.02, max_writes_per_s=500)
        >>> pacing.interval()
        0.02
        >>> pacing.open = 32; pacing.interval()  # 32 streams share 500 writes a second
        0.064
        >>> StreamPacing(0, math.inf).interval()  # every batch of tokens as it comes
        0.0
    """

    def __init__(
        self,
        interval_s: float = DEFAULT_STREAM_INTERVAL_S,
        max_writes_per_s: float = DEFAULT_MAX_STREAM_WRITES_PER_S,
    ) -> None:
        if not 0 <= interval_s < math.inf:
            raise ValueError(f"interval_s must be a number of seconds >= 0, got {interval_s}")
        if not max_writes_per_s > 0:  # inf allowed (no bound); NaN refused
            raise ValueError(f"max_writes_per_s must be > 0, got {max_writes_per_s}")
        self.interval_s = float(interval_s)
        self.max_writes_per_s = float(max_writes_per_s)
        self.open = 0

    def interval(self) -> float:
        """Seconds a stream waits after a write before the next, with ``open`` streams."""
        return max(self.interval_s, self.open / self.max_writes_per_s)

    @contextlib.contextmanager
    def stream(self) -> Iterator[None]:
        """One stream counted in ``open`` for the span of the ``with`` block.

        Example:
            >>> pacing = StreamPacing()
            >>> with pacing.stream():
            ...     pacing.open
            1
            >>> pacing.open
            0
        """
        self.open += 1
        try:
            yield
        finally:
            self.open -= 1
