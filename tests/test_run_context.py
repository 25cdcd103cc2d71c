"""The current rollout: one context variable below ``capture`` and tracing, read by both."""

from __future__ import annotations

import ast
import asyncio
import importlib
from pathlib import Path

import art_core as art
from art_core import run_context
from art_core import tracing as tracing_package


async def test_each_task_sees_its_own_run_and_final_calls_appear_on_exit(
    tiny_model: art.TrainableModel,
) -> None:
    capture_module = importlib.import_module("art_core.capture")  # art_core.capture: the function
    assert art.current_run is capture_module.current_run is run_context.current_run
    assert art.current_run() is None

    async def one(i: int) -> art.Run:
        async with art.capture(tiny_model, metadata={"i": i}) as run:
            assert art.current_run() is run and run.final_calls is None
            await run.openai_client().chat.completions.create(
                model=run.model_name,
                messages=[{"role": "user", "content": f"hi {i}"}],
                max_tokens=2,
            )
            await asyncio.sleep(0)  # the other task runs in between: its run is not ours
            assert art.current_run() is run
        assert art.current_run() is None
        return run

    runs = await asyncio.gather(one(0), one(1))
    for i, run in enumerate(runs):
        final = run.final_calls
        assert final is not None and [c.messages[0]["content"] for c in final] == [f"hi {i}"]
        assert final == run.calls and final is not run.final_calls  # a copy each time


def test_tracing_does_not_import_capture() -> None:
    # tracing reads the current run through run_context; capture imports tracing, not back
    for path in Path(tracing_package.__file__).parent.glob("*.py"):
        imported = {
            node.module
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.ImportFrom) and node.module
        }
        assert "art_core.capture" not in imported, path.name
