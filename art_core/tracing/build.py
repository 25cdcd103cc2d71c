"""Turn a finished rollout (its recorded calls, reward, metrics, logs) into a ``SpanNode`` tree.

The tree: one ``rollout`` span (GenAI ``invoke_agent``) whose children, in time order, are a
``chat`` span per LLM request (its choices, usage, adapter step) and an ``execute_tool`` span
per tool call (see ``art_core.tracing.tools``). ``train_tree`` is the span of a train step.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from art_core.tracing import genai
from art_core.tracing.settings import TracingSettings
from art_core.tracing.tools import (
    ToolRecord,
    call_end,
    inferred_tool_calls,
    merge_tool_records,
    tool_node,
)
from art_core.tracing.tree import AttributeValue, Score, SpanNode
from art_core.trajectories import LLMCall

# The log line RULER writes per scored run (art_core.rewards.ruler.apply_judgement).
RULER_LOG = re.compile(
    r"^RULER \((?P<judge>.*?)\) score (?P<score>\S+): (?P<explanation>.*)$", re.S
)


@dataclass
class RolloutRecord:
    """A rollout frozen at the moment it is handed to the exporters.

    Example:
        >>> record = RolloutRecord(id="rollout_1", calls=[], reward=1.0, start_time=0.0)
        >>> rollout_tree(record, TracingSettings()).attributes["art.reward"]
        1.0
    """

    id: str
    calls: Sequence[LLMCall]
    reward: float | None
    start_time: float
    end_time: float | None = None
    metrics: Mapping[str, Any] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)
    logs: Sequence[str] = ()
    model_name: str | None = None
    project: str | None = None
    base_model: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    error_traceback: str | None = None
    tools: Sequence[ToolRecord] = ()


def ruler_explanation(logs: Sequence[str]) -> tuple[str, str] | None:
    """The (judge, explanation) of the last RULER log line, if any.

    Example:
        >>> ruler_explanation(["RULER (judge) score 0.800: concise and correct"])
        ('judge', 'concise and correct')
    """
    for line in reversed(logs):
        match = RULER_LOG.match(line)
        if match:
            return match["judge"], match["explanation"]
    return None


def rollout_scores(record: RolloutRecord, settings: TracingSettings) -> list[Score]:
    """The rollout's reward and, when RULER scored it, its RULER score with the explanation."""
    scores: list[Score] = []
    if record.reward is not None:
        scores.append(Score("reward", float(record.reward)))
    ruler = record.metrics.get("ruler_score")
    if isinstance(ruler, int | float) and not isinstance(ruler, bool):
        explanation = None
        if settings.capture_content:
            verdict = record.metadata.get("ruler")
            if isinstance(verdict, Mapping) and isinstance(verdict.get("explanation"), str):
                explanation = verdict["explanation"]
            else:  # trajectories scored before RULER wrote metadata["ruler"]
                found = ruler_explanation(record.logs)
                explanation = found[1] if found else None
        scores.append(Score("ruler_score", float(ruler), explanation))
    independent = record.metrics.get("independent_reward")
    if isinstance(independent, int | float) and not isinstance(independent, bool):
        scores.append(Score("independent_reward", float(independent)))
    return scores


def _requests(calls: Sequence[LLMCall]) -> list[list[LLMCall]]:
    """Calls grouped per HTTP request (``n`` > 1 records one call per choice), in order."""
    groups: dict[int, list[LLMCall]] = {}
    for call in calls:
        groups.setdefault(call.index, []).append(call)
    return [sorted(g, key=lambda c: c.choice_index) for _, g in sorted(groups.items())]


