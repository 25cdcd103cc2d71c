"""Rewards for agent runs: RULER, group-relative scores from any OpenAI-compatible LLM judge.

Example:
    >>> from art_core.rewards import ruler_score_group
    >>> group = await ruler_score_group(group, "gpt-4.1", swallow_exceptions=True)  # doctest: +SKIP
"""

from art_core.rewards.cache import RulerCache, cache_key, default_cache_path
from art_core.rewards.prompt import DEFAULT_RUBRIC, JudgePrompt, build_judge_prompt
from art_core.rewards.reply import RulerError, RulerReplyError, RulerScore, parse_reply
from art_core.rewards.ruler import (
    JudgeEndpoint,
    Judgement,
    JudgeModelLike,
    apply_judgement,
    judge_runs,
    resolve_judge,
    ruler,
    ruler_score_group,
)

__all__ = [
    "DEFAULT_RUBRIC",
    "JudgeEndpoint",
    "JudgeModelLike",
    "JudgePrompt",
    "Judgement",
    "RulerCache",
    "RulerError",
    "RulerReplyError",
    "RulerScore",
    "apply_judgement",
    "build_judge_prompt",
    "cache_key",
    "default_cache_path",
    "judge_runs",
    "parse_reply",
    "resolve_judge",
    "ruler",
    "ruler_score_group",
]
