"""The parts of tracing that need no server: span trees from recorded calls, the GenAI message
format, settings, the guarded exporter, the worker and the pipeline's export-once rule."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from art_core.background import Worker
from art_core.tracing.build import RolloutRecord, rollout_tree, ruler_explanation
from art_core.tracing.exporters import GuardedExporter
from art_core.tracing.genai import attribute_value, semconv_message
from art_core.tracing.otel import OtelSink
from art_core.tracing.pipeline import Pipeline
from art_core.tracing.settings import TracingSettings, exporters_from_env
from art_core.tracing.tools import ToolRecord
from art_core.trajectories import LLMCall, Trajectory

USER = {"role": "user", "content": "Weather in Paris and Lima?"}


def call(
    index: int, start: float, messages: list[dict[str, Any]], answer: dict[str, Any], **kw: Any
) -> LLMCall:
    return LLMCall(
        rollout_id="r1",
        index=index,
        model="tiny",
        messages=messages,
        prompt_token_ids=[1, 2, 3],
        completion_token_ids=[4, 5],
        logprobs=[-0.1, -0.2],
        response_message=answer,
        created_at=start,
        latency_s=1.0,
        **kw,
    )


def tool_call(call_id: str, city: str) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": f'{{"city": "{city}"}}'},
    }


def two_tool_rollout() -> list[LLMCall]:
    ask = {
        "role": "assistant",
        "content": "",
        "tool_calls": [tool_call("c1", "Paris"), tool_call("c2", "Lima")],
    }
    second_turn = [USER, ask, {"role": "tool", "tool_call_id": "c1", "content": "12°C"}]
    return [
        call(0, 10.0, [USER], ask, finish_reason="tool_calls"),
        # Only Paris's result came back before the next request; Lima's never did.
        call(1, 13.0, second_turn, {"role": "assistant", "content": "12°C in Paris."}),
    ]


def test_tool_spans_are_inferred_from_the_conversation() -> None:
    record = RolloutRecord(
        id="r1", calls=two_tool_rollout(), reward=1.0, start_time=9.5, end_time=15.0
    )
    tree = rollout_tree(record, TracingSettings())
    assert [(c.name, c.start_time, c.end_time) for c in tree.children] == [
        ("chat tiny", 10.0, 11.0),
        ("execute_tool get_weather", 11.0, 13.0),  # ran until the request carrying its result
        ("execute_tool get_weather", 11.0, 15.0),  # no result seen: until the rollout ended
        ("chat tiny", 13.0, 14.0),
    ]
    paris, lima = tree.children[1], tree.children[2]
    assert paris.attributes["gen_ai.tool.call.result"] == "12°C" and paris.output == "12°C"
    assert "gen_ai.tool.call.result" not in lima.attributes
    assert tree.attributes["art.num_tool_calls"] == 2
    assert (tree.start_time, tree.end_time) == (9.5, 15.0)


def test_integration_tool_records_replace_inferred_spans() -> None:
    records = [
        ToolRecord(
            "get_weather", {"city": "Paris"}, "12°C", start_time=11.2, end_time=11.9, call_id="c1"
        ),
        ToolRecord(
            "search_docs", {"q": "x"}, ["doc"], start_time=12.0, end_time=12.5, error="timeout"
        ),
    ]
    record = RolloutRecord(
        id="r1", calls=two_tool_rollout(), reward=1.0, start_time=9.5, end_time=15.0, tools=records
    )
    tools = [c for c in rollout_tree(record, TracingSettings()).children if c.kind == "tool"]
    assert [
        (t.display_name, t.start_time, t.end_time, t.attributes["art.tool.timing"]) for t in tools
    ] == [
        ("get_weather", 11.0, 15.0, "inferred"),
        ("get_weather", 11.2, 11.9, "recorded"),
        ("search_docs", 12.0, 12.5, "recorded"),
    ]
    assert tools[2].error == "timeout" and tools[2].output == ["doc"]


def test_n_choices_make_one_llm_span_and_token_ids_only_on_request() -> None:
    calls = [
        call(0, 1.0, [USER], {"role": "assistant", "content": "a"}, choice_index=0),
        call(
            0,
            1.0,
            [USER],
            {"role": "assistant", "content": "b"},
            choice_index=1,
            finish_reason="length",
        ),
    ]
    record = RolloutRecord(id="r1", calls=calls, reward=0.0, start_time=1.0)
    (llm,) = rollout_tree(record, TracingSettings()).children
    assert llm.attributes["gen_ai.response.finish_reasons"] == ["stop", "length"]
    assert llm.attributes["gen_ai.usage.output_tokens"] == 4
    assert not any("token_ids" in k or "logprobs" in k for k in llm.attributes)
    (llm,) = rollout_tree(
        record, TracingSettings(include_token_ids=True, include_logprobs=True)
    ).children
    assert llm.attributes["art.completion_token_ids"] == [4, 5, 4, 5]
    assert llm.attributes["art.logprobs"] == [-0.1, -0.2, -0.1, -0.2]


def test_content_is_clipped_and_can_be_left_out() -> None:
    long = {"role": "user", "content": "x" * 50}
    record = RolloutRecord(
        id="r1",
        calls=[call(0, 1.0, [long], {"role": "assistant", "content": "ok"})],
        reward=0.0,
        start_time=1.0,
        logs=["RULER (j) score 0.500: fine"],
        metrics={"ruler_score": 0.5},
    )
    (llm,) = rollout_tree(record, TracingSettings(max_content_chars=10)).children
    assert "x" * 10 + "…[40 more chars]" in str(llm.attributes["gen_ai.input.messages"])
    private = rollout_tree(record, TracingSettings(capture_content=False))
    assert "art.logs" not in private.attributes
    assert "art.ruler_score.explanation" not in private.attributes
    assert "gen_ai.input.messages" not in private.children[0].attributes


def test_semconv_messages() -> None:
    assert semconv_message(
        {"role": "assistant", "content": None, "tool_calls": [tool_call("c1", "Paris")]}
    ) == {
        "role": "assistant",
        "parts": [
            {"type": "tool_call", "id": "c1", "name": "get_weather", "arguments": {"city": "Paris"}}
        ],
    }
    image = {
        "role": "user",
        "content": [
            {"type": "text", "text": "what?"},
            {"type": "image_url", "image_url": {"url": "data:..."}},
        ],
    }
    assert semconv_message(image)["parts"] == [
        {"type": "text", "content": "what?"},
        {"type": "image_url"},
    ]


def test_attribute_values_and_ruler_log_parsing() -> None:
    assert attribute_value([1, "a"]) == '[1,"a"]'
    assert attribute_value(float("inf")) == "inf"
    assert attribute_value(None) is None
    assert ruler_explanation(["x", "RULER (gpt) score 0.250: multi\nline"]) == (
        "gpt",
        "multi\nline",
    )
    assert ruler_explanation(["no judge here"]) is None


def test_settings_from_the_environment() -> None:
    assert exporters_from_env({"ART_TRACING": "1"}) == ["otlp"]
    assert exporters_from_env({"ART_TRACING": "off"}) == []
    with pytest.raises(ValueError, match="unknown exporters"):
        exporters_from_env({"ART_TRACING": "otlp,zipkin"})
    with pytest.raises(ValueError, match="ART_TRACING_TOKEN_IDS"):
        TracingSettings.from_env({"ART_TRACING_TOKEN_IDS": "maybe"})
    with pytest.raises(ValueError, match="max_queue_size"):
        TracingSettings(max_queue_size=0)
    with pytest.raises(TypeError, match="unknown tracing settings"):
        TracingSettings().replace(colour="red")


class _Failing(SpanExporter):
    def __init__(self) -> None:
        self.calls = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls += 1
        raise ConnectionError("collector unreachable")


def test_guarded_exporter_turns_errors_into_paused_failures(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inner = _Failing()
    guard = GuardedExporter(inner, "collector")
    assert guard.export([]) is SpanExportResult.FAILURE
    # Right after a failure the next batches are dropped without touching the endpoint.
    assert guard.export([]) is SpanExportResult.FAILURE
    assert inner.calls == 1 and guard.stats() == {"exported": 0, "failed": 0, "dropped": 0}
    assert caplog.text.count("tracing export to collector failed") == 1


def test_worker_runs_tasks_in_order_and_survives_failures(caplog: pytest.LogCaptureFixture) -> None:
    worker = Worker(max_queue_size=10)
    seen: list[int] = []
    worker.submit(lambda: seen.append(1))
    worker.submit(lambda: 1 / 0)  # type: ignore[func-returns-value]
    worker.submit(lambda: seen.append(2))
    assert worker.flush(5) and seen == [1, 2] and worker.failed == 1
    assert "export task failed" in caplog.text
    worker.close(5)
    assert not worker.submit(lambda: None) and worker.dropped == 1


def test_pipeline_exports_a_trajectory_once_and_updates_changed_scores() -> None:
    memory = InMemorySpanExporter()
    pipeline = Pipeline([OtelSink(memory, TracingSettings())], TracingSettings())
    trajectory = Trajectory(reward=0.0, calls=two_tool_rollout())
    pipeline.rollout_finished(trajectory)
    pipeline.rollout_finished(trajectory)  # again, unchanged: nothing new
    trajectory.reward = 0.75  # re-scored later
    pipeline.rollout_finished(trajectory)
    assert pipeline.flush(5)
    names = [s.name for s in memory.get_finished_spans()]
    assert names.count("invoke_agent agent") == 1 and names.count("evaluate reward") == 1
    update = next(s for s in memory.get_finished_spans() if s.name == "evaluate reward")
    assert update.attributes["gen_ai.evaluation.score.value"] == 0.75
    pipeline.shutdown(1)


def test_tool_calls_recorded_from_another_thread_reach_the_rollout() -> None:
    memory = InMemorySpanExporter()
    pipeline = Pipeline([OtelSink(memory, TracingSettings())], TracingSettings())
    pipeline.run_started("r9", None)
    thread = threading.Thread(
        target=pipeline.tool_call, args=("r9", ToolRecord("lookup", {}, "ok", 1.0, 2.0))
    )
    thread.start()
    thread.join()
    pipeline.rollout_finished(Trajectory(id="r9", start_time=0.5, end_time=3.0))
    assert pipeline.flush(5)
    assert "execute_tool lookup" in [s.name for s in memory.get_finished_spans()]
    pipeline.shutdown(1)


def test_ruler_explanation_comes_from_metadata_before_logs() -> None:
    from art_core.tracing.build import rollout_scores

    record = RolloutRecord(
        id="r1",
        calls=[],
        reward=0.7,
        start_time=1.0,
        logs=["RULER (old) score 0.100: an earlier scoring", "a later user log line"],
        metrics={"ruler_score": 0.7, "independent_reward": 1.0},
        metadata={"ruler": {"judge_model": "j", "score": 0.7, "explanation": "found the flight"}},
    )
    scores = {s.name: s for s in rollout_scores(record, TracingSettings())}
    assert scores["ruler_score"].value == 0.7
    assert scores["ruler_score"].comment == "found the flight"
    legacy = RolloutRecord(
        id="r2", calls=[], reward=0.1, start_time=1.0, logs=record.logs, metrics=record.metrics
    )
    legacy_scores = {s.name: s for s in rollout_scores(legacy, TracingSettings())}
    assert legacy_scores["ruler_score"].comment == "an earlier scoring"
