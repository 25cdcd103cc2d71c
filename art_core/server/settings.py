"""``ServeSettings``: how ``art-core serve`` listens and what it accepts.

Kept separate from the app so the CLI, tests and embedders build the same service.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from art_core.access import LOOPBACK_NAMES, is_loopback, new_token
from art_core.gateway.connections import ConnectionLimits
from art_core.gateway.pacing import DEFAULT_MAX_STREAM_WRITES_PER_S, DEFAULT_STREAM_INTERVAL_S
from art_core.server.train_limits import TrainLimits

__all__ = ["LOOPBACK_NAMES", "ServeSettings", "is_loopback", "new_token"]


@dataclass
class ServeSettings:
    """Everything ``art-core serve`` is configured with.

    ``token`` None on a loopback host means no authentication; on any other host a token is
    required and ``resolved_token`` generates one (``token_generated`` tells the CLI to print it).

    Example:
        >>> settings = ServeSettings(host="0.0.0.0", port=7999)
        >>> token = settings.resolved_token()
        >>> settings.token_generated and settings.token == token
        True
    """

    host: str = "127.0.0.1"
    port: int = 7999
    path: Path = Path(".art")
    token: str | None = None
    # Request bodies above this get 413 (a training request carries its trajectories).
    max_body_bytes: int = 64 * 1024 * 1024
    # Chat completions in flight (queued or running) before new ones get 429 + Retry-After.
    max_pending: int = 512
    retry_after_s: int = 1
    # Origins allowed by CORS; empty = CORS off (no Access-Control headers at all).
    cors_origins: list[str] = field(default_factory=list)
    # Local model folders clients may name as base_model, besides the embedded models.
    allowed_base_models: list[str] = field(default_factory=list)
    device: str | None = None
    dtype: str | None = None
    max_batch_size: int = 32
    # The engine's prefix cache bound in bytes (None: from free memory; 0: off).
    prefix_cache_bytes: int | None = None
    # The transformers engine's decode steps compiled (``TransformersEngine.compile_decode``).
    compile_decode: bool = False
    # Engine replicas per model (engine workers behind the gateway's router; 1: in-process),
    # their CPU threads each, their devices, and a Ray cluster to place them on.
    replicas: int = 1
    threads_per_replica: int | None = None
    replica_devices: list[str] | None = None
    ray_address: str | None = None
    default_max_tokens: int = 1024
    # How often streamed answers write: each at most once this interval, all together about
    # this many times a second at most (gateway/pacing.py says why).
    stream_interval_s: float = DEFAULT_STREAM_INTERVAL_S
    max_stream_writes_per_s: float = DEFAULT_MAX_STREAM_WRITES_PER_S
    # Models loaded at once (each holds an engine: weights, threads, a call record).
    max_models: int = 16
    # Per model: memory the calls of unreleased rollouts may hold (see CallStore).
    max_rollout_memory_mb: float = 256.0
    # A graceful stop lets training steps in progress finish this long, then cancels them.
    drain_timeout_s: float = 120.0
    # An export download whose next piece (1 MiB) the client has not taken within this many
    # seconds is cut and its scratch copy removed at once. A per-piece deadline, not a bound
    # on the whole download: exports range from megabytes to tens of gigabytes, so a total
    # bound would either cut big downloads on a good link or let a stalled one hold its
    # copy for hours; per piece, a stalled (or trickling) reader is cut within this time
    # whatever the size. 60 s tolerates a client down to ~17 KB/s.
    export_send_timeout_s: float = 60.0
    # Bytes of scratch space (the art folder's .exports/) that exports in flight (queued,
    # building or downloading) may hold together; an export that would pass it gets 503 +
    # Retry-After and writes nothing. Each is counted at its estimate while it is built
    # (``estimate_export_bytes``: twice the base's and adapter's files, the export and its
    # tar together), then at its tar's exact size while it is sent. 64 GiB: a merged 8B
    # model in bf16 (~16 GB, ~32 GB while packed) plus a few adapter downloads.
    max_export_scratch_bytes: int = 64 * 1024**3
    # Bounds on what one training request may ask (epochs, optimizer steps, LoRA rank).
    train_limits: TrainLimits = field(default_factory=TrainLimits)
    # Open connections, idle ones before a first request, header and body read timeouts.
    connection_limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    token_generated: bool = False

    def resolved_token(self) -> str | None:
        """The token to enforce: the given one, a generated one off loopback, or None."""
        if self.token is not None and not self.token.strip():
            raise ValueError("the token must not be empty")
        if self.token is None and not is_loopback(self.host):
            self.token = new_token()
            self.token_generated = True
        return self.token
