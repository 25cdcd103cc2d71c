"""A programmatic reward for scenarios with a known answer (no judge needed)."""

from __future__ import annotations

import json
import re
from typing import Any

import art_core as art
from art_mcp.scenarios import Scenario


def contains_answer(text: str | None, answer: str) -> bool:
    """Whether ``text`` states ``answer`` as a whole word/number (case-insensitive).

    Example:
        >>> contains_answer("It costs 42 coins.", "42"), contains_answer("It costs 420.", "42")
        (True, False)
    """
    if not text or not answer.strip():
        return False
    pattern = r"(?<![\w.])" + re.escape(answer.strip().lower()) + r"(?![\w]|\.\d)"
    return re.search(pattern, text.lower()) is not None


def tool_calls(trajectory: art.Trajectory) -> list[tuple[str, dict[str, Any]]]:
    """Every tool call the model made, in order, as ``(name, arguments)``.

    Example:
        >>> tool_calls(art.Trajectory())
        []
    """
    out: list[tuple[str, dict[str, Any]]] = []
    for call in trajectory.calls:
        for tool_call in call.response_message.get("tool_calls") or []:
            function = tool_call.get("function") or {}
            try:
                arguments = json.loads(function.get("arguments") or "{}")
            except json.JSONDecodeError:
                arguments = {}
            out.append((function.get("name", ""), arguments if isinstance(arguments, dict) else {}))
    return out


def tool_results(trajectory: art.Trajectory) -> list[str]:
    """The texts of the tool messages the model read during the run.

    Example:
        >>> tool_results(art.Trajectory())
        []
    """
    return [str(m.get("content") or "") for m in trajectory.messages() if m.get("role") == "tool"]


def answer_reward(scenario: Scenario, trajectory: art.Trajectory) -> float:
    """Score a run against ``scenario.answer``, with partial credit that leads to the answer.

    1.0: the final answer states the expected answer. Otherwise the sum of: 0.3 if a tool
    result held the answer (0.1 if tools only succeeded), and 0.2 if the run gave a final
    answer at all. So looking the answer up and reporting it wrongly (0.5) beats looking it up
    and never finishing (0.3), which beats guessing without a tool (0.2): a policy cannot
    settle on a safe partial score that never answers.

    Example:
        >>> run = art.Trajectory(metadata={"final_answer": "A pear costs 17 coins."})
        >>> answer_reward(Scenario(task="Price of a pear?", answer="17"), run)
        1.0
    """
    if scenario.answer is None:
        raise ValueError(f"scenario {scenario.id} has no expected answer to check against")
    final = trajectory.metadata.get("final_answer")
    if contains_answer(final, scenario.answer):
        return 1.0
    successful = [
        r for r in tool_results(trajectory) if not r.lower().startswith(("error", "tool "))
    ]
    score = 0.0
    if any(contains_answer(r, scenario.answer) for r in successful):
        score += 0.3
    elif successful:
        score += 0.1
    if final is not None and str(final).strip():
        score += 0.2
    return score
