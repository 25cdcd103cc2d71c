"""RULER: score the runs of one group relative to each other with any OpenAI-compatible judge.

One judge request per group (never one per run): the runs are shown side by side, so the
judge can rank them, and GRPO only needs scores that are right *relative to each other*.
A malformed reply is retried once, then reported as a :class:`RulerError` naming what was
wrong; a validated verdict is cached on disk so re-scoring the same group is free.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from art_core.rewards.cache import RulerCache, cache_key
from art_core.rewards.endpoint import JudgeEndpoint, JudgeModelLike, resolve_judge
from art_core.rewards.options import DEFAULT_TIMEOUT_S, RulerOptions
from art_core.rewards.prompt import (
    DEFAULT_MAX_TOOL_RESULT_CHARS,
    DEFAULT_RUBRIC,
    JudgePrompt,
    Message,
    build_judge_prompt,
    unique_tools,
)
from art_core.rewards.reply import (
    RulerError,
    RulerReplyError,
    RulerScore,
    parse_reply,
    response_format,
)
from art_core.trajectories import Trajectory, TrajectoryGroup, require_finished

if TYPE_CHECKING:
    from openai import AsyncOpenAI
    from openai.types.chat import ChatCompletion

__all__ = [
    "DEFAULT_JUDGE_MODEL",
    "DEFAULT_TIMEOUT_S",
    "JudgeEndpoint",
    "JudgeModelLike",
    "Judgement",
    "RulerOptions",
    "apply_judgement",
    "judge_group",
    "judge_runs",
    "resolve_judge",
    "ruler",
    "ruler_score_group",
]

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 2  # the first request and exactly one retry
# ART's default judge (a LiteLLM id: OpenAI's o3, key from OPENAI_API_KEY).
DEFAULT_JUDGE_MODEL = "openai/o3"
# Errors a retry cannot fix: bad key, no access, unknown model.
_FATAL_STATUS = {401, 403, 404}


@dataclass(frozen=True)
class Judgement:
    """The outcome of judging one group: a score per input run plus what it cost.

    ``judge_calls`` counts HTTP requests sent (0 when served from the cache, 2 after a retry);
    token counts are the judge's reported usage summed over those requests.
    """

    scores: list[RulerScore]
    judge_model: str
    judge_calls: int
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    cache_hit: bool
    unique_runs: int
    truncated_tool_results: int


def _debug_print(title: str, text: str) -> None:
    # debug=True is ART's switch for reading the judge's reasoning on the console.
    print(f"[RULER] {title}:\n{text}", flush=True)


def _pretty(content: str | None) -> str:
    try:
        return json.dumps(json.loads(content or ""), indent=2, ensure_ascii=False)
    except ValueError:
        return content or "(empty reply)"


def _scores_from_completion(
    completion: ChatCompletion, run_ids: Sequence[str]
) -> dict[str, RulerScore]:
    if not completion.choices:
        raise RulerReplyError("reply has no choices")
    choice = completion.choices[0]
    message = choice.message
    if not message.content and getattr(message, "refusal", None):
        raise RulerReplyError(f"judge refused: {message.refusal}")
    try:
        return parse_reply(message.content, run_ids)
    except RulerReplyError as exc:
        if choice.finish_reason == "length":
            raise RulerReplyError(f"{exc} (the reply was cut off at the token limit)") from exc
        raise


@dataclass
class _Calls:
    count: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0


async def _request(
    client: AsyncOpenAI,
    endpoint: JudgeEndpoint,
    prompt: JudgePrompt,
    *,
    structured_output: bool,
    extra_params: Mapping[str, Any],
    calls: _Calls,
    debug: bool = False,
) -> dict[str, RulerScore]:
    """Ask the judge, retrying once on anything a retry might fix; raise RulerError after."""
    import openai

    reasons: list[str] = []
    use_schema = structured_output
    for attempt in range(1, MAX_ATTEMPTS + 1):
        kwargs: dict[str, Any] = {}
        if use_schema:
            kwargs["response_format"] = response_format(prompt.run_ids)
        if extra_params:
            # extra_body passes any judge parameter through (temperature, max_tokens, vLLM's
            # chat_template_kwargs...) without the client's typed signature rejecting it.
            kwargs["extra_body"] = dict(extra_params)
        started = time.perf_counter()
        calls.count += 1
        try:
            completion = await client.chat.completions.create(
                model=endpoint.model, messages=cast(Any, prompt.messages), **kwargs
            )
        except openai.APITimeoutError:
            reason = f"no reply within {client.timeout} s (timeout)"
        except openai.APIConnectionError as exc:
            reason = f"could not reach the judge at {client.base_url}: {exc}"
        except openai.APIStatusError as exc:
            reason = f"HTTP {exc.status_code} from the judge: {exc.message}"
            if exc.status_code in _FATAL_STATUS:
                raise RulerError(
                    f"RULER judge {endpoint.model!r} at {client.base_url} rejected the request "
                    f"({reason}); not retrying",
                    [f"attempt {attempt}: {reason}"],
                ) from exc
            if exc.status_code in (400, 422) and use_schema:
                # Judges without structured-output support reject response_format; the
                # prompt spells out the JSON shape, so ask again without it.
                use_schema = False
                reason += " (retrying without response_format)"
        else:
            if completion.usage is not None:
                calls.prompt_tokens += completion.usage.prompt_tokens or 0
                calls.completion_tokens += completion.usage.completion_tokens or 0
            if debug and completion.choices:
                _debug_print(
                    f"judge reply (attempt {attempt})",
                    _pretty(completion.choices[0].message.content),
                )
            try:
                return _scores_from_completion(completion, prompt.run_ids)
            except RulerReplyError as exc:
                reason = f"malformed reply: {exc}"
        finally:
            calls.latency_s += time.perf_counter() - started
        reasons.append(f"attempt {attempt}: {reason}")
        logger.info("RULER judge %s, %s", endpoint.model, reasons[-1])
    raise RulerError(
        f"RULER judge {endpoint.model!r} gave no valid scores after {MAX_ATTEMPTS} attempts: "
        + "; ".join(reasons),
        reasons,
    )


async def judge_runs(
    message_lists: Sequence[Sequence[Message]],
    judge_model: str | JudgeModelLike = DEFAULT_JUDGE_MODEL,
    options: RulerOptions | None = None,
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> Judgement:
    """Judge a group of runs in one request and report the scores with their cost.

    This is :func:`ruler` plus the bookkeeping (calls, tokens, latency, cache hit).

    Example:
        >>> options = RulerOptions(judge_base_url="http://127.0.0.1:8000/v1")
        >>> j = await judge_runs(runs, "qwen3", options)  # needs a network service: a judge model at that address, and `runs`  # doctest: +SKIP
        >>> j.judge_calls, [s.score for s in j.scores]  # needs a network service: a judge model  # doctest: +SKIP
        (1, [0.9, 0.2])
    """
    options = options or RulerOptions()
    endpoint = options.endpoint(judge_model)
    if options.litellm.ignored:
        logger.debug("RULER ignores extra_litellm_params %s", ", ".join(options.litellm.ignored))
    prompt = build_judge_prompt(
        message_lists,
        rubric=options.rubric,
        tools=tools,
        max_tool_result_chars=options.max_tool_result_chars,
    )
    extra = options.body_params
    store = RulerCache(options.cache_path) if options.cache else None
    key = _judge_cache_key(endpoint.model, options, prompt)
    if options.debug:
        _debug_print(
            f"judge prompt for {endpoint.model}",
            "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in prompt.messages),
        )

    by_id = None if store is None else await _cached_verdicts(store, key, prompt, options.debug)
    calls = _Calls()
    if by_id is None:
        async with endpoint.client(options.timeout_s) as client:
            by_id = await _request(
                client,
                endpoint,
                prompt,
                structured_output=options.structured_output,
                extra_params=extra,
                calls=calls,
                debug=options.debug,
            )
        if store is not None:
            await store.put(
                key, endpoint.model, {"scores": [s.model_dump() for s in by_id.values()]}
            )

    return Judgement(
        scores=_scores_in_input_order(prompt, by_id),
        judge_model=endpoint.model,
        judge_calls=calls.count,
        prompt_tokens=calls.prompt_tokens,
        completion_tokens=calls.completion_tokens,
        latency_s=calls.latency_s,
        cache_hit=calls.count == 0,
        unique_runs=len(prompt.run_ids),
        truncated_tool_results=prompt.truncated_tool_results,
    )


def _judge_cache_key(judge_model: str, options: RulerOptions, prompt: JudgePrompt) -> str:
    """The cache key of a judge request: the model, the rubric and what is sent."""
    return cache_key(
        judge_model=judge_model,
        rubric=options.rubric,
        request={
            "messages": prompt.messages,
            "response_format": (
                response_format(prompt.run_ids) if options.structured_output else None
            ),
            "extra_params": options.body_params,
        },
    )


async def _cached_verdicts(
    store: RulerCache, key: str, prompt: JudgePrompt, debug: bool
) -> dict[str, RulerScore] | None:
    """The cached verdicts for ``key`` by run id, or None (no entry, or an invalid one)."""
    cached = await store.get(key)
    if cached is None:
        return None
    try:
        # Re-validate: the file is outside our control and may be corrupt or edited.
        by_id = parse_reply(json.dumps(cached), prompt.run_ids)
    except RulerReplyError as exc:
        logger.warning("ignoring an invalid RULER cache entry: %s", exc)
        return None
    if debug:
        _debug_print("judge reply (from the cache)", _pretty(json.dumps(cached)))
    return by_id


def _scores_in_input_order(prompt: JudgePrompt, by_id: dict[str, RulerScore]) -> list[RulerScore]:
    """One score per input run (duplicates share their unique run's verdict), ids 1, 2, ..."""
    scores = []
    for position, run in enumerate(prompt.run_of_input):
        verdict = by_id[prompt.run_ids[run]]
        scores.append(
            RulerScore(
                trajectory_id=str(position + 1),
                score=verdict.score,
                explanation=verdict.explanation,
            )
        )
    return scores


async def ruler(
    message_lists: Sequence[Sequence[Message]],
    judge_model: str | JudgeModelLike = DEFAULT_JUDGE_MODEL,
    extra_litellm_params: Mapping[str, Any] | None = None,
    rubric: str = DEFAULT_RUBRIC,
    *,
    judge_base_url: str | None = None,
    judge_api_key: str | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    max_tool_result_chars: int = DEFAULT_MAX_TOOL_RESULT_CHARS,
    request_timeout: float | None = None,
    extra_params: Mapping[str, Any] | None = None,
    structured_output: bool = True,
    cache: bool = True,
    cache_path: str | os.PathLike[str] | None = None,
    debug: bool = False,
) -> list[RulerScore]:
    """Score runs (OpenAI message lists) relative to each other with one judge request.

    Returns one :class:`RulerScore` per input, in input order, ``trajectory_id`` being the
    1-based position. Identical runs are judged once and share the score. Raises
    :class:`RulerError` when the judge fails twice. The arguments are ART's (``judge_model``,
    ``extra_litellm_params``, ``rubric``, ``debug``, in ART's order) plus ours; see
    :func:`ruler_score_group`.

    Example:
        >>> base = [{"role": "user", "content": "Count to 3."}]
        >>> scores = await ruler(  # needs a network service: a judge model at that address  # doctest: +SKIP
        ...     [[*base, {"role": "assistant", "content": "1, 2, 3"}],
        ...      [*base, {"role": "assistant", "content": "1, 2"}]],
        ...     "gpt-4.1", judge_base_url="http://127.0.0.1:8000/v1")
        >>> [s.score for s in scores]  # needs a network service: a judge model  # doctest: +SKIP
        [1.0, 0.3]
    """
    options = RulerOptions(
        judge_base_url=judge_base_url,
        judge_api_key=judge_api_key,
        rubric=rubric,
        max_tool_result_chars=max_tool_result_chars,
        request_timeout=request_timeout,
        extra_params=extra_params,
        extra_litellm_params=extra_litellm_params,
        structured_output=structured_output,
        cache=cache,
        cache_path=cache_path,
        debug=debug,
    )
    judgement = await judge_runs(message_lists, judge_model, options, tools=tools)
    return judgement.scores


def _tools_of(trajectory: Trajectory) -> list[dict[str, Any]] | None:
    if trajectory.tools is not None:
        return trajectory.tools
    return trajectory.calls[-1].tools if trajectory.calls else None


def apply_judgement(group: TrajectoryGroup, judgement: Judgement) -> None:
    """Write a judgement into a group: rewards, per-run metrics and logs, group metrics.

    Per trajectory: ``reward`` = the score, ``metrics["ruler_score"]``,
    ``metrics["independent_reward"]`` (the reward before the first RULER scoring; re-scoring
    keeps it), ``metadata["ruler"]`` (judge model, score, explanation) and a log line with
    the explanation. Per group (the judge cost is per group,
    so it is not repeated on each run): ``ruler_judge_calls``, ``ruler_prompt_tokens``,
    ``ruler_completion_tokens``, ``ruler_judge_latency_s``, ``ruler_cache_hit``,
    ``ruler_unique_runs``, ``ruler_truncated_tool_results``.
    """
    for trajectory, verdict in zip(group.trajectories, judgement.scores, strict=True):
        already_scored = "ruler_score" in trajectory.metrics
        if not (already_scored and "independent_reward" in trajectory.metrics):
            trajectory.metrics["independent_reward"] = trajectory.reward
        trajectory.metrics["ruler_score"] = verdict.score
        trajectory.reward = verdict.score
        trajectory.metadata["ruler"] = {
            "judge_model": judgement.judge_model,
            "score": verdict.score,
            "explanation": verdict.explanation,
        }
        trajectory.log(
            f"RULER ({judgement.judge_model}) score {verdict.score:.3f}: {verdict.explanation}"
        )
    group.metrics.update(
        {
            "ruler_judge_calls": judgement.judge_calls,
            "ruler_prompt_tokens": judgement.prompt_tokens,
            "ruler_completion_tokens": judgement.completion_tokens,
            "ruler_judge_latency_s": round(judgement.latency_s, 6),
            "ruler_cache_hit": judgement.cache_hit,
            "ruler_unique_runs": judgement.unique_runs,
            "ruler_truncated_tool_results": judgement.truncated_tool_results,
        }
    )


async def judge_group(
    group: TrajectoryGroup,
    judge_model: str | JudgeModelLike = DEFAULT_JUDGE_MODEL,
    options: RulerOptions | None = None,
) -> Judgement:
    """Judge the trajectories of a group without changing it. The tools shown are the
    distinct tools of all its trajectories.

    Example:
        >>> judgement = await judge_group(group, "gpt-4.1")  # needs a network service: a judge model, and a `group`  # doctest: +SKIP
        >>> apply_judgement(group, judgement)  # needs a network service: a judge model  # doctest: +SKIP
    """
    require_finished([group])
    tools = unique_tools([_tools_of(t) for t in group.trajectories]) or None
    return await judge_runs(
        [trajectory.messages() for trajectory in group.trajectories],
        judge_model,
        options,
        tools=tools,
    )


async def ruler_score_group(
    group: TrajectoryGroup,
    judge_model: str | JudgeModelLike = DEFAULT_JUDGE_MODEL,
    extra_litellm_params: Mapping[str, Any] | None = None,
    rubric: str = DEFAULT_RUBRIC,
    *,
    judge_base_url: str | None = None,
    judge_api_key: str | None = None,
    swallow_exceptions: bool = False,
    max_tool_result_chars: int = DEFAULT_MAX_TOOL_RESULT_CHARS,
    request_timeout: float | None = None,
    extra_params: Mapping[str, Any] | None = None,
    structured_output: bool = True,
    cache: bool = True,
    cache_path: str | os.PathLike[str] | None = None,
    debug: bool = False,
) -> TrajectoryGroup | None:
    """Replace each trajectory's reward with its RULER score; return the (same) group.

    The group is changed in place, and only after the judge's reply has been validated: on
    failure it is left exactly as it was, and either :class:`RulerError` is raised or, with
    ``swallow_exceptions=True``, None is returned (``gather_trajectory_groups(after_each=...)``
    then drops the group). Invalid arguments (no API key, empty rubric) always raise.

    The judge: ``judge_model`` is a model name, a LiteLLM id as in ART (``"openai/o3"``, the
    default; ``"anthropic/claude-sonnet-4-5"``, ``"openrouter/..."``, ``"hosted_vllm/..."``:
    the provider's OpenAI-compatible endpoint and key variable, see
    ``art_core.rewards.endpoint``), or an object with ``name`` / ``inference_base_url`` /
    ``inference_api_key`` (our ``Model``). ``judge_base_url`` / ``judge_api_key`` point it at
    any OpenAI-compatible server (the name is then sent as written); else they fall back to
    ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``.

    ART's arguments: ``extra_litellm_params`` are LiteLLM's: ``api_base``, ``api_key``,
    ``api_version``, ``extra_headers``, ``organization`` and ``timeout`` say where to connect;
    ``caching``, ``num_retries``, ``max_retries``, ``drop_params``, ``fallbacks``,
    ``metadata``, ``mock_response``, ``azure_ad_token(_provider)`` and the fields RULER sets
    itself (``model``, ``messages``, ``response_format``, ``stream``, ``n``, ``tools``) are
    ignored; every other key (``temperature``, ``max_tokens``, ``max_completion_tokens``,
    ``reasoning_effort``, ``top_p``, ``seed``, ...; ``extra_body``'s keys) goes into the
    request body. ``debug=True`` prints the judge's prompt and its reply.

    Ours: ``max_tool_result_chars`` caps each tool result in the prompt (0 = no cap);
    ``request_timeout`` is per request in seconds (default 300); ``extra_params`` go into the
    request body as given (e.g. ``{"temperature": 0}``); ``structured_output=False`` skips
    ``response_format`` for judges that lack it; ``cache=False`` disables the disk cache,
    ``cache_path`` moves it (default ``$ART_CORE_CACHE_DIR/ruler.sqlite`` or
    ``~/.cache/art_core/ruler.sqlite``). See :func:`apply_judgement` for the metrics written.

    Example:
        >>> group = await ruler_score_group(  # needs a network service: a judge model at that address, and a `group`  # doctest: +SKIP
        ...     group, "gpt-4.1", judge_base_url="http://127.0.0.1:8000/v1", swallow_exceptions=True)
        >>> [t.reward for t in group], group.metrics["ruler_judge_calls"]  # needs a network service: a judge model  # doctest: +SKIP
        ([0.9, 0.2, 0.55], 1)
        >>> await ruler_score_group(group, "openai/o3", {"temperature": 1.0}, debug=True)  # needs a network service: a judge model  # doctest: +SKIP
    """
    require_finished([group])
    if not group.trajectories:
        return group  # nothing to judge; every rollout of this group raised
    options = RulerOptions(
        judge_base_url=judge_base_url,
        judge_api_key=judge_api_key,
        rubric=rubric,
        max_tool_result_chars=max_tool_result_chars,
        request_timeout=request_timeout,
        extra_params=extra_params,
        extra_litellm_params=extra_litellm_params,
        structured_output=structured_output,
        cache=cache,
        cache_path=cache_path,
        debug=debug,
    )
    options.endpoint(judge_model)  # configuration errors always raise
    try:
        judgement = await judge_group(group, judge_model, options)
    except Exception as exc:
        if not swallow_exceptions:
            raise
        logger.warning("RULER could not score a group of %d runs: %s", len(group), exc)
        return None
    apply_judgement(group, judgement)
    return group
