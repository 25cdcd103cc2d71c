"""Cancelling a training step that is running.

A step is cancelled through a ``threading.Event`` its caller holds (the trainer runs in a
worker thread, the caller on an event loop or in another thread). The trainer looks at it
before every forward pass, so a step stops within one micro-batch; it then raises
``TrainingCancelled`` before its checkpoint is written, and the weights it half-updated in
memory are dropped (the next step reloads the latest checkpoint). The previous checkpoint
stays in force and the engine goes on serving it.
"""

from __future__ import annotations

import threading


class TrainingCancelled(Exception):
    """The step was cancelled before it wrote its checkpoint: the model is still at the
    previous step.

    Example:
        >>> raise TrainingCancelled("cancelled at micro-batch 3; still at step 2")
        Traceback (most recent call last):
        art_core.training.cancel.TrainingCancelled: cancelled at micro-batch 3; still at step 2
    """


def raise_if_cancelled(cancel: threading.Event | None, step: int) -> None:
    """``TrainingCancelled`` when ``cancel`` is set (step ``step`` is the one in force).

    Example:
        >>> raise_if_cancelled(threading.Event(), 2)  # not set: nothing happens
    """
    if cancel is not None and cancel.is_set():
        raise TrainingCancelled(
            f"the training step was cancelled before its checkpoint was written; the model "
            f"is still at step {step}"
        )
