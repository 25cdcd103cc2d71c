"""The RULER judge prompt: the runs of one group rendered side by side for an LLM judge.

A judge compares runs better (and cheaper) when it sees what they share once and only what
differs per run. So the prompt holds the shared prefix of the conversations once, the tools
the agent had, then one ``<run id="N">`` block per distinct run, and the rubric.

Messages are rendered to text before they are compared: tool-call ids (random strings the
server made up) are replaced by their position in the conversation, so two runs that differ
only in those ids count as identical and share their prefix.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Message = Mapping[str, Any]

DEFAULT_RUBRIC = """\
- A run that achieves the task's goal must score far higher than any run that does not.
- Among runs that achieve the goal, prefer the one that does it more efficiently (fewer wasted \
tool calls, no unproductive detours) and with a more correct, useful final answer.
- Keep score gaps proportional to quality gaps: if one run is only slightly better than \
another, their scores should be close; if it is much better, they should be far apart.
- Give partial credit to a run that makes real progress toward the goal without finishing.
- Penalize invented facts, ignored tool errors, and answers the tool results contradict."""

DEFAULT_MAX_TOOL_RESULT_CHARS = 2000

_SYSTEM_TEMPLATE = """\
You are an impartial judge of AI agent runs. Several runs of the same agent attempted the \
same task. Compare the runs with each other and give each one a score from 0 to 1 \
(1 = best possible), with a short explanation.

Grading rubric:
{rubric}

Reply with a JSON object only, with exactly one entry per run, in the order the runs appear:
{{"scores": [{{"run_id": "1", "explanation": "<one or two sentences>", "score": <number \
from 0 to 1>}}, ...]}}"""


@dataclass(frozen=True)
class JudgePrompt:
    """The chat messages sent to the judge and what they were built from.

    ``run_ids[i]`` is the id of the i-th distinct run shown to the judge; ``run_of_input[j]``
    is the index (into ``run_ids``) of the run that input conversation ``j`` was rendered as
    (identical conversations share one run).
    """

    messages: list[dict[str, str]]
    run_ids: list[str]
    run_of_input: list[int]
    prefix_messages: int
    truncated_tool_results: int


def message_text(content: Any) -> str:
    """The text of a message ``content``: a string, ``None``, or a list of content parts.

    Example:
        >>> message_text([{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {}}])
        'hi\\n[image_url]'
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts: list[str] = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping):
                kind = str(part.get("type", "part"))
                text = part.get("text")
                parts.append(str(text) if kind == "text" and text is not None else f"[{kind}]")
            else:
                parts.append(str(part))
        return "\n".join(parts)
    return str(content)


def truncate(text: str, budget: int) -> tuple[str, bool]:
    """Shorten ``text`` to about ``budget`` characters, keeping its head and tail.

    The tail is kept as well as the head because tool results often end with what matters
    (an error, a count, the last rows).

    Example:
        >>> truncate("a" * 10 + "b" * 10, 8)
        ('aaaa\\n[... 12 characters omitted ...]\\nbbbb', True)
    """
    if budget <= 0 or len(text) <= budget:
        return text, False
    head = budget - budget // 2
    tail = budget // 2
    omitted = len(text) - head - tail
    end = text[len(text) - tail :] if tail else ""
    return f"{text[:head]}\n[... {omitted} characters omitted ...]\n{end}", True


