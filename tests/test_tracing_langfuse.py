"""Langfuse's real SDK (5.x): a trace per rollout, generations with usage, tool observations,
reward and RULER score as Langfuse scores. Spans land in the SDK's in-memory span exporter;
scores go over HTTP to a loopback stand-in of Langfuse's score API."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tracing_support import children, roots, tool_rollout

import art_core as art
from art_core import tracing
from art_core.rewards import ruler_score_group
from art_core.testing.judge import StandInJudge
from art_core.testing.standins import LangfuseStandIn
from art_core.tracing.langfuse import score_id


async def test_langfuse_gets_a_trace_per_rollout_with_generations_tools_and_scores(
    tiny_model: art.TrainableModel, tmp_path: Path
) -> None:
    memory = InMemorySpanExporter()
    with LangfuseStandIn() as api, StandInJudge() as judge:
        tracing.enable(
            "langfuse",
            langfuse={
                # A fresh key: the SDK keeps one client per public key per process.
                "public_key": f"pk-lf-{uuid.uuid4().hex}",
                "secret_key": "sk-lf-test",
                "base_url": api.url,
                "span_exporter": memory,
            },
        )
        try:
            groups = await art.gather_trajectory_groups(
                [
                    art.TrajectoryGroup(
                        tool_rollout(tiny_model, h, scenario="lf") for h in (0.25, 0.75)
                    )
                ],
                after_each=lambda g: ruler_score_group(
                    g, "judge-1", judge_base_url=judge.base_url, cache_path=tmp_path / "r.sqlite"
                ),
                pbar_desc=None,
            )
            assert tracing.flush(15)
        finally:
            tracing.disable()
        scores = list(api.scores)

    spans = memory.get_finished_spans()
    trajectories = {t.id: t for g in groups for t in g}
    traces = roots(spans)
    assert len(traces) == 2 and len({s.context.trace_id for s in traces}) == 2
    for root in traces:
        trajectory = trajectories[str(root.attributes["art.rollout.id"])]
        assert root.attributes["langfuse.observation.type"] == "agent"
        assert root.attributes["langfuse.trace.name"] == "rollout lf"
        assert json.loads(str(root.attributes["langfuse.trace.metadata.scenario"])) == "lf"
        assert "step:0" in list(root.attributes["langfuse.trace.tags"])
        assert (
            json.loads(str(root.attributes["langfuse.observation.output"]))["reward"]
            == trajectory.reward
        )

        first, tool, second = children(spans, root)
        for generation, call in zip((first, second), trajectory.calls, strict=True):
            assert generation.attributes["langfuse.observation.type"] == "generation"
            assert generation.attributes["langfuse.observation.model.name"] == "tiny"
            usage = json.loads(str(generation.attributes["langfuse.observation.usage_details"]))
            assert usage == {
                "input": len(call.prompt_token_ids),
                "output": len(call.completion_token_ids),
                "total": len(call.prompt_token_ids) + len(call.completion_token_ids),
            }
            assert (
                json.loads(str(generation.attributes["langfuse.observation.input"]))
                == call.messages
            )
        assert tool.attributes["langfuse.observation.type"] == "tool"
        assert json.loads(str(tool.attributes["langfuse.observation.output"])).startswith("12°C")

        trace_id = format(root.context.trace_id, "032x")
        observation_id = format(root.context.span_id, "016x")
        mine = {s["name"]: s for s in scores if s.get("traceId") == trace_id}
        assert set(mine) == {"reward", "ruler_score", "independent_reward"}
        assert mine["reward"]["value"] == pytest.approx(trajectory.reward)
        assert mine["ruler_score"]["value"] == pytest.approx(trajectory.metrics["ruler_score"])
        assert "hint" in mine["ruler_score"]["comment"]
        assert mine["reward"]["id"] == score_id(observation_id, "reward")
        # A rollout that is its own trace is scored at trace level.
        assert "observationId" not in mine["reward"]
    assert sorted(t.reward for t in trajectories.values()) == pytest.approx([0.25, 0.75])
