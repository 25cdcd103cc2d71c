"""One rollout as the agent lived it, and every sampled token with its training signal.

The conversation is rebuilt from the recorded calls (whatever wire API or framework they came
through, the gateway recorded them as chat messages): each call adds the messages that were
new since the previous call (tool results, a user turn) and its own reply. A call whose
prompt does not continue the previous one (a sub-agent, a compacted context) starts a new
branch.

The token view is the trainer's own assembly (``assemble_sequences``) of the same calls, so
context (masked) and trained tokens are exactly those the trainer saw; each trained token
carries the advantage and weight recorded for its rollout in the step's training signal
(``signals/{split}/{step:04d}.jsonl``) and, where recorded, the trainer's logprob, so the
importance ratio is ``exp(trainer_logprob - sampler_logprob)``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from art_core.training.sequences import TokenSequence, assemble_sequences
from art_core.trajectories import LLMCall
from art_core.ui.steps import as_dict, as_list
from art_core.ui.tokens import text_of, token_texts

# Context runs longer than this are shown by their two ends (a 25k-token agent prompt).
MAX_CONTEXT_CHARS = 20_000
# Call metadata the integrations record that says where in the agent a reply was made: shown
# next to the reply (all metadata is in the calls table).
FRAMEWORK_KEYS = (
    "langgraph_node",
    "langgraph_node_path",
    "agent_name",
    "agent",
    "mcp_server",
    "mcp_tools_called",
)
# Metadata values longer than this (as JSON) are cut in the view.
MAX_METADATA_CHARS = 4_000


def _short(value: Any) -> Any:
    text = orjson.dumps(value, default=str).decode()
    if len(text) <= MAX_METADATA_CHARS:
        return value
    return text[:MAX_METADATA_CHARS] + f"... ({len(text)} characters)"


def _message(message: Any, call: int | None, kind: str) -> dict[str, Any]:
    if not isinstance(message, dict):
        return {"role": "unknown", "content": str(message), "call": call, "kind": kind}
    shown: dict[str, Any] = {
        "role": str(message.get("role", "unknown")),
        "call": call,
        "kind": kind,
    }
    content = message.get("content")
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                parts.append(orjson.dumps(part, default=str).decode())
        content = "\n".join(parts)
    shown["content"] = content if content is None or isinstance(content, str) else str(content)
    tool_calls = []
    for tool_call in message.get("tool_calls") or []:
        if not isinstance(tool_call, dict):
            continue
        function = as_dict(tool_call.get("function"))
        tool_calls.append(
            {
                "id": tool_call.get("id"),
                "name": function.get("name"),
                "arguments": function.get("arguments"),
            }
        )
    if tool_calls:
        shown["tool_calls"] = tool_calls
    for key in ("tool_call_id", "name", "reasoning_content", "refusal"):
        if message.get(key):
            shown[key] = message[key]
    return shown


def _same(message: Any) -> tuple[Any, ...]:
    shown = _message(message, None, "")
    calls = tuple((c["name"], c["arguments"]) for c in shown.get("tool_calls", []))
    return (shown["role"], shown["content"] or "", calls)


def conversation(trajectory: dict[str, Any]) -> list[dict[str, Any]]:
    """The rollout's messages in order, each with the call that saw it first (``call``) and
    ``kind``: ``prompt`` (sent to the model), ``sampled`` (a reply it generated) or
    ``branch`` (the first message of a call that did not continue the previous one)."""
    calls = sorted(
        (c for c in trajectory.get("calls") or [] if isinstance(c, dict)),
        key=lambda c: (c.get("index", 0), c.get("choice_index", 0)),
    )
    if not calls:
        return [
            _message(
                m, None, "sampled" if isinstance(m, dict) and "finish_reason" in m else "prompt"
            )
            for m in trajectory.get("messages_and_choices") or []
        ]
    shown: list[dict[str, Any]] = []
    seen: list[Any] = []
    for number, call in enumerate(calls):
        messages = as_list(call.get("messages"))
        # Compared as shown (role, text, tool calls): a client echoes a reply back with
        # other empty fields (content null vs "") or fresh tool-call ids.
        if seen and [_same(m) for m in messages[: len(seen)]] == [_same(m) for m in seen]:
            new, kind = messages[len(seen) :], "prompt"
        else:
            new, kind = messages, ("branch" if seen else "prompt")
        for position, message in enumerate(new):
            shown.append(_message(message, number, kind if position == 0 else "prompt"))
        reply = call.get("response_message") or {"role": "assistant", "content": ""}
        entry = _message(reply, number, "sampled")
        entry["finish_reason"] = call.get("finish_reason")
        metadata = as_dict(call.get("metadata"))
        entry["framework"] = {k: _short(metadata[k]) for k in FRAMEWORK_KEYS if k in metadata}
        shown.append(entry)
        seen = [*messages, reply]
    return shown


def call_details(trajectory: dict[str, Any]) -> list[dict[str, Any]]:
    """Per call: API, adapter step, replica, sizes, timing and framework metadata."""
    details = []
    for call in trajectory.get("calls") or []:
        if not isinstance(call, dict):
            continue
        details.append(
            {
                "index": call.get("index"),
                "id": call.get("id"),
                "api": call.get("api", "chat.completions"),
                "model": call.get("model"),
                "adapter_step": call.get("adapter_step"),
                "replica": call.get("replica"),
                "finish_reason": call.get("finish_reason"),
                "latency_s": call.get("latency_s"),
                "prompt_tokens": len(call.get("prompt_token_ids") or []),
                "completion_tokens": len(call.get("completion_token_ids") or []),
                "request_params": _short(call.get("request_params") or {}),
                "metadata": {k: _short(v) for k, v in (call.get("metadata") or {}).items()},
            }
        )
    return details


def _context_text(tokenizer: Any, ids: list[int]) -> str:
    text = text_of(tokenizer, ids)
    if len(text) <= MAX_CONTEXT_CHARS:
        return text
    half = MAX_CONTEXT_CHARS // 2
    return f"{text[:half]}\n... [{len(text) - MAX_CONTEXT_CHARS} characters] ...\n{text[-half:]}"


def token_view(
    trajectory: dict[str, Any],
    signal: dict[str, Any] | None,
    tokenizer: Any,
    *,
    trained_split: bool,
) -> dict[str, Any]:
    """The rollout's training sequences as context runs and trained tokens with their signal.

    ``signal`` is the rollout's record in the step's training signal (None when the step did
    not train on it). Returns ``{"available", "reason", "advantage", "token_weight",
    "sequences": [{"segments": [...]}]}`` where a segment is ``{"kind": "context", "text",
    "tokens"}`` or ``{"kind": "trained", "tokens": [[id, text, sampler_logprob,
    adapter_step, trainer_logprob], ...]}``.
    """
    raw_calls = [c for c in trajectory.get("calls") or [] if isinstance(c, dict)]
    if not raw_calls:
        return {
            "available": False,
            "reason": "this rollout has no recorded calls: nothing of it was trained on",
        }
    try:
        calls = [LLMCall.model_validate(c) for c in raw_calls]
        assembled = assemble_sequences(calls)
    except (ValidationError, ValueError) as exc:
        return {"available": False, "reason": f"its recorded calls cannot be assembled: {exc}"}
    adapter_of = {call.id: call.adapter_step for call in calls}
    completion_lengths = {call.id: len(call.completion_token_ids) for call in calls}
    recorded = list(signal.get("sequences") or []) if signal else []
    sequences = [
        _sequence_view(
            sequence,
            recorded[number] if number < len(recorded) else {},
            adapter_of,
            completion_lengths,
            tokenizer,
        )
        for number, sequence in enumerate(assembled.sequences)
    ]
    return {
        "available": True,
        "reason": _train_reason(signal, trained_split),
        "trained": signal is not None,
        "advantage": signal.get("advantage") if signal else None,
        "token_weight": signal.get("token_weight") if signal else None,
        "sequence_breaks": assembled.breaks,
        "sequences": sequences,
    }


def _train_reason(signal: dict[str, Any] | None, trained_split: bool) -> str:
    """Why the rollout was trained on, or why not."""
    if signal is not None:
        return "trained with the advantage and weight recorded by the trainer"
    if trained_split:
        return (
            "not trained: no training signal is recorded for it (its group's rewards were all "
            "equal, the step trained nothing, or it was recorded before signals were kept)"
        )
    return "not trained: a validation rollout"


def _sequence_view(
    sequence: TokenSequence,
    record: Any,
    adapter_of: dict[str, int],
    completion_lengths: dict[str, int],
    tokenizer: Any,
) -> dict[str, Any]:
    """One training sequence as segments: runs of context (text) and of trained tokens (each
    ``[id, text, sampler_logprob, adapter_step, trainer_logprob]``); ``record`` is the
    sequence's entry in the training signal (its trainer logprobs), or ``{}``; the calls'
    adapter steps and completion lengths by call id say which step sampled each token."""
    trainer = record.get("trainer_logprobs") if isinstance(record, dict) else None
    trainer_logprobs = trainer if isinstance(trainer, list) else []
    # Which call sampled each trained token: calls extend the sequence in order.
    owners: list[int | None] = []
    for call_id in sequence.call_ids:
        owners += [adapter_of.get(call_id)] * completion_lengths.get(call_id, 0)
    texts = token_texts(
        tokenizer, [t for t, m in zip(sequence.token_ids, sequence.loss_mask, strict=True) if m]
    )
    segments: list[dict[str, Any]] = []
    trained_index = 0
    start = 0
    ids, mask = sequence.token_ids, sequence.loss_mask
    while start < len(ids):
        end = start
        while end < len(ids) and mask[end] == mask[start]:
            end += 1
        if not mask[start]:
            segments.append(
                {
                    "kind": "context",
                    "tokens": end - start,
                    "text": _context_text(tokenizer, ids[start:end]),
                }
            )
        else:
            tokens = []
            for position in range(start, end):
                trainer_lp = (
                    trainer_logprobs[trained_index]
                    if trained_index < len(trainer_logprobs)
                    else None
                )
                if not isinstance(trainer_lp, int | float) or not math.isfinite(trainer_lp):
                    trainer_lp = None
                tokens.append(
                    [
                        ids[position],
                        texts[trained_index],
                        round(sequence.logprobs[position], 6),
                        owners[trained_index] if trained_index < len(owners) else None,
                        trainer_lp,
                    ]
                )
                trained_index += 1
            segments.append({"kind": "trained", "tokens": tokens})
        start = end
    return {"segments": segments, "call_ids": sequence.call_ids, "trained_tokens": trained_index}


def read_signal(path: Path) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """A step's training signal keyed by trajectory id, and the lines that could not be read."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}, []
    except OSError as exc:
        return {}, [f"{path.name} cannot be read: {exc}"]
    records: dict[str, dict[str, Any]] = {}
    problems = []
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            record = None
        if isinstance(record, dict) and isinstance(record.get("trajectory_id"), str):
            records[record["trajectory_id"]] = record
        else:
            problems.append(f"signals/{path.parent.name}/{path.name}: line {number} is damaged")
    return records, problems
