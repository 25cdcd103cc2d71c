"""Export of the SDK's traces to OpenAI stays off however the provider is made, also inside a
trace that was already open. Checked against a local stand-in for OpenAI's trace endpoint."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from agents import trace
from agents.tracing import set_trace_processors
from agents.tracing.processors import default_exporter, default_processor
from art_openai_agents import ArtModelProvider, configure_tracing

import art_core as art


class IngestStandIn:
    """An HTTP server that accepts POSTs like OpenAI's trace ingest and keeps their items."""

    def __init__(self) -> None:
        self.items: list[dict[str, object]] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                stand_in.items += json.loads(body).get("data", [])
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces/ingest"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def traces(self) -> list[object]:
        return [item.get("workflow_name") for item in self.items if item.get("object") == "trace"]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def ingest() -> Iterator[IngestStandIn]:
    """The SDK's own exporter pointed at the stand-in, registered as on a fresh import."""
    exporter = default_exporter()
    saved = exporter.endpoint, exporter._api_key
    stand_in = IngestStandIn()
    exporter.endpoint = stand_in.url
    exporter.set_api_key("sk-stand-in")
    default_processor().force_flush()  # nothing left over from earlier tests
    set_trace_processors([default_processor()])
    try:
        yield stand_in
    finally:
        configure_tracing()
        exporter.endpoint, exporter._api_key = saved
        stand_in.close()


@pytest.fixture
def model() -> art.TrainableModel:
    return art.TrainableModel(name="trace-export", project="tests", base_model="tiny-random")


def test_the_stand_in_receives_what_the_sdk_exports(
    ingest: IngestStandIn, model: art.TrainableModel
) -> None:
    # Control: with the processors left alone, the SDK exports the open trace.
    with trace("user-workflow"):
        ArtModelProvider(model, configure_tracing=False)
    default_processor().force_flush()
    assert ingest.traces() == ["user-workflow"]


def test_a_provider_made_inside_an_open_trace_exports_nothing(
    ingest: IngestStandIn, model: art.TrainableModel
) -> None:
    with trace("user-workflow"):
        ArtModelProvider(model)
        with trace("nested-after-the-provider"):
            pass
    default_processor().force_flush()  # what the SDK's worker thread would send
    assert ingest.items == []


def test_export_to_openai_when_asked(ingest: IngestStandIn, model: art.TrainableModel) -> None:
    with trace("user-workflow"):
        ArtModelProvider(model, export_traces_to_openai=True)
    with trace("asked-for"):
        pass
    default_processor().force_flush()
    assert ingest.traces() == ["user-workflow", "asked-for"]
