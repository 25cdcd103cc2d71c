"""MLflow as a tracing backend and a metrics backend: a real ``mlflow server`` (its own venv,
see ``art_core.tracing.servers``), a short tiny-random training run traced to it with
``metrics.enable_mlflow`` on, and what MLflow then holds, read back through its own REST API
(``/api/3.0/mlflow/traces/search``, ``/traces/get``, ``/api/2.0/mlflow/runs/search``,
``/metrics/get-history``) and its web UI in a headless Chromium.

The UI screenshot goes to ``$ART_TRACING_SCREENSHOTS/tracing-mlflow.png`` when set (the docs'
image comes from there), else the test's temporary folder."""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from tracing_support import closed_port, tool_rollout, traced_training_run, weather

import art_core as art
from art_core import metrics, tracing
from art_core.metrics.mlflow import MlflowLogger, numeric_metrics
from art_core.metrics.mlflow_rest import ExperimentChoice, mlflow_headers, resolve_tracking_uri
from art_core.rewards import ruler_score_group
from art_core.testing.judge import StandInJudge
from art_core.testing.pytest_plugin import register_tiny_model
from art_core.tracing.mlflow import (
    MlflowSink,
    assessment_body,
    assessment_id,
    mlflow_trace_id,
    span_inputs_outputs,
)
from art_core.tracing.servers import TracingServer, is_installed, server_dir
from art_core.tracing.settings import TracingSettings
from art_core.tracing.tree import Score, SpanNode

# run.sh installs it in the background while other tests run
pytestmark = pytest.mark.needs_install("mlflow", "chromium")

SCORES = {"reward", "ruler_score", "independent_reward"}
MODEL_NAME, MODEL_PROJECT = "mlflow-agent", "tracing"


def need_mlflow() -> None:
    """Skip without the MLflow server's venv (fail under CI, which must run these tests)."""
    if is_installed("mlflow"):
        return
    reason = "the MLflow server is not installed: art-core tracing install mlflow"
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the MLflow tests: {reason}")
    pytest.skip(reason)


# ---------------------------------------------------------------------------- without a server
def test_tracking_uri_experiment_and_auth_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_tracking_uri("http://mlflow:5000/v1/traces/") == "http://mlflow:5000"
    assert resolve_tracking_uri("localhost:5000", {}) == "http://localhost:5000"
    assert resolve_tracking_uri(None, {}) == "http://127.0.0.1:5000"
    assert resolve_tracking_uri(None, {"MLFLOW_TRACKING_URI": "https://ml.example/"}) == (
        "https://ml.example"
    )
    # Only a tracking *server* speaks the REST API and OTLP: the other URIs are refused
    # at enable time, with the reason.
    for uri in ("file:./mlruns", "sqlite:///mlflow.db", "databricks", "./mlruns"):
        with pytest.raises(ValueError, match="over HTTP"):
            resolve_tracking_uri(uri, {})

    assert ExperimentChoice.choose(None, None, {}) == ExperimentChoice(id="0")
    assert ExperimentChoice.choose("7", None, {"MLFLOW_EXPERIMENT_NAME": "x"}).id == "7"
    assert ExperimentChoice.choose(None, "mine", {"MLFLOW_EXPERIMENT_ID": "3"}).name == "mine"
    assert ExperimentChoice.choose(None, None, {"MLFLOW_EXPERIMENT_ID": "3"}).id == "3"
    assert ExperimentChoice.choose(None, None, {"MLFLOW_EXPERIMENT_NAME": "n"}).name == "n"
    with pytest.raises(ValueError, match="not both"):
        ExperimentChoice.choose("1", "n", {})

    assert mlflow_headers(None, {"MLFLOW_TRACKING_TOKEN": "tok"}) == {"authorization": "Bearer tok"}
    basic = mlflow_headers(None, {"MLFLOW_TRACKING_USERNAME": "u", "MLFLOW_TRACKING_PASSWORD": "p"})
    assert basic == {"authorization": "Basic " + base64.b64encode(b"u:p").decode()}
    assert mlflow_headers({"Authorization": "x"}, {"MLFLOW_TRACKING_TOKEN": "t"}) == {
        "Authorization": "x"
    }
    assert numeric_metrics({"train/loss": 1, "flag": True, "nan": float("nan"), "a:b": 2.0}) == {
        "train/loss": 1.0,
        "a_b": 2.0,
    }

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "from-env")
    sink = MlflowSink(TracingSettings())
    try:
        assert sink.tracking_uri == "http://mlflow.example:5000"
        assert sink.experiment == ExperimentChoice(name="from-env")
        assert sink.experiment_id is None  # resolved on the first export, not at enable time
    finally:
        sink.shutdown(1.0)
    with pytest.raises(ValueError, match="over HTTP"):
        tracing.enable("mlflow", endpoint="file:./mlruns")
    assert not tracing.is_enabled()
    with pytest.raises(ValueError, match="over HTTP"):
        metrics.enable_mlflow("sqlite:///mlflow.db")


