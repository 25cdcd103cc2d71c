"""Evals you can trust: a model scored at chosen checkpoint steps on a task set.

``evaluate`` (and ``art-core eval``) gives mean reward, solve rate and pass@k (the unbiased
estimator), each with a 95% bootstrap interval resampled by task, plus tokens and tool errors
per run, and writes them to the model's ``history.jsonl``; ``stats`` holds the statistics.

Example:
    >>> from art_core.evals import pass_at_k
    >>> round(pass_at_k(n=4, c=2, k=2), 4)  # 1 - C(2,2)/C(4,2) = 1 - 1/6
    0.8333
"""

from art_core.evals.evaluate import EvalReport, StepScore, evaluate, parse_steps
from art_core.evals.stats import (
    Estimate,
    TaskSummary,
    bootstrap_interval,
    estimate,
    pass_at_k,
    summarize,
)

__all__ = [
    "Estimate",
    "EvalReport",
    "StepScore",
    "TaskSummary",
    "bootstrap_interval",
    "estimate",
    "evaluate",
    "parse_steps",
    "pass_at_k",
    "summarize",
]
