"""What tracing records and how hard it may push: ``TracingSettings`` and its environment form.

Standard library only: the core imports this module on every ``import art_core``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields

from art_core.switch import env_flag

EXPORTER_NAMES = ("otlp", "langfuse", "weave", "mlflow", "phoenix", "console")
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True)
class TracingSettings:
    """Options shared by every exporter.

    ``capture_content``: export messages, tool arguments/results, logs and judge explanations
    (off: only names, ids, timings, usage, rewards and scores). ``include_token_ids`` /
    ``include_logprobs``: add the recorded token ids / sampler logprobs to LLM spans (big; off
    by default). ``max_queue_size``: rollouts (and train steps) waiting for export; beyond it
    new ones are dropped and counted, never waited for. ``export_timeout_s``: the most one
    export request may take (it runs in a background thread). ``max_content_chars``: cut each
    exported text (message content, tool result) to this many characters (None: no cut).

    Example:
        >>> TracingSettings.from_env({"ART_TRACING_CAPTURE_CONTENT": "0"}).capture_content
        False
    """

    capture_content: bool = True
    include_token_ids: bool = False
    include_logprobs: bool = False
    max_queue_size: int = 4096
    export_timeout_s: float = 5.0
    max_content_chars: int | None = None
    service_name: str = "art-core"

    def __post_init__(self) -> None:
        if self.max_queue_size < 1:
            raise ValueError(f"max_queue_size must be >= 1, got {self.max_queue_size}")
        if not self.export_timeout_s > 0:
            raise ValueError(f"export_timeout_s must be > 0, got {self.export_timeout_s}")
        if self.max_content_chars is not None and self.max_content_chars < 0:
            raise ValueError(f"max_content_chars must be >= 0, got {self.max_content_chars}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TracingSettings:
        """Settings from ``ART_TRACING_*`` variables (defaults for the ones not set)."""
        env = os.environ if environ is None else environ
        chars = env.get("ART_TRACING_MAX_CONTENT_CHARS")
        return cls(
            capture_content=env_flag(env, "ART_TRACING_CAPTURE_CONTENT", True),
            include_token_ids=env_flag(env, "ART_TRACING_TOKEN_IDS", False),
            include_logprobs=env_flag(env, "ART_TRACING_LOGPROBS", False),
            max_queue_size=int(env.get("ART_TRACING_MAX_QUEUE", "4096")),
            export_timeout_s=float(env.get("ART_TRACING_EXPORT_TIMEOUT", "5")),
            max_content_chars=int(chars) if chars else None,
            service_name=env.get("OTEL_SERVICE_NAME", "art-core"),
        )

    def replace(self, **changes: object) -> TracingSettings:
        """A copy with some fields changed (unknown names are an error)."""
        known = {f.name for f in fields(self)}
        unknown = set(changes) - known
        if unknown:
            raise TypeError(f"unknown tracing settings: {sorted(unknown)}")
        values = {name: getattr(self, name) for name in known}
        values.update(changes)
        return TracingSettings(**values)


def exporters_from_env(environ: Mapping[str, str] | None = None) -> list[str]:
    """The exporter names listed in ``ART_TRACING`` (comma-separated; empty/0/off: none).

    Example:
        >>> exporters_from_env({"ART_TRACING": "otlp, langfuse"})
        ['otlp', 'langfuse']
    """
    env = os.environ if environ is None else environ
    raw = env.get("ART_TRACING", "").strip().lower()
    if raw in _FALSE:
        return []
    names = [part.strip() for part in raw.split(",") if part.strip()]
    if names == ["1"] or names == ["true"] or names == ["on"]:
        return ["otlp"]
    unknown = [name for name in names if name not in EXPORTER_NAMES]
    if unknown:
        raise ValueError(f"ART_TRACING names unknown exporters {unknown}; known: {EXPORTER_NAMES}")
    return names
