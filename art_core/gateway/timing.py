"""Where a chat request's time goes inside the gateway, stage by stage (off by default).

``Gateway.stage_log = StageLog()`` turns it on: each request then leaves one record of how
long each stage took, from the handler's start to the answer built (HTTP parsing before the
handler and sending after it are the rest of a client's round trip). The serving benchmark
prints the medians, so a reader sees why the overhead is what it is on their machine.
"""

from __future__ import annotations

import statistics
import time
from collections import deque

# The stages, in order: each ends at the mark of its name.
STAGES = ("parse", "prepare", "queue+engine", "record", "respond")


class StageClock:
    """The marks of one request: ``mark(stage)`` at the end of each stage.

    Example:
        >>> clock = StageClock()
        >>> clock.mark("parse")
        >>> list(clock.durations())
        ['parse']
    """

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.marks: list[tuple[str, float]] = []

    def mark(self, stage: str) -> None:
        self.marks.append((stage, time.perf_counter()))

    def durations(self) -> dict[str, float]:
        """Seconds per stage, in the order marked."""
        out: dict[str, float] = {}
        previous = self.start
        for stage, at in self.marks:
            out[stage] = out.get(stage, 0.0) + at - previous
            previous = at
        return out


class StageLog:
    """The stage durations of the last ``capacity`` requests.

    Example:
        >>> log = StageLog()
        >>> clock = StageClock(); clock.mark("parse"); log.add(clock)
        >>> list(log.medians_ms())
        ['parse']
    """

    def __init__(self, capacity: int = 10_000) -> None:
        self.records: deque[dict[str, float]] = deque(maxlen=capacity)

    def add(self, clock: StageClock) -> None:
        self.records.append(clock.durations())

    def clear(self) -> None:
        self.records.clear()

    def medians_ms(self) -> dict[str, float]:
        """Median milliseconds per stage over the records, in ``STAGES`` order."""
        names = [s for s in STAGES if any(s in r for r in self.records)]
        names += sorted({s for r in self.records for s in r} - set(names))
        return {
            name: statistics.median(r.get(name, 0.0) for r in self.records) * 1000 for name in names
        }