def test_art_mlflow_turns_metric_logging_on_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from art_core.metrics import state

    url = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("ART_MLFLOW", "1")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "from-env")
    monkeypatch.setattr(state._mlflow_state, "env_checked", False)  # a fresh process's switch
    try:
        logger = state.mlflow_logger()
        assert isinstance(logger, MlflowLogger)
        assert logger.tracking_uri == url
        assert logger.experiment == ExperimentChoice(name="from-env")
        # Nothing reachable there: no run id, and nothing raised.
        assert metrics.mlflow_run_id("p", "m") is None
        assert metrics.flush(5.0)
    finally:
        metrics.disable_mlflow(2.0)
    assert state.mlflow_logger() is None


def test_assessment_body_is_an_mlflow_feedback() -> None:
    trace_id = mlflow_trace_id(0x0AF7651916CD43DD8448EB211C80319C)
    assert trace_id == "tr-0af7651916cd43dd8448eb211c80319c"
    body = assessment_body(
        trace_id, Score("ruler_score", 0.75, "best answer"), rollout_id="r1", now=1.5
    )
    assert body == {
        "assessment_id": assessment_id(trace_id, "ruler_score"),
        "assessment_name": "ruler_score",
        "trace_id": trace_id,
        "source": {"source_type": "LLM_JUDGE", "source_id": "art_core.ruler"},
        "feedback": {"value": 0.75},
        "rationale": "best answer",
        "metadata": {"art.rollout_id": "r1"},
        "create_time": "1970-01-01T00:00:01.500Z",
        "last_update_time": "1970-01-01T00:00:01.500Z",
    }
    # Stable per (trace, name): re-scoring targets the same feedback.
    assert assessment_id(trace_id, "reward") == assessment_id(trace_id, "reward")
    assert assessment_id(trace_id, "reward") != assessment_id(trace_id, "ruler_score")
    reward = assessment_body(trace_id, Score("reward", 1.0), span_id="00f067aa0ba902b7", now=0)
    assert reward["source"] == {"source_type": "CODE", "source_id": "art_core"}
    assert reward["span_id"] == "00f067aa0ba902b7" and "rationale" not in reward
    hidden = assessment_body(trace_id, Score("ruler_score", 0.5, "why"), explanation=False)
    assert "rationale" not in hidden
    assert assessment_body(trace_id, Score("reward", float("nan")))["feedback"] == {"value": "nan"}

    # An LLM call reads as an OpenAI chat request and completion (MLflow's chat view).
    llm = SpanNode(
        "chat m",
        "llm",
        0,
        1,
        input={"model": "m", "messages": [{"role": "user", "content": "hi"}], "params": {"n": 1}},
        output={"model": "m", "choices": [{"index": 0}], "usage": {"total_tokens": 3}},
    )
    inputs, outputs = span_inputs_outputs(llm)
    assert inputs == {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 1}
    assert outputs["object"] == "chat.completion" and outputs["choices"] == [{"index": 0}]


