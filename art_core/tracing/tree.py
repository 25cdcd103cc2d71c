"""The exporter-neutral span tree: what happened in a rollout or a train step, with timings.

``art_core.tracing.build`` turns a trajectory into a ``SpanNode`` tree once; each exporter
renders that tree its own way (OpenTelemetry spans, Langfuse observations, Weave calls).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

SpanKind = Literal["rollout", "llm", "tool", "train", "score"]
# Values an OpenTelemetry attribute may hold (homogeneous sequences only).
AttributeValue = str | bool | int | float | list[str] | list[int] | list[float] | list[bool]


@dataclass(frozen=True)
class Score:
    """A number attached to a rollout: its reward, its RULER score, ...

    Example:
        >>> Score("reward", 1.0).value
        1.0
    """

    name: str
    value: float
    comment: str | None = None


@dataclass
class SpanNode:
    """One operation with explicit start/end times (seconds since the epoch).

    ``attributes`` follow the OpenTelemetry GenAI semantic conventions plus ``art.*`` keys;
    ``input`` / ``output`` are the same content as plain JSON-able values, for exporters that
    show structured data (Weave, Langfuse). ``key`` identifies the thing traced (a rollout id)
    so later updates (scores) and links (train steps) can find the exported span.

    Example:
        >>> node = SpanNode("chat tiny", "llm", 0.0, 1.5)
        >>> node.duration_s
        1.5
    """

    name: str
    kind: SpanKind
    start_time: float
    end_time: float
    attributes: dict[str, AttributeValue] = field(default_factory=dict)
    input: Any = None
    output: Any = None
    scores: list[Score] = field(default_factory=list)
    error: str | None = None
    children: list[SpanNode] = field(default_factory=list)
    key: str | None = None
    links: list[str] = field(default_factory=list)  # keys of other traced things
    display_name: str | None = None

    @property
    def duration_s(self) -> float:
        return max(0.0, self.end_time - self.start_time)

    def walk(self) -> list[SpanNode]:
        """This node and all its descendants, depth first, parents before children."""
        nodes = [self]
        for child in self.children:
            nodes.extend(child.walk())
        return nodes


@dataclass(frozen=True)
class ScoreUpdate:
    """Scores that changed after a rollout was exported (e.g. RULER run outside ``gather``)."""

    key: str
    scores: list[Score]
    time: float
