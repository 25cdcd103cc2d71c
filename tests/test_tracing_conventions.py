"""Each backend's attribute family, checked against what that backend's own SDK writes for the
same facts: OpenInference (``openinference-instrumentation``'s attribute helpers, what Phoenix
reads), Langfuse (its SDK's ``propagate_attributes`` and observation attributes), Weave (its
OTLP thread attributes). The spans are those of real tool-using rollouts through the gateway
(tiny-random); with ``capture_content=False`` no convention carries a message."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import openinference.instrumentation as oi
import openinference.semconv.trace as semconv
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tracing_support import children, roots, tool_rollout, weather

import art_core as art
from art_core import tracing
from art_core.testing.standins import LangfuseStandIn
from art_core.tracing import openinference
from art_core.tracing.langfuse import OBSERVATION_TYPES, langfuse_trace_attributes
from art_core.tracing.tree import SpanNode

MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "You answer with tools."},
    {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "12°C"},
]


def _normalised(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """Attribute values with JSON strings parsed (the SDK writes ``", "``, we write ``","``)
    and tuples as lists."""
    out: dict[str, Any] = {}
    for key, value in attributes.items():
        if isinstance(value, str) and value[:1] in "{[":
            try:
                value = json.loads(value)
            except ValueError:
                pass
        out[key] = list(value) if isinstance(value, tuple) else value
    return out


def _sdk_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same messages in OpenInference's ``Message`` TypedDict form."""
    out: list[dict[str, Any]] = []
    for message in messages:
        converted: dict[str, Any] = {"role": message["role"]}
        content = message.get("content")
        if isinstance(content, str):
            converted["content"] = content
        elif isinstance(content, list):
            converted["contents"] = [{"type": "text", "text": p["text"]} for p in content]
        if message.get("tool_call_id"):
            converted["tool_call_id"] = message["tool_call_id"]
        if message.get("tool_calls"):
            converted["tool_calls"] = [
                {
                    "id": c["id"],
                    "function": {
                        "name": c["function"]["name"],
                        "arguments": c["function"]["arguments"],
                    },
                }
                for c in message["tool_calls"]
            ]
        out.append(converted)
    return out


# ------------------------------------------------------------------ OpenInference (Phoenix)


def test_openinference_messages_equal_the_sdks() -> None:
    ours = openinference.message_attributes("llm.input_messages", MESSAGES)
    theirs = oi.get_llm_attributes(input_messages=_sdk_messages(MESSAGES))
    assert _normalised(ours) == _normalised(theirs)
    reply = [{"role": "assistant", "content": "It is 12°C."}]
    assert openinference.message_attributes("llm.output_messages", reply) == (
        oi.get_llm_attributes(output_messages=_sdk_messages(reply))
    )


def test_openinference_clips_content_like_the_genai_attributes() -> None:
    ours = openinference.message_attributes(
        "llm.input_messages", [{"role": "user", "content": "x" * 50}], max_chars=10
    )
    assert ours["llm.input_messages.0.message.content"] == "x" * 10 + "…[40 more chars]"


@pytest.fixture
def memory() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.enable(exporter)
    yield exporter
    tracing.disable()


def _rollout_spans(spans: tuple[ReadableSpan, ...]) -> tuple[ReadableSpan, list[ReadableSpan]]:
    (root,) = roots(spans)
    return root, children(spans, root)


