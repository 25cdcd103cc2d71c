"""Where an engine's decode loop spends its time, part by part (off unless asked for).

``TransformersEngine.step_times`` is None by default; a benchmark sets a ``StepTimes`` to
learn what a decode step costs beside its forward pass (``bash run.sh bench
decode_overhead`` prints it): sampling, logprobs, grammar masks, recording each sampled
token (and the streaming callbacks), rows joining a running batch.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

# The parts, in the order a step runs them.
PARTS = ("forward", "sample", "logprobs", "grammar", "record", "join", "prefill")


@dataclass
class StepTimes:
    """Seconds and counts per part, summed over every step since the last ``clear``.

    Example:
        >>> times = StepTimes()
        >>> times.add("forward", 0.002); times.add("forward", 0.001)
        >>> round(times.seconds["forward"], 3), times.counts["forward"]
        (0.003, 2)
    """

    seconds: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    counts: Counter[str] = field(default_factory=Counter)

    def add(self, part: str, seconds: float) -> None:
        self.seconds[part] += seconds
        self.counts[part] += 1

    def clear(self) -> None:
        self.seconds.clear()
        self.counts.clear()