def _llm_node(
    request: list[LLMCall], context: RolloutRecord, settings: TracingSettings
) -> SpanNode:
    first = request[0]
    model = first.model
    steps = sorted({c.adapter_step for c in request})
    input_tokens = first.num_prompt_tokens
    output_tokens = sum(c.num_completion_tokens for c in request)
    attributes: dict[str, AttributeValue] = {
        genai.OPERATION: "chat",
        genai.PROVIDER_NAME: genai.PROVIDER,
        genai.SYSTEM: genai.PROVIDER,
        genai.REQUEST_MODEL: model,
        # NAME@STEP: the adapter that answered (the gateway's own naming).
        genai.RESPONSE_MODEL: f"{model.split('@')[0]}@{max(steps)}",
        genai.RESPONSE_ID: first.id,
        genai.FINISH_REASONS: [c.finish_reason for c in request],
        genai.INPUT_TOKENS: input_tokens,
        genai.OUTPUT_TOKENS: output_tokens,
        genai.CONVERSATION_ID: context.id,
        "art.rollout.id": context.id,
        "art.call.index": first.index,
        "art.adapter_step": max(steps),
        "art.latency_s": max(c.latency_s for c in request),
        **genai.request_attributes(first.request_params),
    }
    if first.replica is not None:  # served by one of several replicas
        attributes["art.replica"] = first.replica
    framework = {k: v for k, v in first.metadata.items() if k != "top_logprobs"}
    attributes.update(genai.flatten("art.call.metadata", framework))
    usage = {
        "prompt_tokens": input_tokens,
        "completion_tokens": output_tokens,
        "total_tokens": input_tokens + output_tokens,
    }
    output: dict[str, Any] = {"model": model, "usage": usage, "adapter_step": max(steps)}
    inputs: dict[str, Any] = {"model": model}
    _add_llm_messages(request, settings, attributes, inputs, output)
    params = {k: v for k, v in first.request_params.items() if k not in ("model", "metadata")}
    if params:
        inputs["params"] = params
    _add_llm_tokens(request, settings, attributes, inputs, output)
    return SpanNode(
        name=f"chat {model}",
        kind="llm",
        start_time=min(c.created_at for c in request),
        end_time=max(call_end(c) for c in request),
        attributes=attributes,
        input=inputs,
        output=output,
        display_name=f"chat {model}",
    )


def _add_llm_messages(
    request: list[LLMCall],
    settings: TracingSettings,
    attributes: dict[str, AttributeValue],
    inputs: dict[str, Any],
    output: dict[str, Any],
) -> None:
    """The request's messages, tools and choices (their content only with
    ``capture_content``) on an LLM span."""
    first = request[0]
    choices = [
        {"index": c.choice_index, "message": c.response_message, "finish_reason": c.finish_reason}
        for c in request
    ]
    if settings.capture_content:
        chars = settings.max_content_chars
        attributes[genai.INPUT_MESSAGES] = genai.to_json(
            genai.semconv_messages(first.messages, chars)
        )
        outputs = []
        for c in request:
            message = genai.semconv_message(c.response_message, chars)
            outputs.append({**message, "finish_reason": c.finish_reason})
        attributes[genai.OUTPUT_MESSAGES] = genai.to_json(outputs)
        if first.tools:
            attributes[genai.TOOL_DEFINITIONS] = genai.to_json(first.tools)
        inputs["messages"] = first.messages
        if first.tools:
            inputs["tools"] = first.tools
        output["choices"] = choices
    else:
        output["choices"] = [
            {"index": c["index"], "finish_reason": c["finish_reason"]} for c in choices
        ]


def _add_llm_tokens(
    request: list[LLMCall],
    settings: TracingSettings,
    attributes: dict[str, AttributeValue],
    inputs: dict[str, Any],
    output: dict[str, Any],
) -> None:
    """The token ids and logprobs on an LLM span, when the settings ask for them."""
    first = request[0]
    if settings.include_token_ids:
        attributes["art.prompt_token_ids"] = list(first.prompt_token_ids)
        attributes["art.completion_token_ids"] = [
            t for c in request for t in c.completion_token_ids
        ]
        output["completion_token_ids"] = [list(c.completion_token_ids) for c in request]
        inputs["prompt_token_ids"] = list(first.prompt_token_ids)
    if settings.include_logprobs:
        attributes["art.logprobs"] = [lp for c in request for lp in c.logprobs]
        output["logprobs"] = [list(c.logprobs) for c in request]


def _scalar_items(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if isinstance(v, str | int | float | bool)}


def rollout_tree(record: RolloutRecord, settings: TracingSettings) -> SpanNode:
    """The span tree of one rollout.

    Example:
        >>> tree = rollout_tree(RolloutRecord(id="r1", calls=[], reward=0.5, start_time=1.0),
        ...                     TracingSettings())
        >>> tree.name, [s.name for s in tree.scores]
        ('invoke_agent agent', ['reward'])
    """
    requests = _requests(record.calls)
    calls_end = max((call_end(c) for c in record.calls), default=record.start_time)
    start = min([record.start_time, *(c.created_at for c in record.calls)])
    end = max(record.end_time or calls_end, calls_end)
    agent = str(record.metadata.get("agent_name") or record.model_name or "agent")
    children = [_llm_node(request, record, settings) for request in requests]
    tools = merge_tool_records(inferred_tool_calls(requests, end), record.tools, start)
    children += [tool_node(call, record.id, settings) for call in tools]
    children.sort(key=lambda node: (node.start_time, node.kind != "llm"))
    end = max([end, *(child.end_time for child in children)])

    scores = rollout_scores(record, settings)
    attributes = _rollout_attributes(record, requests, len(tools), scores, agent, settings)

    inputs: dict[str, Any] = {"rollout_id": record.id, "metadata": dict(record.metadata)}
    output: dict[str, Any] = {"reward": record.reward, "metrics": dict(record.metrics)}
    if settings.capture_content:
        if requests:
            inputs["messages"] = requests[0][0].messages
            output["final_message"] = requests[-1][0].response_message
        if record.logs:
            output["logs"] = list(record.logs)
    error = None
    if record.error_type is not None:
        error = f"{record.error_type}: {record.error_message or ''}"
        attributes["art.error.type"] = record.error_type
        if settings.capture_content and record.error_traceback:
            attributes["art.error.traceback"] = record.error_traceback
        output["error"] = error
    label = _scalar_items(record.metadata).get("scenario") or _scalar_items(record.metadata).get(
        "task"
    )
    display = f"rollout {label}" if label else "rollout"
    return SpanNode(
        name=f"invoke_agent {agent}",
        kind="rollout",
        start_time=start,
        end_time=end,
        attributes=attributes,
        input=inputs,
        output=output,
        scores=scores,
        error=error,
        children=children,
        key=record.id,
        display_name=display,
    )


