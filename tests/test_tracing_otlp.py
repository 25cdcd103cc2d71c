"""Rollouts as OpenTelemetry spans: the tree, GenAI attributes, rewards and RULER scores, when
they are exported, and the OTLP wire format. Real gateway (tiny-random), real openai client,
the OpenTelemetry SDK's in-memory exporter and a loopback OTLP/HTTP collector."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from tracing_support import children, roots, tool_rollout, weather

import art_core as art
from art_core import tracing
from art_core.rewards import ruler_score_group
from art_core.testing.judge import StandInJudge
from art_core.testing.standins import OtlpCollector


@pytest.fixture
def memory() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.enable(exporter)
    yield exporter
    tracing.disable()


@pytest.fixture(scope="module")
def judge() -> Iterator[StandInJudge]:
    with StandInJudge() as server:
        yield server


def ruler(judge: StandInJudge, tmp_path: Path):  # type: ignore[no-untyped-def]
    async def score(group: art.TrajectoryGroup) -> art.TrajectoryGroup | None:
        return await ruler_score_group(
            group, "judge-1", judge_base_url=judge.base_url, cache_path=tmp_path / "ruler.sqlite"
        )

    return score


async def test_each_rollout_is_one_span_tree_with_its_ruler_score(
    tiny_model: art.TrainableModel,
    memory: InMemorySpanExporter,
    judge: StandInJudge,
    tmp_path: Path,
) -> None:
    hints = [[0.2, 0.9], [0.6, 0.4]]
    # The session's model: another module on this worker may have trained it already.
    step = await tiny_model.get_step()
    groups = await art.gather_trajectory_groups(
        (
            art.TrajectoryGroup(tool_rollout(tiny_model, h, scenario=f"s{i}") for h in pair)
            for i, pair in enumerate(hints)
        ),
        after_each=ruler(judge, tmp_path),
        pbar_desc=None,
    )
    assert tracing.flush(10)
    spans = memory.get_finished_spans()
    trajectories = {t.id: t for g in groups for t in g}
    rollouts = roots(spans)
    # Exported once each, after RULER: the span carries the judge's score as the reward.
    assert sorted(s.attributes["art.rollout.id"] for s in rollouts) == sorted(trajectories)
    assert len({s.context.trace_id for s in rollouts}) == 4
    for root in rollouts:
        trajectory = trajectories[str(root.attributes["art.rollout.id"])]
        hint = float(trajectory.calls[0].messages[0]["content"].split()[-1])
        assert root.parent is None and root.name == "invoke_agent tiny"
        assert root.attributes["art.reward"] == trajectory.reward == pytest.approx(hint)
        assert root.attributes["art.ruler_score"] == pytest.approx(hint)
        assert "hint" in str(root.attributes["art.ruler_score.explanation"])
        assert root.attributes["art.independent_reward"] == 0.0
        assert root.attributes["art.metadata.scenario"] in ("s0", "s1")
        assert root.attributes["art.metrics.turns"] == 2
        assert root.attributes["art.adapter_step"] == step
        assert root.attributes["art.project"] == "tests"
        events = {e.attributes["gen_ai.evaluation.name"]: e.attributes for e in root.events}
        assert events["reward"]["gen_ai.evaluation.score.value"] == pytest.approx(hint)
        assert "gen_ai.evaluation.explanation" in events["ruler_score"]

        first, tool, second = children(spans, root)
        assert [first.name, tool.name, second.name] == [
            "chat tiny",
            "execute_tool get_weather",
            "chat tiny",
        ]
        for span, call in zip((first, second), trajectory.calls, strict=True):
            assert span.attributes["gen_ai.usage.input_tokens"] == len(call.prompt_token_ids)
            assert span.attributes["gen_ai.usage.output_tokens"] == len(call.completion_token_ids)
            assert span.attributes["gen_ai.request.model"] == "tiny"
            assert span.attributes["gen_ai.response.id"] == call.id
            assert span.attributes["art.adapter_step"] == step
            assert span.start_time == int(call.created_at * 1e9)
            # Token ids and logprobs stay out unless asked for.
            assert not any("token_ids" in k or "logprobs" in k for k in span.attributes)
        assert json.loads(str(first.attributes["gen_ai.input.messages"]))[0] == {
            "role": "user",
            "parts": [{"type": "text", "content": f"What is the weather? score-hint: {hint}"}],
        }
        (out,) = json.loads(str(first.attributes["gen_ai.output.messages"]))
        (part,) = [p for p in out["parts"] if p["type"] == "tool_call"]
        assert out["role"] == "assistant" and out["finish_reason"] == "tool_calls"
        city = part["arguments"]["city"]
        assert tool.attributes["gen_ai.tool.call.id"] == part["id"]
        assert json.loads(str(tool.attributes["gen_ai.tool.call.arguments"])) == {"city": city}
        assert tool.attributes["gen_ai.tool.call.result"] == weather(city)
        assert tool.attributes["art.tool.timing"] == "inferred"
        # Inferred timing: the tool ran between the request asking for it and the next one.
        assert first.end_time <= tool.start_time <= tool.end_time == second.start_time
        assert root.start_time <= first.start_time and second.end_time <= root.end_time


async def test_token_ids_logprobs_and_content_switches(tiny_model: art.TrainableModel) -> None:
    exporter, other = InMemorySpanExporter(), InMemorySpanExporter()
    tracing.enable(exporter, include_token_ids=True, include_logprobs=True)
    try:
        trajectory = await tool_rollout(tiny_model, 0.5)
        assert tracing.flush(10)
        # enable() again replaces the pipeline (and shuts its exporter down).
        tracing.enable(other, capture_content=False)
        private = await tool_rollout(tiny_model, 0.5)
        assert tracing.flush(10)
    finally:
        tracing.disable()
    spans = [*exporter.get_finished_spans(), *other.get_finished_spans()]
    by_rollout = {str(s.attributes["art.rollout.id"]): s for s in roots(spans)}
    first = children(spans, by_rollout[trajectory.id])[0]
    call = trajectory.calls[0]
    assert list(first.attributes["art.prompt_token_ids"]) == call.prompt_token_ids
    assert list(first.attributes["art.completion_token_ids"]) == call.completion_token_ids
    assert list(first.attributes["art.logprobs"]) == pytest.approx(call.logprobs)
    # capture_content=False: names, usage and scores stay; messages and tool data go.
    hidden = children(spans, by_rollout[private.id])
    assert [s.name for s in hidden] == ["chat tiny", "execute_tool get_weather", "chat tiny"]
    for span in hidden:
        assert not {
            "gen_ai.input.messages",
            "gen_ai.output.messages",
            "gen_ai.tool.call.arguments",
            "gen_ai.tool.call.result",
        } & set(span.attributes)
    assert hidden[0].attributes["gen_ai.usage.output_tokens"] > 0


async def test_rescored_rollouts_send_score_updates_not_duplicates(
    tiny_model: art.TrainableModel,
    memory: InMemorySpanExporter,
    judge: StandInJudge,
    tmp_path: Path,
) -> None:
    # Built outside gather: exported at once, reward 0.
    trajectories = [await tool_rollout(tiny_model, h) for h in (0.3, 0.7)]
    assert tracing.flush(10)
    assert [s.attributes["art.reward"] for s in roots(memory.get_finished_spans())] == [0.0, 0.0]
    # Scored later (gather over finished trajectories with RULER): scores follow as updates.
    await art.gather_trajectory_groups(
        [art.TrajectoryGroup(trajectories)], after_each=ruler(judge, tmp_path), pbar_desc=None
    )
    assert tracing.flush(10)
    spans = memory.get_finished_spans()
    assert len(roots(spans)) == 2
    for root, hint in zip(roots(spans), (0.3, 0.7), strict=True):
        updates = {s.name: s for s in children(spans, root) if s.name.startswith("evaluate ")}
        # RULER replaced the reward and kept the one before as independent_reward.
        assert set(updates) == {
            "evaluate reward",
            "evaluate ruler_score",
            "evaluate independent_reward",
        }
        assert updates["evaluate reward"].attributes[
            "gen_ai.evaluation.score.value"
        ] == pytest.approx(hint)
        assert updates["evaluate reward"].context.trace_id == root.context.trace_id


async def test_a_rollout_that_raises_is_traced_with_its_error(
    tiny_model: art.TrainableModel, memory: InMemorySpanExporter
) -> None:
    groups = await art.gather_trajectory_groups(
        [
            art.TrajectoryGroup(
                [tool_rollout(tiny_model, 0.5, fail=True), tool_rollout(tiny_model, 0.5)]
            )
        ],
        max_exceptions=1,
        pbar_desc=None,
    )
    assert len(groups[0].exceptions) == 1 and len(groups[0].trajectories) == 1
    assert tracing.flush(10)
    spans = memory.get_finished_spans()
    failed = [s for s in roots(spans) if s.status.status_code is StatusCode.ERROR]
    assert len(failed) == 1
    assert failed[0].attributes["art.error.type"] == "RuntimeError"
    assert "crashed" in str(failed[0].status.description)
    assert "art.reward" not in failed[0].attributes
    # The call it made before raising is there, and the tool it asked for.
    assert [s.name for s in children(spans, failed[0])] == ["chat tiny", "execute_tool get_weather"]


async def test_rollouts_nest_under_the_callers_span_and_integrations_report_tools(
    tiny_model: art.TrainableModel, memory: InMemorySpanExporter
) -> None:
    # The user's own OpenTelemetry setup (a provider of theirs, not the global one).
    user_tracer = TracerProvider().get_tracer("my-agent")
    with user_tracer.start_as_current_span("evaluate-agent") as outer:
        trajectory = await tool_rollout(tiny_model, 0.5, record_tools=True)
    assert tracing.flush(10)
    spans = memory.get_finished_spans()
    (root,) = [s for s in roots(spans) if s.attributes["art.rollout.id"] == trajectory.id]
    assert root.parent is not None and root.parent.span_id == outer.get_span_context().span_id
    assert root.context.trace_id == outer.get_span_context().trace_id
    (tool,) = [s for s in children(spans, root) if s.name.startswith("execute_tool")]
    assert tool.attributes["art.tool.timing"] == "recorded"
    assert tool.attributes["art.tool.metadata.server"] == "weather-mcp"
    assert (tool.end_time - tool.start_time) == pytest.approx(0.25e9, rel=1e-6)


async def test_spans_reach_an_otlp_http_endpoint(tiny_model: art.TrainableModel) -> None:
    with OtlpCollector() as collector:
        tracing.enable("otlp", endpoint=collector.endpoint)
        try:
            trajectory = await tool_rollout(tiny_model, 0.5)
            assert tracing.flush(10)
        finally:
            tracing.disable()
        stats_spans = collector.spans
    names = sorted(
        s["name"] for s in stats_spans if s["attributes"].get("art.rollout.id") == trajectory.id
    )
    assert names == ["chat tiny", "chat tiny", "execute_tool get_weather", "invoke_agent tiny"]
    root = next(s for s in stats_spans if s["name"] == "invoke_agent tiny")
    assert root["attributes"]["art.reward"] == 0.0
    assert root["attributes"]["gen_ai.agent.name"] == "tiny"
    chat = next(s for s in stats_spans if s["name"] == "chat tiny")
    assert chat["parent_span_id"] == root["span_id"]
    assert chat["attributes"]["gen_ai.response.finish_reasons"] in (["tool_calls"], ["length"])
