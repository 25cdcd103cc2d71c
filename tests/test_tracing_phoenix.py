"""Arize Phoenix as a tracing backend: a real ``phoenix serve`` (its own venv, see
``art_core.tracing.servers``), a short tiny-random training run traced to it, and what
Phoenix then shows, read back through its own REST API (``/v1/projects/{project}/spans``,
``/span_annotations``, ``/sessions``) and its web UI in a headless Chromium.

The UI screenshot goes to ``$ART_TRACING_SCREENSHOTS/tracing-phoenix.png`` when set (the docs'
image comes from there), else the test's temporary folder."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import pytest_asyncio
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tracing_support import closed_port, tool_rollout, traced_training_run, weather

import art_core as art
from art_core import tracing
from art_core.rewards import ruler_score_group
from art_core.rewards.endpoint import JUDGE_ENV_VARS
from art_core.testing.judge import StandInJudge
from art_core.testing.pytest_plugin import register_tiny_model
from art_core.tracing.phoenix import (
    IDENTIFIER,
    PROJECT_ATTRIBUTE,
    PhoenixSink,
    annotation_body,
    phoenix_base_url,
    phoenix_headers,
)
from art_core.tracing.servers import TracingServer
from art_core.tracing.settings import TracingSettings
from art_core.tracing.tree import Score, SpanNode

# run.sh installs it in the background while other tests run
pytestmark = pytest.mark.needs_install("phoenix", "chromium")

T = TypeVar("T")
WAIT_S = 60.0  # Phoenix ingests spans asynchronously; a loaded CI machine may take a while
SCORES = {"reward", "ruler_score", "independent_reward"}
MODEL_NAME, MODEL_PROJECT = "phoenix-agent", "tracing"


# ---------------------------------------------------------------------------- without a server
def test_endpoint_project_and_api_key_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    assert phoenix_base_url("http://phoenix:6006/v1/traces") == "http://phoenix:6006"
    assert phoenix_base_url(" https://app.phoenix.arize.com/s/team/ ") == (
        "https://app.phoenix.arize.com/s/team"
    )
    assert phoenix_base_url("localhost:6006", {}) == "http://localhost:6006"
    assert phoenix_base_url(None, {}) == "http://127.0.0.1:6006"
    assert phoenix_base_url(None, {"PHOENIX_COLLECTOR_ENDPOINT": "http://px:1/v1/traces"}) == (
        "http://px:1"
    )
    assert phoenix_headers(None, "k") == {"authorization": "Bearer k"}
    # Headers the caller set win over the key.
    assert phoenix_headers({"Authorization": "Basic x"}, "k") == {"Authorization": "Basic x"}

    monkeypatch.setenv("PHOENIX_COLLECTOR_ENDPOINT", "http://px.example:6006/v1/traces")
    monkeypatch.setenv("PHOENIX_PROJECT_NAME", "from-env")
    monkeypatch.setenv("PHOENIX_API_KEY", "px-secret")
    sink = PhoenixSink(TracingSettings(service_name="trainer"))
    try:
        assert (sink.url, sink.project_name) == ("http://px.example:6006", "from-env")
        assert sink.headers == {"authorization": "Bearer px-secret"}
        resource = sink.provider.resource.attributes
        assert resource[PROJECT_ATTRIBUTE] == "from-env"
        assert resource["service.name"] == "trainer"
        exporter = sink.guard.inner if sink.guard else None
        assert getattr(exporter, "_endpoint", None) == "http://px.example:6006/v1/traces"
    finally:
        sink.shutdown(1.0)
    explicit = PhoenixSink(TracingSettings(), endpoint="http://a:1", project_name="p")
    try:
        assert (explicit.url, explicit.project_name) == ("http://a:1", "p")
    finally:
        explicit.shutdown(1.0)


def test_annotation_body_is_phoenix_span_annotation_data() -> None:
    body = annotation_body(
        "00f067aa0ba902b7", Score("ruler_score", 0.75, "best"), metadata={"rollout_id": "r1"}
    )
    assert body == {
        "span_id": "00f067aa0ba902b7",
        "name": "ruler_score",
        "annotator_kind": "LLM",  # RULER is an LLM judge
        "result": {"score": 0.75, "explanation": "best"},
        "metadata": {"rollout_id": "r1"},
        "identifier": IDENTIFIER,
    }
    hidden = annotation_body("00f067aa0ba902b7", Score("ruler_score", 0.75, "x"), explanation=False)
    assert hidden["result"] == {"score": 0.75}


def test_a_down_phoenix_costs_little_and_raises_nothing() -> None:
    settings = TracingSettings(export_timeout_s=1.0)
    sink = PhoenixSink(settings, endpoint=f"http://127.0.0.1:{closed_port()}")
    rollout = SpanNode("invoke_agent a", "rollout", 0.0, 1.0, key="r1", scores=[Score("r", 1.0)])
    try:
        started = time.monotonic()
        for _ in range(3):  # the first failure pauses annotations: the next ones are dropped
            sink.emit(rollout, None)
        elapsed = time.monotonic() - started
    finally:
        sink.shutdown(1.0)
    stats = sink.stats()
    assert stats["annotations_sent"] == 0
    assert stats["annotations_failed"] == 1 and stats["annotations_dropped"] == 2
    assert elapsed < 10.0


def test_annotations_wait_for_their_span_then_fall_back_to_phoenix_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import art_core.tracing.phoenix as phoenix_module

    monkeypatch.setattr(phoenix_module, "SPAN_WAIT_S", 0.5)
    # Spans to memory; annotations to a stand-in of Phoenix's REST API.
    monkeypatch.setattr(phoenix_module, "otlp_exporter", lambda *a: InMemorySpanExporter())
    requests: list[httpx.Request] = []
    known_after = {"count": 2}  # 404 (span not ingested yet) this many times, then 200

    def phoenix_api(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        data = json.loads(request.content)["data"]
        if request.url.params.get("sync") != "true":
            return httpx.Response(200, json={"data": []})  # queued: Phoenix answers no ids
        if known_after["count"] > 0:
            known_after["count"] -= 1
            return httpx.Response(404, json={"detail": "Spans with IDs x do not exist."})
        return httpx.Response(200, json={"data": [{"id": f"a{i}"} for i in range(len(data))]})

    sink = PhoenixSink(TracingSettings(), endpoint="http://phoenix.invalid", api_key="k")
    sink._client = httpx.Client(
        base_url=sink.url, headers=sink.headers, transport=httpx.MockTransport(phoenix_api)
    )
    try:
        scores = [Score("reward", 0.5), Score("ruler_score", 0.5, "why")]
        sink.emit(SpanNode("invoke_agent a", "rollout", 0.0, 1.0, key="r1", scores=scores), None)
        assert [r.url.params.get("sync") for r in requests] == ["true"] * 3
        assert sink.stats()["annotations_sent"] == 2
        sent = json.loads(requests[-1].content)["data"]
        assert [a["name"] for a in sent] == ["reward", "ruler_score"]
        assert requests[-1].headers["authorization"] == "Bearer k"
        # A span Phoenix does not show within SPAN_WAIT_S: queued there, and so are the next
        # rollouts' annotations for a while (no worker time spent waiting).
        known_after["count"] = 10_000
        requests.clear()
        started = time.monotonic()
        sink.emit(SpanNode("invoke_agent b", "rollout", 0.0, 1.0, key="r2", scores=scores), None)
        sink.emit(SpanNode("invoke_agent c", "rollout", 0.0, 1.0, key="r3", scores=scores), None)
        assert time.monotonic() - started < 5.0
        assert requests[-1].url.params.get("sync") is None
        assert requests[-2].url.params.get("sync") is None
        assert all(r.url.params.get("sync") == "true" for r in requests[:-2])
        assert sink.stats()["annotations_queued"] == 4
        assert sink.stats()["annotations_failed"] == 0
    finally:
        sink.shutdown(1.0)


# ---------------------------------------------------------------------------- a real Phoenix
# `phoenix`: the session's Phoenix server (tests/conftest.py), shared with the tracing guide's
# block.


def wait_for(read: Callable[[], T], ready: Callable[[T], bool], what: str) -> T:
    """``read()`` once ``ready`` holds for it; fails with the last read after ``WAIT_S``."""
    deadline = time.monotonic() + WAIT_S
    while True:
        value = read()
        if ready(value):
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"Phoenix did not show {what} within {WAIT_S:.0f} s; last read: {value}")
        time.sleep(0.2)


class PhoenixApi:
    """Phoenix's REST API (``phoenix/server/api/routers/v1``), each reply checked for shape."""

    def __init__(self, url: str) -> None:
        self.client = httpx.Client(base_url=url, timeout=10.0)

    def _pages(self, path: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        cursor = None
        for _ in range(100):
            page = {**params, "cursor": cursor} if cursor else params
            reply = self.client.get(path, params=page)
            if reply.status_code == 404:  # the project does not exist yet (no span ingested)
                return []
            reply.raise_for_status()
            body = reply.json()
            assert isinstance(body.get("data"), list), body
            items += body["data"]
            cursor = body.get("next_cursor")
            if not cursor:
                return items
        raise AssertionError(f"{path}: more than 100 pages")

    def spans(self, project: str) -> list[dict[str, Any]]:
        """Every span of ``project`` (``GET /v1/projects/{project}/spans``)."""
        spans = self._pages(f"/v1/projects/{project}/spans", {"limit": 1000})
        for span in spans:
            assert {"name", "context", "span_kind", "parent_id", "attributes"} <= set(span), span
        return spans

    def annotations(self, project: str, span_ids: list[str]) -> list[dict[str, Any]]:
        """The span annotations of ``span_ids`` (``GET /v1/projects/{p}/span_annotations``)."""
        if not span_ids:
            return []
        annotations = self._pages(
            f"/v1/projects/{project}/span_annotations", {"span_ids": span_ids, "limit": 1000}
        )
        for annotation in annotations:
            assert {"span_id", "name", "annotator_kind", "result", "identifier"} <= set(annotation)
        return annotations

    def projects(self) -> list[dict[str, Any]]:
        """Every project (``GET /v1/projects``): name and GlobalID."""
        projects = self._pages("/v1/projects", {})
        assert all({"name", "id"} <= set(p) for p in projects), projects
        return projects

    def sessions(self, project: str) -> list[dict[str, Any]]:
        """The sessions of ``project`` with their traces (``GET /v1/projects/{p}/sessions``)."""
        return self._pages(f"/v1/projects/{project}/sessions", {"limit": 100})


@pytest.fixture(scope="module")
def api(phoenix: TracingServer) -> Iterator[PhoenixApi]:
    client = PhoenixApi(phoenix.url)
    yield client
    client.client.close()


def rollout_roots(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for s in spans if s["parent_id"] is None and "art.rollout.id" in s["attributes"]]


def children_of(spans: list[dict[str, Any]], parent: dict[str, Any]) -> list[dict[str, Any]]:
    span_id = parent["context"]["span_id"]
    return sorted((s for s in spans if s["parent_id"] == span_id), key=lambda s: s["start_time"])


def by_span(annotations: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for annotation in annotations:
        named = out.setdefault(annotation["span_id"], {})
        assert annotation["name"] not in named, f"duplicate annotation {annotation}"
        named[annotation["name"]] = annotation
    return out


def attribute(span: dict[str, Any], key: str) -> Any:
    """A span attribute as Phoenix's REST API returns it: flattened, lists included
    (``flatten(..., recurse_on_sequence=True)`` in ``routers/v1/spans.py``)."""
    return span["attributes"].get(key)


def messages(span: dict[str, Any], which: str) -> list[dict[str, Any]]:
    """``llm.{which}_messages`` of a span, from OpenInference's flattened
    ``llm.input_messages.{i}.message.{field}`` attributes."""
    prefix = f"llm.{which}_messages."
    found: dict[int, dict[str, Any]] = {}
    for key, value in span["attributes"].items():
        if key.startswith(prefix):
            index, _, field = key[len(prefix) :].partition(".message.")
            found.setdefault(int(index), {})[field] = value
    return [found[i] for i in sorted(found)]


@dataclass
class TracedRun:
    project: str
    groups: list[art.TrajectoryGroup]
    spans: list[dict[str, Any]]
    annotations: dict[str, dict[str, dict[str, Any]]]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def agent(backend: art.LocalBackend) -> art.TrainableModel:
    """A tiny-random model of this module's own: training it leaves the session's
    ``tiny_model`` at step 0 for the other tests."""
    return await register_tiny_model(backend, MODEL_NAME, MODEL_PROJECT)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def traced(
    phoenix: TracingServer,
    api: PhoenixApi,
    agent: art.TrainableModel,
    judge_server: StandInJudge,
    tmp_path_factory: pytest.TempPathFactory,
) -> TracedRun:
    """``traced_training_run`` traced to Phoenix, and what Phoenix shows of it once every
    span (4 rollouts of 4 spans, the train step) and annotation is in."""
    project = f"art-{uuid.uuid4().hex[:8]}"
    cache = tmp_path_factory.mktemp("phoenix-ruler")
    judge_server.reset()  # what the `judge` fixture does, for the module
    judge_server.reverse = False
    with pytest.MonkeyPatch.context() as env:
        env.setenv("ART_CORE_CACHE_DIR", str(cache / "cache"))
        for name in JUDGE_ENV_VARS:
            env.delenv(name, raising=False)
        tracing.enable("phoenix", endpoint=phoenix.url, phoenix={"project_name": project})
        try:
            groups = await traced_training_run(agent, judge_server.base_url, cache / "r.db")
            assert tracing.flush(60)
            stats = tracing.stats()["phoenix"]
        finally:
            tracing.disable()
    assert stats["failed"] == 0 and stats["annotations_failed"] == 0, stats
    # Sent synchronously (Phoenix confirmed each), none left to Phoenix's retry queue.
    assert stats["annotations_sent"] == 4 * len(SCORES), stats
    spans = wait_for(
        lambda: api.spans(project),
        lambda s: len(rollout_roots(s)) == 4 and len(s) >= 4 * 4 + 1,
        "4 rollouts of 4 spans and a train step",
    )
    ids = [s["context"]["span_id"] for s in rollout_roots(spans)]
    annotations = by_span(api.annotations(project, ids))
    return TracedRun(project, groups, spans, annotations)


@pytest.mark.slow
def test_phoenix_shows_each_rollout_as_an_agent_trace_with_llm_and_tool_spans_and_scores(
    traced: TracedRun, api: PhoenixApi
) -> None:
    trajectories = {t.id: t for g in traced.groups for t in g}
    spans = traced.spans
    roots = rollout_roots(spans)
    assert sorted(r["attributes"]["art.rollout.id"] for r in roots) == sorted(trajectories)
    assert len({r["context"]["trace_id"] for r in roots}) == 4
    sessions = {
        s["session_id"]: {t["trace_id"] for t in s["traces"]} for s in api.sessions(traced.project)
    }
    for root in roots:
        trajectory = trajectories[root["attributes"]["art.rollout.id"]]
        hint = float(trajectory.calls[0].messages[0]["content"].split()[-1])
        trace_id = root["context"]["trace_id"]
        # One trace per rollout: its root and nothing else but the root's children.
        in_trace = [s for s in spans if s["context"]["trace_id"] == trace_id]
        first, tool, second = children_of(spans, root)
        assert len(in_trace) == 4
        assert root["span_kind"] == "AGENT" and root["name"] == f"invoke_agent {MODEL_NAME}"
        session = attribute(root, "session.id")
        assert isinstance(session, str) and session
        assert trace_id in sessions[session]

        assert [first["span_kind"], tool["span_kind"], second["span_kind"]] == [
            "LLM",
            "TOOL",
            "LLM",
        ]
        for span, call in zip((first, second), trajectory.calls, strict=True):
            assert attribute(span, "llm.model_name") == MODEL_NAME
            assert attribute(span, "llm.token_count.prompt") == len(call.prompt_token_ids)
            assert attribute(span, "llm.token_count.completion") == len(call.completion_token_ids)
        asked = messages(first, "input")
        assert asked[0]["role"] == "user"
        assert asked[0]["content"] == f"What is the weather? score-hint: {hint}"
        (answer,) = messages(first, "output")
        assert answer["role"] == "assistant"
        call = trajectory.calls[0].response_message["tool_calls"][0]
        assert answer["tool_calls.0.tool_call.function.name"] == "get_weather"
        assert answer["tool_calls.0.tool_call.id"] == call["id"]
        city = json.loads(call["function"]["arguments"])["city"]
        assert attribute(tool, "tool.name") == "get_weather"
        assert json.loads(attribute(tool, "input.value")) == {"city": city}
        assert attribute(tool, "output.value") == weather(city)
        # The tool result went back to the model in the second call.
        assert any(m.get("role") == "tool" for m in messages(second, "input"))

        annotations = traced.annotations[root["context"]["span_id"]]
        assert set(annotations) == SCORES
        for name, annotation in annotations.items():
            assert annotation["annotator_kind"] == ("LLM" if name == "ruler_score" else "CODE")
            assert annotation["identifier"] == IDENTIFIER
            assert annotation["metadata"] == {"rollout_id": trajectory.id}
        assert annotations["reward"]["result"]["score"] == pytest.approx(trajectory.reward)
        assert annotations["reward"]["result"]["score"] == pytest.approx(hint)
        ruler = annotations["ruler_score"]["result"]
        assert ruler["score"] == pytest.approx(hint)
        assert "hint" in ruler["explanation"]
        assert annotations["independent_reward"]["result"]["score"] == 0.0
    # The train step: a trace of its own (a CHAIN span), not a rollout.
    (train,) = [s for s in spans if s["name"].startswith("train_step")]
    assert train["parent_id"] is None and train["span_kind"] == "CHAIN"


@pytest.mark.slow
async def test_rescoring_upserts_the_annotations_and_private_content_stays_out(
    phoenix: TracingServer,
    api: PhoenixApi,
    tiny_model: art.TrainableModel,
    judge: StandInJudge,
    tmp_path: Path,
) -> None:
    project = f"art-private-{uuid.uuid4().hex[:8]}"
    tracing.enable(
        "phoenix",
        endpoint=phoenix.url + "/v1/traces",  # a collector URL works as well as the base URL
        phoenix={"project_name": project},
        capture_content=False,
    )
    try:
        # Built outside gather: exported at once with reward 0, then scored by RULER: the
        # scores follow as updates of the same annotations.
        trajectories = [await tool_rollout(tiny_model, h) for h in (0.3, 0.7)]
        assert tracing.flush(30)
        await art.gather_trajectory_groups(
            [art.TrajectoryGroup(trajectories)],
            after_each=lambda g: ruler_score_group(
                g, "judge-1", judge_base_url=judge.base_url, cache_path=tmp_path / "r.sqlite"
            ),
            pbar_desc=None,
        )
        assert tracing.flush(30)
        stats = tracing.stats()["phoenix"]
    finally:
        tracing.disable()
    assert stats["annotations_failed"] == 0 and stats["annotations_queued"] == 0, stats
    spans = wait_for(
        lambda: api.spans(project),
        lambda s: len(rollout_roots(s)) == 2 and len(s) >= 2 * 4,
        "2 rollouts of 4 spans",
    )
    roots = {r["attributes"]["art.rollout.id"]: r for r in rollout_roots(spans)}
    annotations = by_span(
        api.annotations(project, [r["context"]["span_id"] for r in roots.values()])
    )
    for trajectory, hint in zip(trajectories, (0.3, 0.7), strict=True):
        scores = annotations[roots[trajectory.id]["context"]["span_id"]]
        # Upserted: one annotation per name (by_span fails on a duplicate), the latest value.
        assert set(scores) == SCORES
        assert scores["reward"]["result"]["score"] == pytest.approx(hint)
        assert scores["independent_reward"]["result"]["score"] == 0.0
        # capture_content=False: the judge's explanation stays here too.
        assert scores["ruler_score"]["result"]["explanation"] is None
    # No message, argument or result reached Phoenix: only names, kinds, usage and scores.
    shown = json.dumps(spans, ensure_ascii=False)
    for private in ("score-hint", "What is the weather", "°C"):
        assert private not in shown
    for span in spans:
        keys = set(span["attributes"])
        assert not {k for k in keys if k.startswith(("llm.input_messages", "llm.output_messages"))}
        shown_io = {k: span["attributes"].get(k) for k in ("input.value", "output.value")}
        if span["span_kind"] == "TOOL":  # arguments and result
            assert shown_io == {"input.value": None, "output.value": None}, shown_io
        for value in shown_io.values():  # elsewhere ids, the model, the reward: no messages
            shown_value = json.loads(value) if value is not None else {}
            assert isinstance(shown_value, dict), (span["name"], shown_io)
            assert not {"messages", "content", "choices"} & set(shown_value), shown_io
    kinds = sorted(s["span_kind"] for s in spans if s["parent_id"] is not None)
    assert kinds == ["LLM", "LLM", "LLM", "LLM", "TOOL", "TOOL"]
    assert all(
        attribute(s, "tool.name") == "get_weather" for s in spans if s["span_kind"] == "TOOL"
    )


# ---------------------------------------------------------------------------- Phoenix's UI
TIMEOUT_MS = 30_000  # each UI wait (Playwright polls; a slow machine renders late)


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where screenshots go: ``$ART_TRACING_SCREENSHOTS`` (the docs' images), else tmp_path."""
    folder = Path(os.environ.get("ART_TRACING_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.mark.slow
async def test_phoenix_ui_shows_a_rollout_with_its_tool_call_and_reward(
    traced: TracedRun, phoenix: TracingServer, api: PhoenixApi, shots: Path
) -> None:
    from browser_support import chromium
    from playwright.async_api import expect

    (project,) = [p for p in api.projects() if p["name"] == traced.project]
    roots = {r["context"]["trace_id"]: r for r in rollout_roots(traced.spans)}
    async with chromium() as browser:
        page = await browser.new_page(viewport={"width": 1600, "height": 1000})
        page.set_default_timeout(TIMEOUT_MS)
        # The project's span list; a rollout's root span opens its trace.
        await page.goto(f"{phoenix.url}/projects/{project['id']}")
        await page.get_by_text(f"invoke_agent {MODEL_NAME}").first.click()
        await page.wait_for_url("**/spans/*")
        trace_id = page.url.split("/spans/")[1].split("?")[0]
        assert trace_id in roots, page.url
        root = roots[trace_id]
        scores = traced.annotations[root["context"]["span_id"]]
        tree = page.locator(".span-node__heading")
        await expect(tree.filter(has_text="execute_tool get_weather")).to_have_count(
            1, timeout=TIMEOUT_MS
        )
        await expect(tree.filter(has_text=f"chat {MODEL_NAME}")).to_have_count(
            2, timeout=TIMEOUT_MS
        )
        await expect(tree.filter(has_text=f"invoke_agent {MODEL_NAME}")).to_have_count(
            1, timeout=TIMEOUT_MS
        )
        # The rollout's annotations on its node of the trace tree, as Phoenix rounds them.
        for name in ("reward", "ruler_score"):
            badge = page.locator(f'.span-annotations .annotation-summary-badge[title="{name}"]')
            await expect(badge).to_contain_text(
                f"{scores[name]['result']['score']:.2f}", timeout=TIMEOUT_MS
            )
        # The tool call: its span shows the result the agent got.
        city = json.loads(
            traced_call(traced, root)["function"]["arguments"]  # what the model asked for
        )["city"]
        await tree.filter(has_text="execute_tool get_weather").click()
        await expect(page.get_by_text(weather(city)).first).to_be_visible(timeout=TIMEOUT_MS)
        # Back on the rollout: its annotations with their values, then the picture.
        await tree.filter(has_text=f"invoke_agent {MODEL_NAME}").click()
        for name in ("reward", "ruler_score"):
            # (the span list behind the trace holds hidden chips of every rollout)
            chip = page.locator(
                f'button:has(.annotation-name-and-value [title="{name}"]) >> visible=true'
            )
            await expect(chip).to_be_visible(timeout=TIMEOUT_MS)
            await expect(chip).to_contain_text(
                f"{scores[name]['result']['score']:.2f}", timeout=TIMEOUT_MS
            )
        await expect(page.get_by_text("What is the weather? score-hint").first).to_be_visible(
            timeout=TIMEOUT_MS
        )
        await page.screenshot(path=str(shots / "tracing-phoenix.png"))


def traced_call(traced: TracedRun, root: dict[str, Any]) -> dict[str, Any]:
    """The tool call the first LLM call of ``root``'s rollout made."""
    trajectories = {t.id: t for g in traced.groups for t in g}
    trajectory = trajectories[root["attributes"]["art.rollout.id"]]
    return dict(trajectory.calls[0].response_message["tool_calls"][0])
