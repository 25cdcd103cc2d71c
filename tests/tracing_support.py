"""Helpers shared by the tracing tests: a tool-using rollout, span lookups, a W&B file reader."""

from __future__ import annotations

import json
import socket
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from rollout_checks import WEATHER_TOOL as CITY_TOOL

import art_core as art


def weather(city: str) -> str:
    return f"12°C and clear in {city}"


async def tool_rollout(
    model: art.TrainableModel,
    hint: float,
    *,
    scenario: str = "weather",
    fail: bool = False,
    record_tools: bool = False,
) -> art.Trajectory:
    """Two LLM calls around one forced tool call; the user message carries a RULER score hint
    (the stand-in judge scores a run by its last ``score-hint``)."""
    from art_core import tracing

    async with art.capture(model, metadata={"scenario": scenario}) as run:
        client = run.openai_client()
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": f"What is the weather? score-hint: {hint}"}
        ]
        first = await client.chat.completions.create(
            model=run.model_name,
            messages=messages,  # type: ignore[arg-type]
            tools=[CITY_TOOL],  # type: ignore[list-item]
            # A named tool: exactly one call, grammar-forced, so it always parses.
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            max_tokens=64,
        )
        message = first.choices[0].message
        messages.append(message.model_dump(exclude_none=True, exclude={"token_ids"}))
        for tool_call in message.tool_calls or []:
            started = time.time()
            arguments = json.loads(tool_call.function.arguments)
            result = weather(arguments["city"])
            if record_tools:
                tracing.record_tool_call(
                    tool_call.function.name,
                    arguments,
                    result,
                    start_time=started,
                    end_time=started + 0.25,
                    call_id=tool_call.id,
                    metadata={"server": "weather-mcp"},
                )
            messages.append({"role": "tool", "tool_call_id": tool_call.id, "content": result})
        if fail:
            raise RuntimeError("the agent crashed after its tool call")
        await client.chat.completions.create(
            model=run.model_name,
            messages=messages,  # type: ignore[arg-type]
            tools=[CITY_TOOL],  # type: ignore[list-item]
            max_tokens=4,
        )
    return run.trajectory(reward=0.0, metrics={"turns": 2})


def roots(spans: Sequence[Any]) -> list[Any]:
    """The rollout (invoke_agent) spans of an in-memory export."""
    return [s for s in spans if s.attributes.get("gen_ai.operation.name") == "invoke_agent"]


def children(spans: Sequence[Any], parent: Any) -> list[Any]:
    """The direct children of ``parent``, by start time."""
    span_id = parent.context.span_id
    found = [s for s in spans if s.parent is not None and s.parent.span_id == span_id]
    return sorted(found, key=lambda s: s.start_time)


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wandb_history(folder: Path) -> list[dict[str, str]]:
    """The history rows of every offline W&B run under ``folder`` (from its .wandb files).

    The .wandb file is W&B's record log: a 7-byte header, then LevelDB-log blocks of 32 KiB
    whose chunks (7-byte header: crc32, length, type) carry protobuf ``Record`` s.
    """
    from wandb.proto import wandb_internal_pb2

    rows = []
    for path in sorted(folder.rglob("*.wandb")):
        for raw in _log_records(path.read_bytes()):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(raw)
            if record.WhichOneof("record_type") == "history":
                rows.append(
                    {
                        item.key or "/".join(item.nested_key): item.value_json
                        for item in record.history.item
                    }
                )
    return rows


def wait_for_wandb_history(
    folder: Path, ready: Callable[[list[dict[str, str]]], bool], timeout_s: float = 60.0
) -> list[dict[str, str]]:
    """The offline W&B history under ``folder`` once ``ready(rows)`` holds (W&B's service may
    write the run file a moment after ``run.finish()`` returns), or the last read at timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = wandb_history(folder)
        if ready(rows) or time.monotonic() > deadline:
            return rows
        time.sleep(0.1)


def _log_records(data: bytes, block: int = 32768) -> Iterator[bytes]:
    position, pending = 7, b""
    while position + 7 <= len(data):
        left = block - position % block
        if left < 7:
            position += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if length == 0 and kind == 0:
            position += left
            continue
        chunk = data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            yield pending + chunk
            pending = b""


async def traced_training_run(
    model: art.TrainableModel, judge_base_url: str, cache_path: Path
) -> list[art.TrajectoryGroup]:
    """A short tiny-random training run with tool calls, as a tracing backend should see it:
    two groups of two tool-using rollouts scored by RULER (the stand-in judge at
    ``judge_base_url``), then one train step. Returns the groups (rewards = RULER scores).

    Call with tracing enabled; ``tracing.flush()`` afterwards."""
    from art_core.rewards import ruler_score_group

    async def score(group: art.TrajectoryGroup) -> art.TrajectoryGroup | None:
        return await ruler_score_group(
            group, "judge-1", judge_base_url=judge_base_url, cache_path=cache_path
        )

    hints = [[0.2, 0.9], [0.6, 0.4]]
    groups = await art.gather_trajectory_groups(
        (
            art.TrajectoryGroup(tool_rollout(model, h, scenario=f"s{i}") for h in pair)
            for i, pair in enumerate(hints)
        ),
        after_each=score,
        pbar_desc=None,
    )
    await model.train(groups, config=art.TrainConfig(learning_rate=1e-3))
    return groups
