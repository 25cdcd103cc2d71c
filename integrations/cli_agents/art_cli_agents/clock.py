"""A fixed wall clock for an agent's runs, so that seeded runs replay exactly.

Agents write today's date into their prompts (Claude Code's ``currentDate`` reminder,
opencode's environment block, Codex's ``<current_date>``). With a rollout seed
(``art.RolloutSampling``) a run replays token for token only while its prompts do: the next
day they differ, the model's logits with them, and the seeded draws pick other tokens. A run
whose clock starts at a fixed instant sees the same date every day.

The clock is libfaketime's (Debian's ``faketime`` package), preloaded into the agent: time
starts at the given instant and runs on from there (``FAKETIME="@..."``; monotonic clocks,
which timeouts use, stay real). It works for dynamically linked programs, such as Claude Code
and opencode (Bun executables) and Node; Codex's native binary is static and keeps the real
clock (its ``include_environment_context = false`` leaves the date out of its prompt). The
preload reaches the agent's command only, never the sandbox's launcher nor the check
(``PRELOAD_VARIABLE``).
"""

from __future__ import annotations

import dataclasses
import os
from datetime import datetime
from pathlib import Path

from art_cli_agents.agents import CLIAgent
from art_cli_agents.sandbox import PRELOAD_VARIABLE

# Where Debian, Ubuntu and Fedora put it; ``$ART_FAKETIME_LIB`` names another.
LIBFAKETIME_PATHS = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/lib64/faketime/libfaketime.so.1",
)


def libfaketime() -> str | None:
    """The path of libfaketime here, or None when it is not installed.

    Example:
        >>> libfaketime() is None or libfaketime().endswith(".so.1")
        True
    """
    given = os.environ.get("ART_FAKETIME_LIB")
    candidates = (given,) if given else LIBFAKETIME_PATHS
    return next((path for path in candidates if path and Path(path).is_file()), None)


def fixed_clock(agent: CLIAgent, start: datetime | str = "2026-01-01 09:00:00") -> CLIAgent:
    """``agent`` with its wall clock starting at ``start`` in every run (see the module).
    ``RuntimeError`` when libfaketime is not installed (``apt install faketime``).

    Example:
        >>> from art_cli_agents.agents import opencode
        >>> fixed_clock(opencode(), "2026-01-01 09:00:00").env["FAKETIME"]  # needs an install: libfaketime (apt; CI installs it in the background)  # doctest: +SKIP
        '@2026-01-01 09:00:00'
    """
    library = libfaketime()
    if library is None:
        raise RuntimeError(
            "a fixed clock needs libfaketime (Debian's `faketime` package: apt install "
            "faketime), or $ART_FAKETIME_LIB naming it"
        )
    instant = start if isinstance(start, datetime) else datetime.fromisoformat(start)
    clock = {
        PRELOAD_VARIABLE: library,
        "FAKETIME": "@" + instant.strftime("%Y-%m-%d %H:%M:%S"),
        # Timers and timeouts read the monotonic clock: it stays real.
        "DONT_FAKE_MONOTONIC": "1",
    }
    return dataclasses.replace(agent, env={**agent.env, **clock})
