"""Shared helpers of the art-mcp tests: the test servers, model fixtures, a stand-in generator.

Imported by name from the test modules (no conftest.py: the core's tests/ has its own).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

os.environ.setdefault(
    "ART_CORE_MODELS_DIR", str(Path(tempfile.gettempdir()) / "art-core-test-models")
)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
from art_mcp import HttpServer, RolloutSettings, spawn_http_server

import art_core as art

HERE = Path(__file__).resolve().parent
FAULTY_SCRIPT = HERE / "mcp_faulty_server.py"
FAULTY_STDIO = f"python {FAULTY_SCRIPT}"
FAULTY_HTTP = f"python {FAULTY_SCRIPT} --http"
REPO = HERE.parents[2]
SHOP_SCRIPT = REPO / "examples" / "mcp" / "shop_server.py"


def forced(tool: str, **overrides: Any) -> RolloutSettings:
    """Settings that make tiny-random call exactly ``tool`` every turn (grammar-forced, one
    call per turn, enum-bounded arguments), running ``max_turns`` turns."""
    values: dict[str, Any] = {
        "tools": [tool],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "complete_task": False,
        "max_turns": 2,
        "max_tokens": 48,
    }
    values.update(overrides)
    return RolloutSettings(**values)


@pytest.fixture(scope="module")
async def mcp_backend(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[art.LocalBackend]:
    backend = art.LocalBackend(path=tmp_path_factory.mktemp("art-mcp"))
    yield backend
    await backend.close()


@pytest.fixture(scope="module")
async def mcp_model(mcp_backend: art.LocalBackend) -> art.TrainableModel:
    model = art.TrainableModel(name="mcp-tiny", project="mcp-tests", base_model="tiny-random")
    await model.register(mcp_backend)
    return model


@pytest.fixture(scope="module")
async def faulty_http() -> AsyncIterator[HttpServer]:
    async with spawn_http_server(FAULTY_HTTP) as server:
        yield server


def tool_messages(trajectory: art.Trajectory) -> list[str]:
    return [m["content"] for m in trajectory.messages() if m.get("role") == "tool"]


def assert_token_exact(trajectory: art.Trajectory, tokenizer: Any) -> None:
    """Every call's ids decode to its text, and each turn's prompt extends the previous
    turn's prompt + sampled ids exactly."""
    for call in trajectory.calls:
        assert tokenizer.decode(call.completion_token_ids, skip_special_tokens=False) == (
            call.completion_text
        )
        assert len(call.logprobs) == len(call.completion_token_ids)
    for before, after in zip(trajectory.calls, trajectory.calls[1:], strict=False):
        prefix = before.prompt_token_ids + before.completion_token_ids
        assert after.prompt_token_ids[: len(prefix)] == prefix


# ----------------------------------------------------------------------------- generator
TOOL_NAME_RE = re.compile(r"^- (\w+): ", re.MULTILINE)
COUNT_RE = re.compile(r"Write (\d+) new, distinct tasks")


def generator_reply(duplicates: bool = False) -> Callable[[dict[str, Any]], str]:
    """A stand-in generator behaviour: tasks built from the tools named in the prompt, as many
    as asked, numbered from a counter so later requests bring new ones (or, with
    ``duplicates``, half of each reply repeats an earlier task)."""
    counter = {"next": 0}

    def reply(body: dict[str, Any]) -> str:
        prompt = body["messages"][-1]["content"]
        tools = TOOL_NAME_RE.findall(prompt) or ["tool"]
        wanted = int(COUNT_RE.search(prompt).group(1))  # type: ignore[union-attr]
        items = []
        for i in range(wanted):
            n = counter["next"]
            if duplicates and i % 2 == 1:
                n = 0  # the same task as the first one ever written
            else:
                counter["next"] += 1
            tool = tools[n % len(tools)]
            items.append(
                {"task": f"Use {tool} to answer question number {n}.", "difficulty": 1 + n % 5}
            )
        return json.dumps({"scenarios": items})

    return reply