async def test_openinference_span_kinds_io_tokens_and_tools_equal_the_sdks(
    tiny_model: art.TrainableModel, memory: InMemorySpanExporter
) -> None:
    trajectory = await tool_rollout(tiny_model, 0.5, scenario="oi")
    assert tracing.flush(10)
    root, (first, tool, second) = _rollout_spans(memory.get_finished_spans())
    kinds = {k.value for k in semconv.OpenInferenceSpanKindValues}
    assert [
        s.attributes[semconv.SpanAttributes.OPENINFERENCE_SPAN_KIND] for s in (root, first, tool)
    ] == ["AGENT", "LLM", "TOOL"]
    assert set(openinference.SPAN_KINDS.values()) <= kinds

    # An LLM span: what the SDK writes for its model, provider, tokens, messages and tools.
    call = trajectory.calls[0]
    usage = {
        "prompt": len(call.prompt_token_ids),
        "completion": len(call.completion_token_ids),
        "total": len(call.prompt_token_ids) + len(call.completion_token_ids),
    }
    expected = oi.get_llm_attributes(
        provider="art",
        model_name="tiny",
        input_messages=_sdk_messages(call.messages),
        output_messages=_sdk_messages([call.response_message]),
        token_count=usage,  # type: ignore[arg-type]
        tools=[{"json_schema": json.dumps(t)} for t in call.tools or []],
        invocation_parameters={
            k: v for k, v in call.request_params.items() if k not in ("model", "metadata")
        },
    )
    ours = {k: v for k, v in first.attributes.items() if k in expected}
    assert _normalised(ours) == _normalised(expected)
    assert first.attributes["input.mime_type"] == "application/json"
    assert json.loads(str(first.attributes["input.value"]))["messages"] == call.messages

    # The tool span: its name, arguments in and result out (text).
    city = json.loads(str(tool.attributes["input.value"]))["city"]
    assert {k: tool.attributes[k] for k in ("tool.name", "output.value", "output.mime_type")} == {
        "tool.name": "get_weather",
        **oi.get_output_attributes(weather(city)),
    }
    assert tool.attributes["tool.id"] == call.response_message["tool_calls"][0]["id"]

    # Trace level: the session on every span, metadata and tags on the root, as the SDK's
    # context helpers (using_session / using_metadata / using_tags) write them.
    session = f"tests/{tiny_model.name}/step-0"
    for span in (root, first, tool, second):
        assert span.attributes["session.id"] == session
        assert oi.get_session_attributes(session_id=session) == {"session.id": session}
    metadata = json.loads(str(root.attributes["metadata"]))
    assert metadata == {
        "rollout_id": trajectory.id,
        "model": tiny_model.name,
        "project": "tests",
        "adapter_step": 0,
        "scenario": "oi",
    }
    assert _normalised(oi.get_metadata_attributes(metadata=metadata)) == {"metadata": metadata}
    assert list(root.attributes["tag.tags"]) == ["art", "rollout", "step:0"]
    assert dict(oi.get_tag_attributes(tags=["art", "rollout", "step:0"])) == {
        "tag.tags": ["art", "rollout", "step:0"]
    }
    assert root.attributes["agent.name"] == tiny_model.name
    assert json.loads(str(root.attributes["output.value"]))["reward"] == 0.0


# ------------------------------------------------------------------ Weave over OTLP


async def test_weave_thread_attributes_make_each_rollout_a_thread_of_turns(
    tiny_model: art.TrainableModel, memory: InMemorySpanExporter
) -> None:
    # Weave's OTLP endpoint groups spans into threads by `wandb.thread_id` and counts the
    # spans marked `wandb.is_turn` as the thread's turns (docs: weave/guides/tracking/otel).
    trajectories = [await tool_rollout(tiny_model, h, scenario="w") for h in (0.1, 0.2)]
    assert tracing.flush(10)
    spans = memory.get_finished_spans()
    for root in roots(spans):
        rollout_id = root.attributes["art.rollout.id"]
        assert root.attributes["wandb.thread_id"] == rollout_id
        assert "wandb.is_turn" not in root.attributes
        kids = children(spans, root)
        assert [k.attributes["wandb.thread_id"] for k in kids] == [rollout_id] * 3
        assert [k.attributes["wandb.is_turn"] for k in kids] == [True] * 3
    assert sorted(r.attributes["art.rollout.id"] for r in roots(spans)) == sorted(
        t.id for t in trajectories
    )


# ------------------------------------------------------------------ Langfuse


def _langfuse_sdk_spans(session: str, metadata: dict[str, Any], tags: list[str], name: str):  # type: ignore[no-untyped-def]
    """What Langfuse's own SDK writes for a trace with this session, metadata, tags and name:
    an agent observation with a generation and a tool observation under it."""
    from langfuse import Langfuse, propagate_attributes

    exporter = InMemorySpanExporter()
    client = Langfuse(
        public_key=f"pk-lf-{uuid.uuid4().hex}",
        secret_key="sk-lf-test",
        base_url="http://127.0.0.1:9",
        span_exporter=exporter,
        tracer_provider=TracerProvider(),
    )
    with propagate_attributes(session_id=session, metadata=metadata, tags=tags, trace_name=name):
        with client.start_as_current_observation(name="rollout", as_type="agent"):
            with client.start_as_current_observation(
                name="chat", as_type="generation", model="tiny", usage_details={"input": 3}
            ):
                pass
            with client.start_as_current_observation(name="get_weather", as_type="tool"):
                pass
    client.flush()
    client.shutdown()
    return {s.name: dict(s.attributes or {}) for s in exporter.get_finished_spans()}


