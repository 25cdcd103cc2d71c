"""OpenInference attributes, alongside the GenAI ones, for backends that read them (Phoenix,
Arize, and the OpenInference readers in MLflow, Langfuse and Weave).

From the same ``SpanNode`` tree: span kinds (rollout = AGENT, chat = LLM, tool call = TOOL,
train step = CHAIN), ``input.value`` / ``output.value``, chat messages flattened as
``llm.input_messages.{i}.message.*`` with their tool calls, token counts, invocation
parameters and tool schemas, ``tool.name`` on tool spans, and per trace ``session.id`` (the
rollout's model and adapter step), ``metadata`` and ``tag.tags``.

Messages come only from what ``build`` put in the node, so with ``capture_content=False``
(no messages, arguments or results in the tree) none are exported here either. Reference:
https://github.com/Arize-ai/openinference/blob/main/spec/semantic_conventions.md
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from art_core.tracing import genai
from art_core.tracing.tree import AttributeValue, SpanNode

SPAN_KIND = "openinference.span.kind"
INPUT_VALUE = "input.value"
INPUT_MIME_TYPE = "input.mime_type"
OUTPUT_VALUE = "output.value"
OUTPUT_MIME_TYPE = "output.mime_type"
SESSION_ID = "session.id"
METADATA = "metadata"
TAGS = "tag.tags"
AGENT_NAME = "agent.name"
LLM_MODEL_NAME = "llm.model_name"
LLM_PROVIDER = "llm.provider"
LLM_INVOCATION_PARAMETERS = "llm.invocation_parameters"
LLM_INPUT_MESSAGES = "llm.input_messages"
LLM_OUTPUT_MESSAGES = "llm.output_messages"
LLM_TOOLS = "llm.tools"
TOKENS_PROMPT = "llm.token_count.prompt"
TOKENS_COMPLETION = "llm.token_count.completion"
TOKENS_TOTAL = "llm.token_count.total"
TOOL_NAME = "tool.name"
TOOL_ID = "tool.id"
JSON = "application/json"
TEXT = "text/plain"

SPAN_KINDS = {
    "rollout": "AGENT",
    "llm": "LLM",
    "tool": "TOOL",
    "train": "CHAIN",
    "score": "EVALUATOR",
}


def message_attributes(
    prefix: str, messages: Iterable[Mapping[str, Any]], max_chars: int | None = None
) -> dict[str, AttributeValue]:
    """OpenAI chat messages flattened under ``prefix`` (``llm.input_messages``), the way
    OpenInference's instrumentations write them.

    Example:
        >>> message_attributes("llm.input_messages", [{"role": "user", "content": "hi"}])
        {'llm.input_messages.0.message.role': 'user', 'llm.input_messages.0.message.content': 'hi'}
    """
    out: dict[str, AttributeValue] = {}
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            continue
        key = f"{prefix}.{i}.message"
        out[f"{key}.role"] = str(message.get("role", "user"))
        content = message.get("content")
        if isinstance(content, str):
            out[f"{key}.content"] = genai.clip(content, max_chars)
        elif isinstance(content, list):
            for j, part in enumerate(p for p in content if isinstance(p, Mapping)):
                part_key = f"{key}.contents.{j}.message_content"
                kind = str(part.get("type", "unknown"))
                out[f"{part_key}.type"] = kind
                if kind == "text":
                    out[f"{part_key}.text"] = genai.clip(str(part.get("text", "")), max_chars)
        if isinstance(message.get("name"), str):
            out[f"{key}.name"] = message["name"]
        if isinstance(message.get("tool_call_id"), str):
            out[f"{key}.tool_call_id"] = message["tool_call_id"]
        for j, call in enumerate(message.get("tool_calls") or []):
            if not isinstance(call, Mapping):
                continue
            call_key = f"{key}.tool_calls.{j}.tool_call"
            function = call.get("function") or {}
            if call.get("id") is not None:
                out[f"{call_key}.id"] = str(call["id"])
            if function.get("name") is not None:
                out[f"{call_key}.function.name"] = str(function["name"])
            arguments = function.get("arguments")
            if arguments is not None:
                out[f"{call_key}.function.arguments"] = (
                    arguments if isinstance(arguments, str) else genai.to_json(arguments)
                )
    return out


def _value(prefix: str, value: Any) -> dict[str, AttributeValue]:
    """``input.*`` / ``output.*``: a string as text, anything else as JSON."""
    if value is None:
        return {}
    if isinstance(value, str):
        return {f"{prefix}.value": value, f"{prefix}.mime_type": TEXT}
    return {f"{prefix}.value": genai.to_json(value), f"{prefix}.mime_type": JSON}


def _llm(node: SpanNode, max_chars: int | None) -> dict[str, AttributeValue]:
    attributes = node.attributes
    out: dict[str, AttributeValue] = {LLM_PROVIDER: genai.PROVIDER}
    model = attributes.get(genai.REQUEST_MODEL)
    if isinstance(model, str):
        out[LLM_MODEL_NAME] = model
    prompt = attributes.get(genai.INPUT_TOKENS)
    completion = attributes.get(genai.OUTPUT_TOKENS)
    if isinstance(prompt, int) and isinstance(completion, int):
        out.update({TOKENS_PROMPT: prompt, TOKENS_COMPLETION: completion})
        out[TOKENS_TOTAL] = prompt + completion
    inputs = node.input if isinstance(node.input, Mapping) else {}
    output = node.output if isinstance(node.output, Mapping) else {}
    if inputs.get("params"):
        out[LLM_INVOCATION_PARAMETERS] = genai.to_json(inputs["params"])
    messages = inputs.get("messages")
    if isinstance(messages, list):
        out.update(message_attributes(LLM_INPUT_MESSAGES, messages, max_chars))
        out.update(_value("input", {"messages": messages}))
    choices = [c.get("message") for c in output.get("choices") or [] if isinstance(c, Mapping)]
    replies = [m for m in choices if isinstance(m, Mapping)]
    if replies:
        out.update(message_attributes(LLM_OUTPUT_MESSAGES, replies, max_chars))
        out.update(_value("output", replies[0] if len(replies) == 1 else replies))
    for i, tool in enumerate(inputs.get("tools") or []):
        out[f"{LLM_TOOLS}.{i}.tool.json_schema"] = genai.to_json(tool)
    return out


def _tool(node: SpanNode) -> dict[str, AttributeValue]:
    out: dict[str, AttributeValue] = {TOOL_NAME: node.display_name or node.name}
    call_id = node.attributes.get(genai.TOOL_CALL_ID)
    if isinstance(call_id, str):
        out[TOOL_ID] = call_id
    inputs = node.input if isinstance(node.input, Mapping) else {}
    if "arguments" in inputs:
        out.update(_value("input", inputs["arguments"]))
    out.update(_value("output", node.output))
    return out


def span_attributes(node: SpanNode, max_chars: int | None = None) -> dict[str, AttributeValue]:
    """The OpenInference attributes of one span (not those of its trace: ``trace_attributes``).

    Example:
        >>> node = SpanNode("execute_tool f", "tool", 0.0, 1.0, input={"name": "f"},
        ...                 display_name="f")
        >>> span_attributes(node)
        {'openinference.span.kind': 'TOOL', 'tool.name': 'f'}
    """
    out: dict[str, AttributeValue] = {SPAN_KIND: SPAN_KINDS.get(node.kind, "UNKNOWN")}
    if node.kind == "llm":
        out.update(_llm(node, max_chars))
    elif node.kind == "tool":
        out.update(_tool(node))
    else:
        if node.kind == "rollout":
            agent = node.attributes.get(genai.AGENT_NAME)
            if isinstance(agent, str):
                out[AGENT_NAME] = agent
        out.update(_value("input", node.input))
        out.update(_value("output", node.output))
    return out


def session_id(root: SpanNode) -> str | None:
    """The session a rollout belongs to: its model's rollouts served by one adapter step
    (``project/model/step-N``), so a session is what one training step saw.

    Example:
        >>> session_id(SpanNode("r", "rollout", 0, 1, attributes={
        ...     "art.project": "p", "art.model.name": "m", "art.adapter_step": 3}))
        'p/m/step-3'
    """
    if root.kind != "rollout":
        return None
    step = root.attributes.get("art.adapter_step")
    parts = [root.attributes.get("art.project"), root.attributes.get("art.model.name")]
    label = "/".join(str(p) for p in parts if p)
    if step is None:
        return label or None
    return f"{label}/step-{step}" if label else f"step-{step}"


def trace_metadata(root: SpanNode) -> dict[str, Any]:
    """What a trace is about, for backends' filterable metadata: the rollout id, model,
    adapter step and the rollout's own metadata (a train step: model and step).

    Example:
        >>> trace_metadata(SpanNode("r", "rollout", 0, 1, key="r1",
        ...                         input={"metadata": {"scenario": "s0"}}))
        {'rollout_id': 'r1', 'scenario': 's0'}
    """
    out: dict[str, Any] = {}
    if root.kind == "rollout" and root.key:
        out["rollout_id"] = root.key
    for name, attribute in (
        ("model", "art.model.name"),
        ("project", "art.project"),
        ("adapter_step", "art.adapter_step"),
        ("train_step", "art.train.step"),
    ):
        if attribute in root.attributes:
            out[name] = root.attributes[attribute]
    metadata = root.input.get("metadata") if isinstance(root.input, Mapping) else None
    if isinstance(metadata, Mapping):
        out.update({str(k): v for k, v in metadata.items() if v is not None})
    return out


def trace_tags(root: SpanNode) -> list[str]:
    """Tags of a trace: ``art``, its kind, and ``step:N``.

    Example:
        >>> trace_tags(SpanNode("r", "rollout", 0, 1, attributes={"art.adapter_step": 2}))
        ['art', 'rollout', 'step:2']
    """
    tags = ["art", root.kind]
    step = root.attributes.get("art.adapter_step", root.attributes.get("art.train.step"))
    if step is not None:
        tags.append(f"step:{step}")
    return tags


def trace_attributes(root: SpanNode) -> dict[str, AttributeValue]:
    """The attributes every span of ``root``'s trace carries: ``session.id``.

    Example:
        >>> trace_attributes(SpanNode("r", "rollout", 0, 1, attributes={"art.adapter_step": 0}))
        {'session.id': 'step-0'}
    """
    session = session_id(root)
    return {SESSION_ID: session} if session else {}


def root_attributes(root: SpanNode) -> dict[str, AttributeValue]:
    """The attributes of a trace's root span only: ``metadata`` (JSON) and ``tag.tags``.

    Example:
        >>> root_attributes(SpanNode("r", "rollout", 0, 1, key="r1"))
        {'metadata': '{"rollout_id":"r1"}', 'tag.tags': ['art', 'rollout']}
    """
    return {METADATA: genai.to_json(trace_metadata(root)), TAGS: trace_tags(root)}
