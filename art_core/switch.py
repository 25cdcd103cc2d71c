"""``ProcessSwitch``: one process-wide optional service, set under a lock, read from the
environment once, closed at exit. Tracing's pipeline and metrics' W&B logger are each one
(so it lives below both ``tracing/`` and ``metrics/``), and ``env_flag`` reads their switches.

Process-wide on purpose, like ``logging`` or OpenTelemetry's own provider: rollouts and train
steps run in many tasks and threads (the gateway has its own loop) and must all see one switch.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

logger = logging.getLogger("art_core.tracing")

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_flag(environ: Mapping[str, str], name: str, default: bool) -> bool:
    """A boolean environment variable: 1/true/yes/on or 0/false/no/off (case-insensitive).

    Example:
        >>> env_flag({"X": "on"}, "X", False), env_flag({}, "X", True)
        (True, True)
    """
    raw = environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{name}={raw!r}: expected one of 1/true/yes/on or 0/false/no/off")


class ProcessSwitch(Generic[T]):
    """The service in use (or None), changed only through ``swap``.

    ``from_env`` runs on the first ``get`` (it may call ``swap``); if it raises, the error is
    logged with ``env_error`` and the service stays off: a bad variable must never break a
    rollout. ``at_exit`` runs at interpreter exit once a service has been installed.

    Example:
        >>> switch: ProcessSwitch[str] = ProcessSwitch(lambda: None, lambda: None, "off")
        >>> switch.get() is None, switch.swap("on"), switch.get()
        (True, None, 'on')
    """

    def __init__(
        self, from_env: Callable[[], None], at_exit: Callable[[], None], env_error: str
    ) -> None:
        self.lock = threading.Lock()
        self.value: T | None = None
        self.env_checked = False
        self._from_env = from_env
        self._at_exit = at_exit
        self._env_error = env_error
        self._exit_hook = False

    def get(self) -> T | None:
        """The service in use; the first call applies the environment."""
        if not self.env_checked:
            with self.lock:
                first, self.env_checked = not self.env_checked, True
            if first:
                try:
                    self._from_env()
                except Exception:
                    logger.exception(self._env_error)
        return self.value

    def swap(self, new: T | None) -> T | None:
        """Put ``new`` in use (None: off) and return the one it replaces, for the caller to
        close outside the lock. The environment is not applied after an explicit swap."""
        with self.lock:
            previous, self.value = self.value, new
            self.env_checked = True
            if new is not None and not self._exit_hook:
                atexit.register(self._at_exit)
                self._exit_hook = True
        return previous