def test_assessment_body_parses_as_mlflows_own_create_assessment_message() -> None:
    """The body against MLflow's protobuf schema (its venv, no server)."""
    need_mlflow()
    body = {
        "assessment": assessment_body(
            mlflow_trace_id(1), Score("ruler_score", 0.5, "ok"), span_id="00f067aa0ba902b7"
        )
    }
    check = (
        "import json, sys\n"
        "from google.protobuf.json_format import ParseDict\n"
        "from mlflow.protos.service_pb2 import CreateAssessment\n"
        "from mlflow.entities.assessment import Assessment\n"
        "message = ParseDict(json.loads(sys.stdin.read()), CreateAssessment())\n"
        "a = Assessment.from_proto(message.assessment)\n"
        "print(json.dumps([a.name, a.value, a.rationale, a.source.source_type, a.span_id]))\n"
    )
    done = subprocess.run(
        [str(server_dir("mlflow") / "bin" / "python"), "-c", check],
        input=json.dumps(body),
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == ["ruler_score", 0.5, "ok", "LLM_JUDGE", "00f067aa0ba902b7"]


def test_a_down_mlflow_costs_little_and_raises_nothing(caplog: pytest.LogCaptureFixture) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    settings = TracingSettings(export_timeout_s=1.0)
    caplog.set_level(logging.WARNING)
    started = time.monotonic()
    sink = MlflowSink(settings, tracking_uri=url, experiment_name="nowhere")
    rollout = SpanNode(
        "invoke_agent a",
        "rollout",
        0.0,
        1.0,
        key="r1",
        scores=[Score("reward", 1.0)],
        attributes={"art.model.name": "a", "art.project": "p"},
    )
    try:
        assert time.monotonic() - started < 1.0  # enabling sends nothing
        for _ in range(3):
            sink.emit(rollout, None)
        sink.flush(10.0)  # a failed export returns (logged), it does not hang or raise
    finally:
        sink.shutdown(2.0)
    elapsed = time.monotonic() - started
    stats = sink.stats()
    assert stats["exported"] == 0 and stats["failed"] + stats["dropped"] == 3, stats
    # The scores wait for spans that never reached MLflow: nothing sent, nothing raised.
    assert stats["assessments_sent"] == 0 and stats["assessments_failed"] == 0
    assert elapsed < 15.0
    messages = [r.getMessage() for r in caplog.records if r.name == "art_core.tracing"]
    assert any("cannot resolve MLflow experiment 'nowhere'" in m for m in messages), messages
    assert any(url in m for m in messages), messages

    logger = MlflowLogger(url, experiment_name="nowhere", timeout_s=1.0)
    try:

        class Model:
            name, project, base_model = "m", "p", "tiny-random"

        logger.log(Model(), {"train/loss": 1.0}, step=0)
        assert logger.flush(10.0)
        assert logger.run_id("p", "m") is None
    finally:
        logger.close(2.0)
    assert logger.stats() == {"logged": 0, "failed": 1, "dropped": 0}
    assert any("MLflow logging" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------------------- a real MLflow
# `mlflow_server`: the session's MLflow server (tests/conftest.py), shared with the tracing
# guide's block.


def any_value(value: dict[str, Any]) -> Any:
    """An OpenTelemetry ``AnyValue`` in its protobuf JSON form, as a Python value."""
    if "string_value" in value:
        return value["string_value"]
    if "int_value" in value:
        return int(value["int_value"])  # int64: a JSON string
    if "double_value" in value:
        return float(value["double_value"])
    if "bool_value" in value:
        return bool(value["bool_value"])
    if "array_value" in value:
        return [any_value(v) for v in value["array_value"].get("values", [])]
    if "kvlist_value" in value:
        return {
            kv["key"]: any_value(kv.get("value", {}))
            for kv in value["kvlist_value"].get("values", [])
        }
    return None


@dataclass
class Span:
    name: str
    span_id: str
    parent_id: str | None
    start_ns: int
    attributes: dict[str, Any]

    @property
    def type(self) -> Any:
        return self.attributes.get("mlflow.spanType")


@dataclass
class Trace:
    info: dict[str, Any]
    spans: list[Span]

    @property
    def root(self) -> Span:
        (root,) = [s for s in self.spans if s.parent_id is None]
        return root

    def children(self, parent: Span) -> list[Span]:
        """The direct children of ``parent`` by start time (a tool, which starts when the LLM
        call asking for it ended, before the next call on a tie)."""
        found = [s for s in self.spans if s.parent_id == parent.span_id]
        return sorted(found, key=lambda s: (s.start_ns, s.type != "TOOL"))

    def assessments(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for assessment in self.info.get("assessments", []):
            name = assessment["assessment_name"]
            assert name not in out, f"duplicate feedback {assessment}"
            out[name] = assessment
        return out


class MlflowApi:
    """MLflow's REST API (``mlflow/server/handlers.py``), each reply checked for shape."""

    def __init__(self, url: str) -> None:
        self.client = httpx.Client(base_url=url, timeout=30.0)

    def call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        reply = self.client.request(method, path, **kwargs)
        assert reply.status_code == 200, f"{method} {path}: {reply.status_code} {reply.text}"
        body = reply.json()
        assert isinstance(body, dict), body
        return body

    def experiment_id(self, name: str) -> str:
        body = self.call(
            "GET", "/api/2.0/mlflow/experiments/get-by-name", params={"experiment_name": name}
        )
        return str(body["experiment"]["experiment_id"])

    def traces(self, experiment_id: str, filter: str | None = None) -> list[dict[str, Any]]:
        """Every trace info of an experiment (``POST /api/3.0/mlflow/traces/search``)."""
        found: list[dict[str, Any]] = []
        token = None
        for _ in range(100):
            request: dict[str, Any] = {
                "locations": [
                    {
                        "type": "MLFLOW_EXPERIMENT",
                        "mlflow_experiment": {"experiment_id": experiment_id},
                    }
                ],
                "max_results": 100,
            }
            if filter:
                request["filter"] = filter
            if token:
                request["page_token"] = token
            body = self.call("POST", "/api/3.0/mlflow/traces/search", json=request)
            found += body.get("traces", [])
            token = body.get("next_page_token")
            if not token:
                return found
        raise AssertionError("more than 100 pages of traces")

    def trace(self, trace_id: str) -> Trace:
        """A trace with its spans (``GET /api/3.0/mlflow/traces/get``)."""
        body = self.call("GET", "/api/3.0/mlflow/traces/get", params={"trace_id": trace_id})
        spans = [
            Span(
                name=s["name"],
                span_id=s["span_id"],
                parent_id=s.get("parent_span_id") or None,
                start_ns=int(s["start_time_unix_nano"]),
                attributes={
                    a["key"]: any_value(a.get("value", {})) for a in s.get("attributes", [])
                },
            )
            for s in body["trace"].get("spans", [])
        ]
        return Trace(body["trace"]["trace_info"], spans)

    def runs(self, experiment_id: str, filter: str) -> list[dict[str, Any]]:
        body = self.call(
            "POST",
            "/api/2.0/mlflow/runs/search",
            json={"experiment_ids": [experiment_id], "filter": filter, "max_results": 10},
        )
        return list(body.get("runs", []))

    def metric_history(self, run_id: str, key: str) -> list[dict[str, Any]]:
        body = self.call(
            "GET",
            "/api/2.0/mlflow/metrics/get-history",
            params={"run_id": run_id, "metric_key": key},
        )
        return list(body.get("metrics", []))


@pytest.fixture(scope="module")
def api(mlflow_server: TracingServer) -> Iterator[MlflowApi]:
    client = MlflowApi(mlflow_server.url)
    yield client
    client.client.close()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def agent(backend: art.LocalBackend) -> art.TrainableModel:
    """A tiny-random model of this module's own: training it leaves the session's
    ``tiny_model`` at step 0 for the other tests."""
    return await register_tiny_model(backend, MODEL_NAME, MODEL_PROJECT)


@dataclass
class TracedRun:
    experiment_id: str
    groups: list[art.TrajectoryGroup]
    traces: dict[str, Trace]  # by trace id
    stats: dict[str, int]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def traced(
    mlflow_server: TracingServer,
    api: MlflowApi,
    agent: art.TrainableModel,
    judge_server: StandInJudge,
    tmp_path_factory: pytest.TempPathFactory,
) -> TracedRun:
    """``traced_training_run`` traced to MLflow with the model's metrics logged there too,
    and every trace MLflow then holds in the experiment."""
    experiment = f"art-{uuid.uuid4().hex[:8]}"
    judge_server.reset()
    judge_server.reverse = False
    cache = tmp_path_factory.mktemp("mlflow-ruler")
    tracing.enable("mlflow", endpoint=mlflow_server.url, mlflow={"experiment_name": experiment})
    metrics.enable_mlflow(mlflow_server.url, experiment_name=experiment)
    try:
        groups = await traced_training_run(agent, judge_server.base_url, cache / "r.sqlite")
        # A validation record (``model.log``) goes to the model's run as well.
        await agent.log(groups, split="val")
        assert tracing.flush(60)
        assert metrics.flush(60)
        stats = tracing.stats()["mlflow"]
    finally:
        tracing.disable()
        metrics.disable_mlflow(30)
    # MLflow answers an OTLP request once its spans are committed, and flush waited for the
    # assessments and links sent after it: everything is readable now, no polling needed.
    experiment_id = api.experiment_id(experiment)
    infos = api.traces(experiment_id)
    traces = {info["trace_id"]: api.trace(info["trace_id"]) for info in infos}
    return TracedRun(experiment_id, groups, traces, stats)


def rollout_traces(run: TracedRun) -> list[Trace]:
    return [t for t in run.traces.values() if t.info["tags"].get("art.kind") == "rollout"]


@pytest.mark.slow
def test_mlflow_holds_each_rollout_as_a_trace_with_llm_and_tool_spans_and_feedback(
    traced: TracedRun,
) -> None:
    stats = traced.stats
    assert stats["failed"] == 0 and stats["dropped"] == 0, stats
    assert stats["assessments_sent"] == 4 * len(SCORES) and stats["assessments_failed"] == 0
    assert stats["waiting"] == 0, stats
    trajectories = {t.id: t for g in traced.groups for t in g}
    rollouts = rollout_traces(traced)
    # Exactly one trace per rollout (and one more: the train step).
    assert sorted(t.info["tags"]["art.rollout_id"] for t in rollouts) == sorted(trajectories)
    assert len(traced.traces) == len(trajectories) + 1
    for trace in rollouts:
        trajectory = trajectories[trace.info["tags"]["art.rollout_id"]]
        hint = float(trajectory.calls[0].messages[0]["content"].split()[-1])
        tags = trace.info["tags"]
        assert tags["mlflow.traceName"] == f"rollout {trajectory.metadata['scenario']}"
        assert tags["art.model"] == f"{MODEL_PROJECT}/{MODEL_NAME}"
        assert trace.info["state"] == "OK"
        assert "What is the weather? score-hint" in trace.info["request_preview"]

        root = trace.root
        assert root.name == f"invoke_agent {MODEL_NAME}" and root.type == "AGENT"
        assert root.attributes["art.rollout.id"] == trajectory.id
        assert root.attributes["mlflow.spanOutputs"]["reward"] == pytest.approx(hint)
        first, tool, second = trace.children(root)
        assert len(trace.spans) == 4
        assert [first.type, tool.type, second.type] == ["CHAT_MODEL", "TOOL", "CHAT_MODEL"]
        assert [first.name, tool.name, second.name] == [
            f"chat {MODEL_NAME}",
            "execute_tool get_weather",
            f"chat {MODEL_NAME}",
        ]
        # The conversation, as MLflow's chat view reads it (OpenAI request and completion).
        asked = first.attributes["mlflow.spanInputs"]["messages"]
        assert asked[0] == {"role": "user", "content": f"What is the weather? score-hint: {hint}"}
        (choice,) = first.attributes["mlflow.spanOutputs"]["choices"]
        (call,) = choice["message"]["tool_calls"]
        assert call["function"]["name"] == "get_weather"
        city = json.loads(call["function"]["arguments"])["city"]
        assert first.attributes["gen_ai.usage.output_tokens"] == len(
            trajectory.calls[0].completion_token_ids
        )
        # The tool call: its name, arguments and result.
        assert tool.attributes["gen_ai.tool.name"] == "get_weather"
        assert tool.attributes["mlflow.spanInputs"] == {"city": city}
        assert tool.attributes["mlflow.spanOutputs"] == weather(city)
        # The result went back to the model in the second call.
        sent = second.attributes["mlflow.spanInputs"]["messages"]
        assert {"role": "tool", "tool_call_id": call["id"], "content": weather(city)} in sent

        # Reward, RULER score (with the judge's explanation) and independent reward: feedback
        # on the whole trace, one each.
        feedback = trace.assessments()
        assert set(feedback) == SCORES
        assert feedback["reward"]["feedback"]["value"] == pytest.approx(trajectory.reward)
        assert feedback["reward"]["feedback"]["value"] == pytest.approx(hint)
        assert feedback["reward"]["source"] == {"source_type": "CODE", "source_id": "art_core"}
        assert feedback["reward"]["metadata"] == {"art.rollout_id": trajectory.id}
        ruler = feedback["ruler_score"]
        assert ruler["feedback"]["value"] == pytest.approx(hint)
        assert "hint" in ruler["rationale"]
        assert ruler["source"]["source_type"] == "LLM_JUDGE"
        assert feedback["independent_reward"]["feedback"]["value"] == 0.0
        assert all("span_id" not in a for a in feedback.values())


@pytest.mark.slow
def test_the_train_step_is_in_the_models_run_and_the_rollouts_are_linked_to_it(
    traced: TracedRun, api: MlflowApi
) -> None:
    (run,) = api.runs(traced.experiment_id, f"tags.`art.model` = '{MODEL_PROJECT}/{MODEL_NAME}'")
    info, data = run["info"], run["data"]
    assert info["run_name"] == MODEL_NAME and info["status"] == "FINISHED"
    params = {p["key"]: p["value"] for p in data.get("params", [])}
    assert params == {"base_model": "tiny-random", "art_project": MODEL_PROJECT}
    rewards = [t.reward for g in traced.groups for t in g]
    # The history's step: the adapter that served the rollouts (0), not the new one.
    (reward,) = api.metric_history(info["run_id"], "train/reward")
    assert reward["step"] == 0 and reward["value"] == pytest.approx(sum(rewards) / len(rewards))
    (loss,) = api.metric_history(info["run_id"], "train/loss")
    assert loss["step"] == 0
    (val,) = api.metric_history(info["run_id"], "val/reward")
    assert val["step"] == 1 and val["value"] == pytest.approx(reward["value"])
    # Every trace of the run (4 rollouts, the train step) is linked to the model's run.
    linked = {
        t["trace_id"] for t in api.traces(traced.experiment_id, f"run_id = '{info['run_id']}'")
    }
    assert linked == set(traced.traces)
    assert traced.stats["links_sent"] == len(traced.traces) and traced.stats["links_failed"] == 0
    (train,) = [t for t in traced.traces.values() if t.info["tags"].get("art.kind") == "train"]
    assert train.info["tags"]["mlflow.traceName"] == "train step 1"
    assert train.root.type == "CHAIN" and train.root.name == f"train_step {MODEL_NAME}"
    assert train.root.attributes["art.train.reward"] == pytest.approx(reward["value"])


@pytest.mark.slow
async def test_rescoring_updates_the_feedback_and_private_content_stays_out(
    mlflow_server: TracingServer,
    api: MlflowApi,
    agent: art.TrainableModel,
    judge: StandInJudge,
    tmp_path: Path,
) -> None:
    experiment = f"art-private-{uuid.uuid4().hex[:8]}"
    tracing.enable(
        "mlflow",
        endpoint=mlflow_server.url + "/v1/traces",  # the OTLP URL works as well as the base URL
        mlflow={"experiment_name": experiment},
        capture_content=False,
    )
    try:
        # Built outside gather: exported at once with reward 0, then scored by RULER: the
        # scores follow as updates of the same feedback.
        trajectories = [await tool_rollout(agent, h) for h in (0.3, 0.7)]
        assert tracing.flush(30)
        await art.gather_trajectory_groups(
            [art.TrajectoryGroup(trajectories)],
            after_each=lambda g: ruler_score_group(
                g, "judge-1", judge_base_url=judge.base_url, cache_path=tmp_path / "r.sqlite"
            ),
            pbar_desc=None,
        )
        assert tracing.flush(30)
        stats = tracing.stats()["mlflow"]
    finally:
        tracing.disable()
    # 1 first reward each, then 3 updates each (reward changed, ruler and independent new).
    assert stats["assessments_sent"] == 2 * (1 + 3) and stats["assessments_failed"] == 0, stats
    assert stats["links_sent"] == 0  # metrics.enable_mlflow is off: no run to link to
    experiment_id = api.experiment_id(experiment)
    traces = [api.trace(t["trace_id"]) for t in api.traces(experiment_id)]
    by_rollout = {t.info["tags"]["art.rollout_id"]: t for t in traces}
    assert sorted(by_rollout) == sorted(t.id for t in trajectories) and len(traces) == 2
    for trajectory, hint in zip(trajectories, (0.3, 0.7), strict=True):
        feedback = by_rollout[trajectory.id].assessments()  # fails on a duplicate name
        assert set(feedback) == SCORES
        reward = feedback["reward"]
        assert reward["feedback"]["value"] == pytest.approx(hint)
        assert reward["create_time"] < reward["last_update_time"]  # updated, not re-created
        assert feedback["independent_reward"]["feedback"]["value"] == 0.0
        # capture_content=False: the judge's explanation stays here too.
        assert "rationale" not in feedback["ruler_score"]
    # No message, argument or result reached MLflow: only names, kinds, usage and scores.
    shown = json.dumps([[t.info, [s.attributes for s in t.spans]] for t in traces])
    for private in ("score-hint", "What is the weather", "12\\u00b0C", "°C"):
        assert private not in shown
    tools = [s for t in traces for s in t.spans if s.type == "TOOL"]
    assert len(tools) == 2 and all(s.attributes["gen_ai.tool.name"] == "get_weather" for s in tools)


# ---------------------------------------------------------------------------- MLflow's UI
# What a first visit would pop over the page (MLflow 3.17's UI keeps these in localStorage,
# ``<key>_v<version>`` = JSON): the "Detect issues" guidance, a modal that swallows clicks,
# and the assistant panel that opens itself on the first load.
QUIET_UI = """
for (const [key, value] of [
  ["mlflow.detectIssues.guidanceShown_v1", true],
  ["mlflow.assistant.fab.autoOpenedOnFirstLoad_v1", true],
  ["mlflow.assistant.panelOpen_v1", false],
]) localStorage.setItem(key, JSON.stringify(value));
"""


def component(component_id: str) -> str:
    """A CSS selector for an element of MLflow's UI by its ``data-component-id``."""
    return f'[data-component-id="{component_id}"]'


@pytest.mark.slow
async def test_mlflow_ui_shows_a_rollout_with_its_tool_call_and_reward(
    traced: TracedRun, mlflow_server: TracingServer, tmp_path: Path
) -> None:
    from browser_support import chromium
    from playwright.async_api import expect

    shots = Path(os.environ.get("ART_TRACING_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240  (a local folder, once)
    trace = max(rollout_traces(traced), key=lambda t: t.info["request_time"])
    feedback = trace.assessments()
    question = trace.root.attributes["mlflow.spanInputs"]["messages"][0]["content"]
    async with chromium() as browser:
        page = await browser.new_page(viewport={"width": 1600, "height": 1000})
        await page.add_init_script(QUIET_UI)
        # The experiment's trace list: a row per rollout, showing the user's question.
        # Not "networkidle": MLflow's UI keeps polling, so the network may never go quiet.
        # The locators below wait for what they need.
        page.set_default_timeout(60_000)
        await page.goto(f"{mlflow_server.url}/#/experiments/{traced.experiment_id}/traces")
        await page.get_by_text(question, exact=True).click()
        await expect(page).to_have_url(re.compile(f"traceId={trace.info['trace_id']}"))
        # The trace: the rollout's span tree, with its tool call.
        await expect(page.get_by_text("execute_tool get_weather")).to_be_visible()
        await expect(page.get_by_text(f"chat {MODEL_NAME}")).to_have_count(2)
        # Its feedback: reward and RULER score (with the judge's explanation when opened).
        toggle = page.locator(component("shared.model-trace-explorer.assessments-pane-toggle"))
        await expect(toggle).to_have_attribute("aria-label", "Assess trace (3 assessments)")
        await toggle.click()
        expand = page.locator(component("shared.model-trace-explorer.toggle-assessment-expanded"))
        await expect(expand).to_have_count(3)

        def card(name: str) -> Any:
            """The assessments pane's card of feedback ``name`` (the innermost element
            holding its name and its expand button)."""
            return (
                page.locator("div")
                .filter(has=page.get_by_text(name, exact=True))
                .filter(has=expand)
                .last
            )

        reward = feedback["reward"]["feedback"]["value"]
        await expect(card("reward")).to_contain_text(f"{reward:g}")
        await card("ruler_score").locator(expand).click()
        await expect(card("ruler_score")).to_contain_text(feedback["ruler_score"]["rationale"])
        await expect(card("ruler_score")).to_contain_text("art_core.ruler")
        await page.screenshot(path=str(shots / "tracing-mlflow.png"))