def _compact_arguments(arguments: Any) -> str:
    """Tool-call arguments as compact JSON; an invalid JSON string is shown as written."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments  # the judge should see the malformed call as the agent made it
    return json.dumps(arguments, ensure_ascii=False, sort_keys=True)


@dataclass
class _Rendered:
    lines: list[str]
    truncated: int


def render_conversation(messages: Sequence[Message], max_tool_result_chars: int) -> _Rendered:
    """Render each message as one text block; tool results longer than the budget are cut.

    Example:
        >>> r = render_conversation([
        ...     {"role": "assistant", "content": None, "tool_calls": [{"id": "c9", "type": "function",
        ...      "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
        ...     {"role": "tool", "tool_call_id": "c9", "content": "3"}], 2000)
        >>> r.lines
        ['[assistant]\\n[tool call #1] add({"a": 1, "b": 2})', '[tool result #1 add]\\n3']
    """
    calls: dict[str, tuple[int, str]] = {}  # tool_call_id -> (position, tool name)
    lines: list[str] = []
    truncated = 0
    for message in messages:
        if not isinstance(message, Mapping):
            raise TypeError(f"a message must be a dict, got {type(message).__name__}")
        role = str(message.get("role", "unknown"))
        text = message_text(message.get("content"))
        if role == "assistant":
            parts = [text] if text else []
            if message.get("refusal"):
                parts.append(f"[refusal] {message['refusal']}")
            for call in message.get("tool_calls") or []:
                if not isinstance(call, Mapping):
                    parts.append(f"[tool call] {call!r}")
                    continue
                function = call.get("function") or {}
                if not isinstance(function, Mapping):
                    function = {"arguments": function}
                name = str(function.get("name", "?"))
                position = len(calls) + 1
                calls[str(call.get("id", f"#{position}"))] = (position, name)
                arguments = _compact_arguments(function.get("arguments", ""))
                parts.append(f"[tool call #{position}] {name}({arguments})")
            lines.append("[assistant]\n" + ("\n".join(parts) if parts else "(empty reply)"))
        elif role in ("tool", "function"):
            key = str(message.get("tool_call_id", ""))
            if key in calls:
                position, name = calls[key]
                label = f"#{position} {name}"
            else:
                label = str(message.get("name") or key or "?")
            body, cut = truncate(text, max_tool_result_chars)
            truncated += cut
            lines.append(f"[tool result {label}]\n{body}")
        else:
            lines.append(f"[{role}]\n{text}")
    return _Rendered(lines, truncated)


def common_prefix_length(conversations: Sequence[Sequence[str]]) -> int:
    """How many leading rendered messages all conversations share.

    Example:
        >>> common_prefix_length([["s", "u", "a1"], ["s", "u", "a2"]])
        2
    """
    if not conversations:
        return 0
    shortest = min(len(c) for c in conversations)
    for index in range(shortest):
        first = conversations[0][index]
        if any(c[index] != first for c in conversations[1:]):
            return index
    return shortest


def render_tools(tools: Sequence[Mapping[str, Any]]) -> str:
    """One compact JSON line per tool (OpenAI ``{"type": "function", ...}`` or bare specs).

    Example:
        >>> render_tools([{"type": "function", "function": {"name": "f", "parameters": {}}}])
        '{"name": "f", "parameters": {}}'
    """
    lines = []
    for tool in tools:
        spec = tool.get("function", tool) if tool.get("type") == "function" else tool
        lines.append(json.dumps(spec, ensure_ascii=False, sort_keys=True))
    return "\n".join(lines)


def unique_tools(tool_lists: Sequence[Sequence[Mapping[str, Any]] | None]) -> list[dict[str, Any]]:
    """The distinct tools over several runs' tool lists, in first-seen order.

    Example:
        >>> unique_tools([[{"name": "f"}], [{"name": "f"}, {"name": "g"}], None])
        [{'name': 'f'}, {'name': 'g'}]
    """
    seen: set[str] = set()
    merged: list[dict[str, Any]] = []
    for tools in tool_lists:
        for tool in tools or []:
            key = json.dumps(tool, sort_keys=True, default=str)
            if key not in seen:
                seen.add(key)
                merged.append(dict(tool))
    return merged


def build_judge_prompt(
    message_lists: Sequence[Sequence[Message]],
    *,
    rubric: str = DEFAULT_RUBRIC,
    tools: Sequence[Mapping[str, Any]] | None = None,
    max_tool_result_chars: int = DEFAULT_MAX_TOOL_RESULT_CHARS,
) -> JudgePrompt:
    """Build the judge's chat messages for the runs of one group.

    Identical conversations are shown once. With a single distinct run, the shared context
    is what precedes the first assistant message, so the run itself is never empty.

    Example:
        >>> runs = [[{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": a}]
        ...         for a in ("4", "5", "4")]
        >>> prompt = build_judge_prompt(runs)
        >>> prompt.run_ids, prompt.run_of_input
        (['1', '2'], [0, 1, 0])
    """
    if not message_lists:
        raise ValueError("RULER needs at least one run to judge")
    rendered = [render_conversation(messages, max_tool_result_chars) for messages in message_lists]

    distinct: list[list[str]] = []
    index_of: dict[tuple[str, ...], int] = {}
    run_of_input: list[int] = []
    truncated = 0
    for conversation in rendered:
        key = tuple(conversation.lines)
        if key not in index_of:
            index_of[key] = len(distinct)
            distinct.append(conversation.lines)
            truncated += conversation.truncated
        run_of_input.append(index_of[key])

    if len(distinct) > 1:
        prefix = common_prefix_length(distinct)
    else:
        lines = distinct[0]
        prefix = next((i for i, line in enumerate(lines) if line.startswith("[assistant]")), 0)
    run_ids = [str(i + 1) for i in range(len(distinct))]

    sections: list[str] = []
    if prefix:
        shared = "\n\n".join(distinct[0][:prefix])
        sections.append(
            f"<shared_context>\nEvery run starts from these messages:\n\n{shared}\n</shared_context>"
        )
    if tools:
        sections.append(
            f"<tools>\nThe agent could call these tools:\n{render_tools(tools)}\n</tools>"
        )
    if truncated:
        sections.append(
            f"Note: tool results longer than {max_tool_result_chars} characters were shortened "
            "to fit; the removed middle is marked '[... N characters omitted ...]'. Do not "
            "penalize a run for that marker."
        )
    blocks = []
    for run_id, lines in zip(run_ids, distinct, strict=True):
        body = "\n\n".join(lines[prefix:]) or "(no messages after the shared context)"
        blocks.append(f'<run id="{run_id}">\n{body}\n</run>')
    sections.append(f'<runs count="{len(run_ids)}">\n' + "\n\n".join(blocks) + "\n</runs>")
    sections.append(f"Score all {len(run_ids)} runs (run ids: {', '.join(run_ids)}).")

    return JudgePrompt(
        messages=[
            {"role": "system", "content": _SYSTEM_TEMPLATE.format(rubric=rubric.strip())},
            {"role": "user", "content": "\n\n".join(sections)},
        ],
        run_ids=run_ids,
        run_of_input=run_of_input,
        prefix_messages=prefix,
        truncated_tool_results=truncated,
    )