async def test_langfuse_trace_attributes_equal_what_its_sdk_propagates(
    tiny_model: art.TrainableModel,
) -> None:
    memory = InMemorySpanExporter()
    with LangfuseStandIn() as api:
        tracing.enable(
            "langfuse",
            langfuse={
                "public_key": f"pk-lf-{uuid.uuid4().hex}",
                "secret_key": "sk-lf-test",
                "base_url": api.url,
                "span_exporter": memory,
            },
        )
        try:
            trajectory = await tool_rollout(tiny_model, 0.5, scenario="lf")
            assert tracing.flush(15)
        finally:
            tracing.disable()
    root, kids = _rollout_spans(memory.get_finished_spans())
    metadata = {
        "rollout_id": trajectory.id,
        "model": tiny_model.name,
        "project": "tests",
        "adapter_step": 0,
        "scenario": "lf",
    }
    session = f"tests/{tiny_model.name}/step-0"
    sdk = _langfuse_sdk_spans(session, metadata, ["art", "rollout", "step:0"], "rollout lf")
    trace_keys = {
        k for k in sdk["chat"] if k.startswith(("langfuse.trace.", "session.id", "user.id"))
    }
    assert trace_keys >= {"session.id", "langfuse.trace.name", "langfuse.trace.tags"}
    # Every span of ours carries the trace-level attributes the SDK propagates, byte-equal.
    for span in (root, *kids):
        ours = dict(span.attributes or {})
        assert {k: _normalised({k: ours.get(k)})[k] for k in trace_keys} == {
            k: _normalised({k: sdk["chat"][k]})[k] for k in trace_keys
        }
        assert ours["langfuse.session.id"] == session
        for key in trace_keys:
            if key.startswith("langfuse.trace.metadata."):
                assert ours[key] == sdk["chat"][key]  # the SDK's exact JSON encoding
    # Observation types and the generation's model and usage, as the SDK writes them.
    assert [s.attributes["langfuse.observation.type"] for s in (root, *kids)] == [
        sdk["rollout"]["langfuse.observation.type"],
        sdk["chat"]["langfuse.observation.type"],
        sdk["get_weather"]["langfuse.observation.type"],
        sdk["chat"]["langfuse.observation.type"],
    ]
    assert set(OBSERVATION_TYPES.values()) <= {"agent", "generation", "tool", "span"}
    generation = kids[0]
    assert generation.attributes["langfuse.observation.model.name"] == "tiny"
    usage = json.loads(str(generation.attributes["langfuse.observation.usage_details"]))
    assert usage["input"] == len(trajectory.calls[0].prompt_token_ids)
    assert set(usage) >= set(json.loads(sdk["chat"]["langfuse.observation.usage_details"]))


def test_a_rollout_nested_in_a_users_trace_leaves_its_name_and_tags_alone() -> None:
    root = SpanNode("r", "rollout", 0, 1, key="r1", attributes={"art.adapter_step": 1})
    assert "langfuse.trace.name" in langfuse_trace_attributes(root)
    from art_core.tracing.langfuse import LangfuseSink

    class Probe(LangfuseSink):
        def __init__(self) -> None:  # no client: only the attribute logic is probed
            pass

    probe = Probe()
    assert not any(k.startswith("langfuse.trace.") for k in probe.trace_attributes(root, True))
    assert "langfuse.trace.name" in probe.trace_attributes(root, False)


# ------------------------------------------------------------------ content capture off


async def test_no_convention_exports_messages_when_content_capture_is_off(
    tiny_model: art.TrainableModel,
) -> None:
    otlp, langfuse_memory = InMemorySpanExporter(), InMemorySpanExporter()
    with LangfuseStandIn() as api:
        tracing.enable(
            [otlp, "langfuse"],
            langfuse={
                "public_key": f"pk-lf-{uuid.uuid4().hex}",
                "secret_key": "sk-lf-test",
                "base_url": api.url,
                "span_exporter": langfuse_memory,
            },
            capture_content=False,
        )
        try:
            trajectory = await tool_rollout(tiny_model, 0.5, scenario="private")
            assert tracing.flush(15)
        finally:
            tracing.disable()
    call = trajectory.calls[0]
    arguments = call.response_message["tool_calls"][0]["function"]["arguments"]
    city = json.loads(arguments)["city"]
    secrets = ["score-hint", weather(city), arguments, f'"city":"{city}"']
    for exporter in (otlp, langfuse_memory):
        spans = exporter.get_finished_spans()
        assert len(spans) == 4
        for span in spans:
            text = json.dumps({k: str(v) for k, v in (span.attributes or {}).items()})
            assert not [s for s in secrets if s in text], (span.name, text[:500])
            assert not any(
                k.startswith(("llm.input_messages", "llm.output_messages"))
                for k in span.attributes or {}
            )
    # What stays: kinds, names, usage and the session.
    root, (first, tool, _) = _rollout_spans(otlp.get_finished_spans())
    assert (first.attributes["openinference.span.kind"], tool.attributes["tool.name"]) == (
        "LLM",
        "get_weather",
    )
    assert first.attributes["llm.token_count.prompt"] == len(call.prompt_token_ids)
    assert root.attributes["session.id"] == f"tests/{tiny_model.name}/step-0"
