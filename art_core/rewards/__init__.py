"""Rewards for agent runs: RULER, group-relative scores from any OpenAI-compatible LLM judge.

The judge is a model name on any OpenAI-compatible server (``judge_base_url``), or a LiteLLM
id as in ART (``"openai/o3"``, ``"anthropic/claude-sonnet-4-5"``, ``"openrouter/..."``,
``"together_ai/..."``, ``"fireworks_ai/..."``, ``"groq/..."``, ``"deepseek/..."``,
``"gemini/..."``, ``"hosted_vllm/..."``, ``"azure/DEPLOYMENT"``): reached through that
provider's OpenAI-compatible endpoint with its usual key variable (the table is in
``art_core.rewards.endpoint``). ART's ``extra_litellm_params`` and ``debug`` are accepted.

Example:
    >>> from art_core.rewards import ruler_score_group
    >>> group = await ruler_score_group(group, "gpt-4.1", swallow_exceptions=True)  # needs a network service: a judge model, and a `group`  # doctest: +SKIP
    >>> group = await ruler_score_group(group, "anthropic/claude-sonnet-4-5")  # needs a network service: a judge model  # doctest: +SKIP
"""

from art_core.rewards.cache import RulerCache, cache_key, default_cache_path
from art_core.rewards.endpoint import PROVIDERS, JudgeEndpoint, JudgeModelLike, resolve_judge
from art_core.rewards.options import RulerOptions
from art_core.rewards.prompt import DEFAULT_RUBRIC, JudgePrompt, build_judge_prompt
from art_core.rewards.reply import RulerError, RulerReplyError, RulerScore, parse_reply
from art_core.rewards.ruler import (
    DEFAULT_JUDGE_MODEL,
    Judgement,
    apply_judgement,
    judge_group,
    judge_runs,
    ruler,
    ruler_score_group,
)

__all__ = [
    "DEFAULT_JUDGE_MODEL",
    "DEFAULT_RUBRIC",
    "PROVIDERS",
    "JudgeEndpoint",
    "JudgeModelLike",
    "JudgePrompt",
    "Judgement",
    "RulerCache",
    "RulerError",
    "RulerOptions",
    "RulerReplyError",
    "RulerScore",
    "apply_judgement",
    "build_judge_prompt",
    "cache_key",
    "default_cache_path",
    "judge_group",
    "judge_runs",
    "parse_reply",
    "resolve_judge",
    "ruler",
    "ruler_score_group",
]
