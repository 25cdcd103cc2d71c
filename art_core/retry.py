"""``retry``: ART's decorator that retries a rollout (or any function) on chosen exceptions."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

logger = logging.getLogger(__name__)


def retry(
    max_attempts: int = 3,
    delay: float = 0.25,
    backoff_factor: float = 2.0,
    exceptions: tuple[type[BaseException], ...] = (Exception,),
    on_retry: Callable[[BaseException, int], None] | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Retry a sync or async function up to ``max_attempts`` times on ``exceptions``.

    Waits ``delay`` seconds before the second attempt, ``backoff_factor`` times longer before
    each further one (``asyncio.sleep`` for coroutine functions: the event loop keeps
    running). ``on_retry(exc, attempt)`` is called before each retry (default: a warning in
    the log). The last attempt's exception propagates; other exceptions are never retried.

    Example:
        >>> import openai
        >>> @retry(exceptions=(openai.LengthFinishReasonError,))
        ... async def rollout(model, scenario) -> Trajectory: ...
    """
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise ValueError(f"max_attempts must be an int >= 1, got {max_attempts!r}")
    if delay < 0 or backoff_factor < 0:
        raise ValueError("delay and backoff_factor must be >= 0")
    if not isinstance(exceptions, tuple):
        exceptions = (exceptions,)

    def report(func: Callable[..., Any], exc: BaseException, attempt: int) -> None:
        if on_retry is not None:
            on_retry(exc, attempt)
        else:
            logger.warning(
                "retry %d/%d for %s after %s: %s",
                attempt,
                max_attempts,
                getattr(func, "__qualname__", func),
                type(exc).__name__,
                exc,
            )

    def decorator(func: Callable[P, R]) -> Callable[P, R]:
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
                wait = delay
                for attempt in range(1, max_attempts + 1):
                    try:
                        return await func(*args, **kwargs)
                    except exceptions as exc:
                        if attempt == max_attempts:
                            raise
                        report(func, exc, attempt)
                        await asyncio.sleep(wait)
                        wait *= backoff_factor
                raise AssertionError("unreachable")

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(func)
        def sync_wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            wait = delay
            for attempt in range(1, max_attempts + 1):
                try:
                    return func(*args, **kwargs)
                except exceptions as exc:
                    if attempt == max_attempts:
                        raise
                    report(func, exc, attempt)
                    time.sleep(wait)
                    wait *= backoff_factor
            raise AssertionError("unreachable")

        return sync_wrapper

    return decorator
