"""Shared helpers of the art-mcp tests: the test servers, forced settings, a stand-in generator.

The fixtures are in ``conftest.py`` (the gateway itself comes from art_core's pytest plugin).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from art_mcp import RolloutSettings

import art_core as art

HERE = Path(__file__).resolve().parent
FAULTY_SCRIPT = HERE / "mcp_faulty_server.py"
FAULTY_STDIO = f"python {FAULTY_SCRIPT}"
FAULTY_HTTP = f"python {FAULTY_SCRIPT} --http"
REPO = HERE.parents[2]
SHOP_SCRIPT = REPO / "examples" / "mcp" / "shop_server.py"


def forced(tool: str, **overrides: Any) -> RolloutSettings:
    """Settings that make tiny-random call exactly ``tool`` every turn (grammar-forced, one
    call per turn, enum-bounded arguments), running ``max_turns`` turns; every call runs (no
    repeated-call notice: the same enum value twice is likely)."""
    values: dict[str, Any] = {
        "repeated_call_notice": False,
        "tools": [tool],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "complete_task": False,
        "max_turns": 2,
        "max_tokens": 48,
    }
    values.update(overrides)
    return RolloutSettings(**values)


def tool_messages(trajectory: art.Trajectory) -> list[str]:
    return [m["content"] for m in trajectory.messages() if m.get("role") == "tool"]


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
