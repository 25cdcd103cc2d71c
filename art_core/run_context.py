"""The rollout being captured in the current context: one context variable, set by ``capture``.

It lives below ``capture`` and ``tracing`` so that both can read it without importing each
other: ``capture`` sets it for the block it opens, tracing and integrations read it to find
the rollout a call or a tool belongs to. A context variable (not a global): each asyncio task
and each thread started with ``contextvars.copy_context`` sees its own rollout.
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from art_core.capture import Run

_current_run: ContextVar[Run | None] = ContextVar("art_current_run", default=None)


def current_run() -> Run | None:
    """The rollout being captured in this context (task), if any. Integrations use this.

    Example:
        >>> current_run() is None  # outside ``async with art.capture(model)``
        True
    """
    return _current_run.get()


def enter_run(run: Run) -> Token[Run | None]:
    """Make ``run`` the current rollout of this context; give the token to ``exit_run``."""
    return _current_run.set(run)


def exit_run(token: Token[Run | None]) -> None:
    """Restore the rollout that was current before the matching ``enter_run``."""
    _current_run.reset(token)
