"""Cancelling a training step in process (``LocalBackend``): the step stops within a
micro-batch, writes no checkpoint, and the model serves and trains from the previous one.
(Over HTTP: ``test_remote_faults``.)"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from remote_support import groups_of

import art_core as art
from art_core.training import TrainConfig

LONG_STEP = TrainConfig(learning_rate=1e-3, max_tokens_per_batch=16, num_epochs=600)


async def test_cancel_training_restores_the_previous_checkpoint(tmp_path: Path) -> None:
    async with art.LocalBackend(path=tmp_path) as backend:
        model = art.TrainableModel(name="m", project="cancel", base_model="tiny-random")
        await model.register(backend)
        folder = backend.model_folder(model)
        first = await model.train(await groups_of(model, size=4), TrainConfig(learning_rate=1e-3))
        assert first.step == 1
        groups = await groups_of(model, size=4)

        loop = asyncio.get_running_loop()
        started = asyncio.Event()

        def on_progress(record: dict[str, Any]) -> None:  # the trainer's thread
            if record["event"] == "micro_batch":
                loop.call_soon_threadsafe(started.set)

        # 1. cancel_training(model), from the event loop.
        assert backend.cancel_training(model) is False  # nothing runs yet
        training = asyncio.create_task(
            backend.train(model, groups, LONG_STEP, on_progress=on_progress)
        )
        await asyncio.wait_for(started.wait(), 60)
        assert backend.cancel_training(model) is True
        with pytest.raises(art.TrainingCancelled, match="still at step 1"):
            await asyncio.wait_for(training, 60)
        assert folder.checkpoint_steps() == [1] and await model.get_step() == 1
        [[served]] = [g.trajectories for g in await groups_of(model, size=1)]
        assert served.calls[0].adapter_step == 1

        # 2. An event the caller holds, set from another thread.
        cancel, started = threading.Event(), asyncio.Event()
        training = asyncio.create_task(
            backend.train(model, groups, LONG_STEP, on_progress=on_progress, cancel=cancel)
        )
        await asyncio.wait_for(started.wait(), 60)
        threading.Timer(0.1, cancel.set).start()
        with pytest.raises(art.TrainingCancelled):
            await asyncio.wait_for(training, 60)

        # 3. Cancelling the task awaiting train stops the step too.
        started = asyncio.Event()
        training = asyncio.create_task(
            backend.train(model, groups, LONG_STEP, on_progress=on_progress)
        )
        await asyncio.wait_for(started.wait(), 60)
        training.cancel()
        with pytest.raises(asyncio.CancelledError):
            await training
        assert backend.cancel_training(model) is False  # nothing left running

        # The next step trains from checkpoint 1, not from the half-updated weights.
        second = await model.train(groups, TrainConfig(learning_rate=1e-3))
        assert second.step == 2 and folder.checkpoint_steps() == [1, 2]
