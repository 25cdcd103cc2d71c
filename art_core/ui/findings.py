"""The run page's findings, read from ``history.jsonl``: the diagnoses of each step (why it
learned little, ``"split": "diagnoses"`` records) and the evaluations with their intervals
(``"split": "eval"`` records, written by ``art-core eval``).

The file is outside input (any process may have written it): a record that does not have the
expected shape is skipped and named in ``problems``, never shown half-read.
"""

from __future__ import annotations

import math
import re
from typing import Any

Record = dict[str, Any]

# The rows of one evaluation shown on the page: a metric and its interval's bounds.
_EVAL_METRIC = re.compile(r"^eval/(mean_reward|solve_rate|pass@\d{1,4})$")
_TEXT_LIMIT = 2000
# At most this many steps of diagnoses are sent (the latest ones): a page stays small.
MAX_DIAGNOSED_STEPS = 200


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _text(value: Any) -> str | None:
    return value[:_TEXT_LIMIT] if isinstance(value, str) else None


def run_diagnoses(records: list[Record]) -> tuple[list[dict[str, Any]], list[str]]:
    """The diagnoses by step (latest ``MAX_DIAGNOSED_STEPS`` steps), and the records skipped.

    Example:
        >>> record = {"step": 2, "split": "diagnoses", "diagnoses": [
        ...     {"code": "truncated", "finding": "8 of 8 runs cut", "setting": "raise max_tokens",
        ...      "share": 1.0, "threshold": 0.2, "unit": "rollouts"}]}
        >>> steps, problems = run_diagnoses([record])
        >>> steps[0]["step"], steps[0]["diagnoses"][0]["code"], problems
        (2, 'truncated', [])
    """
    steps: list[dict[str, Any]] = []
    problems: list[str] = []
    for number, record in enumerate(records, start=1):
        if record.get("split") != "diagnoses":
            continue
        step = record.get("step")
        listed = record.get("diagnoses")
        if not isinstance(step, int) or isinstance(step, bool) or not isinstance(listed, list):
            problems.append(f"history record {number}: a diagnoses record without step or list")
            continue
        diagnoses = []
        for item in listed:
            if not isinstance(item, dict):
                continue
            fields = {k: _text(item.get(k)) for k in ("code", "finding", "setting", "unit")}
            if fields["code"] is None or fields["finding"] is None or fields["setting"] is None:
                problems.append(
                    f"history record {number}: a diagnosis without code/finding/setting"
                )
                continue
            diagnoses.append(
                {
                    **fields,
                    "share": _number(item.get("share")),
                    "threshold": _number(item.get("threshold")),
                }
            )
        if diagnoses:
            steps.append({"step": step, "diagnoses": diagnoses})
    return steps[-MAX_DIAGNOSED_STEPS:], problems


def run_evals(records: list[Record]) -> tuple[list[dict[str, Any]], list[str]]:
    """Each evaluation record: step, label, split, counts and every metric with its interval.

    Example:
        >>> record = {"step": 3, "split": "eval", "eval_label": "best", "eval_split": "test",
        ...           "tasks": 20, "runs": 80, "eval/mean_reward": 0.41,
        ...           "eval/mean_reward_low": 0.30, "eval/mean_reward_high": 0.53}
        >>> evals, problems = run_evals([record])
        >>> evals[0]["metrics"], problems
        ([{'name': 'mean_reward', 'value': 0.41, 'low': 0.3, 'high': 0.53}], [])
    """
    evals: list[dict[str, Any]] = []
    problems: list[str] = []
    for number, record in enumerate(records, start=1):
        if record.get("split") != "eval":
            continue
        step = record.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            problems.append(f"history record {number}: an eval record without a step")
            continue
        metrics = []
        for key, value in record.items():
            match = _EVAL_METRIC.match(key)
            if match is None or _number(value) is None:
                continue
            metrics.append(
                {
                    "name": match.group(1),
                    "value": _number(value),
                    "low": _number(record.get(f"{key}_low")),
                    "high": _number(record.get(f"{key}_high")),
                }
            )
        evals.append(
            {
                "step": step,
                "label": _text(record.get("eval_label")),
                "split": _text(record.get("eval_split")),
                "tasks": _number(record.get("tasks")),
                "runs": _number(record.get("runs")),
                "tokens_per_run": _number(record.get("eval/tokens_per_run")),
                "tool_errors_per_run": _number(record.get("eval/tool_errors_per_run")),
                "metrics": metrics,
            }
        )
    return evals, problems
