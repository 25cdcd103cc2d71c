"""``RulerOptions``: every RULER option in one validated object, built once per call.

``ruler(...)`` and ``ruler_score_group(...)`` keep their keyword arguments (ART's spelling
plus ours) and turn them into one of these; everything below them takes the object.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from art_core.rewards.endpoint import JudgeEndpoint, JudgeModelLike, LitellmParams, resolve_judge
from art_core.rewards.prompt import DEFAULT_MAX_TOOL_RESULT_CHARS, DEFAULT_RUBRIC

DEFAULT_TIMEOUT_S = 300.0  # reasoning judges scoring 16 long runs can take minutes


@dataclass(frozen=True)
class RulerOptions:
    """How to reach the judge and what to ask it. Invalid values raise ValueError at once.

    ``judge_base_url`` / ``judge_api_key``: an OpenAI-compatible server (else the provider of a
    LiteLLM id, else ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``); ``rubric``: the grading
    standard; ``max_tool_result_chars``: cap on each tool result shown (0 = none);
    ``request_timeout``: seconds per request (None: ``extra_litellm_params['timeout']``, else
    300); ``extra_params``: fields added to the request body as given (they win over
    ``extra_litellm_params``); ``extra_litellm_params``: ART's LiteLLM parameters (see
    ``art_core.rewards.endpoint``); ``structured_output=False`` skips ``response_format``;
    ``cache`` / ``cache_path``: the verdict cache; ``debug``: print the judge's prompt and reply.

    Example:
        >>> RulerOptions(extra_litellm_params={"temperature": 0, "timeout": 60}).body_params
        {'temperature': 0}
        >>> RulerOptions(rubric=" ")
        Traceback (most recent call last):
        ...
        ValueError: rubric must be a non-empty string
    """

    judge_base_url: str | None = None
    judge_api_key: str | None = None
    rubric: str = DEFAULT_RUBRIC
    max_tool_result_chars: int = DEFAULT_MAX_TOOL_RESULT_CHARS
    request_timeout: float | None = None
    extra_params: Mapping[str, Any] | None = None
    extra_litellm_params: Mapping[str, Any] | None = None
    structured_output: bool = True
    cache: bool = True
    cache_path: str | os.PathLike[str] | None = None
    debug: bool = False
    litellm: LitellmParams = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.rubric, str) or not self.rubric.strip():
            raise ValueError("rubric must be a non-empty string")
        chars = self.max_tool_result_chars
        if isinstance(chars, bool) or not isinstance(chars, int) or chars < 0:
            raise ValueError(f"max_tool_result_chars must be an int >= 0, got {chars!r}")
        timeout = self.request_timeout
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            raise ValueError(
                f"request_timeout must be a positive number of seconds, got {timeout!r}"
            )
        if self.extra_params is not None and not isinstance(self.extra_params, Mapping):
            raise ValueError(f"extra_params must be a dict, got {type(self.extra_params).__name__}")
        for name in ("judge_base_url", "judge_api_key"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{name} must be a string, got {value!r}")
        object.__setattr__(self, "litellm", LitellmParams.split(self.extra_litellm_params))

    @property
    def timeout_s(self) -> float:
        """Seconds per judge request."""
        if self.request_timeout is not None:
            return float(self.request_timeout)
        return self.litellm.timeout if self.litellm.timeout is not None else DEFAULT_TIMEOUT_S

    @property
    def body_params(self) -> dict[str, Any]:
        """Fields added to the judge request body: LiteLLM's, then ``extra_params`` over them."""
        return {**self.litellm.body, **dict(self.extra_params or {})}

    def endpoint(self, judge_model: str | JudgeModelLike) -> JudgeEndpoint:
        """Where ``judge_model`` is served, with these options (ValueError if unknown)."""
        return resolve_judge(
            judge_model,
            self.judge_base_url,
            self.judge_api_key,
            extra_litellm_params=self.litellm,
        )