def _rollout_attributes(
    record: RolloutRecord,
    requests: list[list[LLMCall]],
    num_tool_calls: int,
    scores: Sequence[Score],
    agent: str,
    settings: TracingSettings,
) -> dict[str, AttributeValue]:
    """A rollout span's attributes: GenAI's, then the rollout's model, steps, scores,
    metrics, metadata and (with ``capture_content``) logs."""
    steps = sorted({c.adapter_step for c in record.calls})
    attributes: dict[str, AttributeValue] = {
        genai.OPERATION: "invoke_agent",
        genai.PROVIDER_NAME: genai.PROVIDER,
        genai.SYSTEM: genai.PROVIDER,
        genai.AGENT_NAME: agent,
        genai.CONVERSATION_ID: record.id,
        genai.INPUT_TOKENS: sum(c.num_prompt_tokens for r in requests for c in r[:1]),
        genai.OUTPUT_TOKENS: sum(c.num_completion_tokens for c in record.calls),
        "art.rollout.id": record.id,
        "art.num_llm_calls": len(requests),
        "art.num_tool_calls": num_tool_calls,
    }
    if record.model_name:
        attributes[genai.REQUEST_MODEL] = record.model_name
        attributes["art.model.name"] = record.model_name
    if record.project:
        attributes["art.project"] = record.project
    if record.base_model:
        attributes["art.base_model"] = record.base_model
    if steps:
        attributes["art.adapter_step"] = steps[-1]
        if len(steps) > 1:
            attributes["art.adapter_steps"] = steps
    for score in scores:
        attributes[f"art.{score.name}"] = score.value
        if score.comment:
            attributes[f"art.{score.name}.explanation"] = score.comment
    attributes.update(genai.flatten("art.metrics", record.metrics))
    attributes.update(genai.flatten("art.metadata", record.metadata))
    if settings.capture_content and record.logs:
        attributes["art.logs"] = [
            genai.clip(line, settings.max_content_chars) for line in record.logs
        ]
    return attributes


def train_tree(
    *,
    model_name: str,
    project: str | None,
    step: int,
    metrics: Mapping[str, float],
    start_time: float,
    end_time: float,
    trajectory_ids: Sequence[str],
    checkpoint_path: str | None = None,
    config: Mapping[str, Any] | None = None,
) -> SpanNode:
    """The span of one ``train`` call: its metrics, linked to the rollouts it trained on.

    ``step`` is the new checkpoint's step.

    Example:
        >>> node = train_tree(model_name="m", project="p", step=1, metrics={"train/loss": 0.1},
        ...                   start_time=0.0, end_time=2.0, trajectory_ids=["r1"])
        >>> node.attributes["art.train.loss"], node.links
        (0.1, ['r1'])
    """
    attributes: dict[str, AttributeValue] = {
        "art.model.name": model_name,
        "art.train.step": step,
        "art.train.num_trajectories": len(trajectory_ids),
    }
    if project:
        attributes["art.project"] = project
    if checkpoint_path:
        attributes["art.train.checkpoint_path"] = checkpoint_path
    for name, value in metrics.items():
        converted = genai.attribute_value(value)
        if converted is not None:
            attributes[f"art.{name.replace('/', '.')}"] = converted
    if config:
        attributes.update(genai.flatten("art.train.config", config))
    return SpanNode(
        name=f"train_step {model_name}",
        kind="train",
        start_time=start_time,
        end_time=max(end_time, start_time),
        attributes=attributes,
        input={
            "model": model_name,
            "step": step,
            "config": dict(config or {}),
            "num_trajectories": len(trajectory_ids),
        },
        output=dict(metrics),
        key=f"train:{project}/{model_name}/{step}",
        links=list(trajectory_ids),
        display_name=f"train step {step}",
    )
