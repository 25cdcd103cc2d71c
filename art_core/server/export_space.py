"""The scratch space of exports in flight, bounded in bytes (``ServeSettings.max_export_scratch_bytes``).

An export reserves its estimate (``art_core.export.api.estimate_export_bytes``) before
anything is written; a reservation that would pass the bound is refused (``ExportSpaceFull``:
HTTP 503, with ``Retry-After`` when exports in flight will free space). Once the export is
packed the reservation becomes the tar's exact size, and it is released when the scratch
folder is removed (sent, failed, cut or the client gone).

Example:
    >>> space = ExportSpace(max_bytes=100)
    >>> first = space.reserve(60)
    >>> try:
    ...     space.reserve(60)
    ... except ExportSpaceFull as exc:
    ...     exc.retry_after_s is not None
    True
    >>> first.resize(30); space.in_flight
    30
    >>> first.release(); space.in_flight
    0
"""

from __future__ import annotations

# How long a client refused for want of space is asked to wait: downloads take seconds to
# minutes, and a refusal costs the server a few file stats.
EXPORT_RETRY_AFTER_S = 10


class ExportSpaceFull(RuntimeError):
    """No room for an export's scratch now (HTTP 503): ``retry_after_s`` when exports in
    flight hold the space, None when this export alone is larger than the bound."""

    def __init__(self, message: str, retry_after_s: int | None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Reservation:
    """Bytes one export holds in an ``ExportSpace``, until ``release`` (idempotent)."""

    def __init__(self, space: ExportSpace, nbytes: int) -> None:
        self.space, self.nbytes = space, nbytes
        self.released = False

    def resize(self, nbytes: int) -> None:
        """Count ``nbytes`` instead (the tar's exact size once it is packed)."""
        if not self.released:
            self.space.in_flight += nbytes - self.nbytes
            self.nbytes = nbytes

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.space.in_flight -= self.nbytes


def _mb(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MB"


class ExportSpace:
    """Reservations of scratch bytes, at most ``max_bytes`` in all. Touched only on the
    server's event loop: no lock."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_export_scratch_bytes must be >= 1, got {max_bytes}")
        self.max_bytes = max_bytes
        self.in_flight = 0
        self.refused = 0

    def reserve(self, nbytes: int) -> Reservation:
        """Hold ``nbytes`` for an export, or raise ``ExportSpaceFull``."""
        if self.in_flight + nbytes > self.max_bytes:
            self.refused += 1
            if nbytes > self.max_bytes:
                raise ExportSpaceFull(
                    f"this export needs about {_mb(nbytes)} of scratch space, more than the "
                    f"server allows for exports ({_mb(self.max_bytes)}; art-core serve "
                    "--max-export-scratch-mb)",
                    None,
                )
            raise ExportSpaceFull(
                f"exports in flight hold {_mb(self.in_flight)} of the server's "
                f"{_mb(self.max_bytes)} of export scratch space and this one needs about "
                f"{_mb(nbytes)}; retry after {EXPORT_RETRY_AFTER_S} s",
                EXPORT_RETRY_AFTER_S,
            )
        self.in_flight += nbytes
        return Reservation(self, nbytes)
