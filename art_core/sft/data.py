"""What ``train_sft`` accepts, turned into named demonstrations and checked before training.

``data`` may be a path to a JSONL file or an iterable of trajectories, trajectory groups and
chat records, mixed freely:

- **trajectories recorded through the gateway** (``run.trajectory()``, or ART-style
  ``messages_and_choices`` holding the gateway's choices): trained token-exactly;
- **ART-style trajectories** (``messages_and_choices`` with plain messages, ``tools``) and
  **OpenAI chat records** (``{"messages": [...], "tools": [...]}``, one per JSONL line, the
  format of OpenAI's fine-tuning files; an assistant message with ``"weight": 0`` is context
  only): rendered with the model's chat template, tool calls included;
- **trajectory groups** (e.g. a step's ``trajectories/train/0003.jsonl``): all their
  trajectories; ``best_trajectories`` keeps the best of each group instead (rejection
  sampling).

Each demonstration gets a label (``chat.jsonl:7``, ``data[3] (trajectory rollout_...)``) that
every error names. ``check_demonstration`` refuses what cannot be trained on before any
tokenizer is involved: no assistant turn, a tool call to a tool the record does not list,
tool-call arguments that are not a JSON object, messages the gateway would refuse.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from art_core.gateway.prompts import normalize_message
from art_core.gateway.schemas import Message, Tool
from art_core.trajectories import Trajectory, TrajectoryGroup

# Anything ``train_sft`` takes as data (``Demonstration`` items keep their labels).
SFTData = (
    str
    | os.PathLike[str]
    | Iterable["Trajectory | TrajectoryGroup | Mapping[str, Any] | Demonstration"]
)
# A JSONL file's lines are read up to this many characters each (a bound on one record).
MAX_LINE_CHARS = 16 * 1024 * 1024
# Keys of an OpenAI chat record (fine-tuning file line) besides ``messages``.
CHAT_RECORD_KEYS = frozenset({"messages", "tools", "parallel_tool_calls", "functions"})
AssistantTurns = Literal["all", "last"]


@dataclass(frozen=True)
class Demonstration:
    """One record to imitate: a trajectory and the label errors name it by.

    Example:
        >>> Demonstration("chat.jsonl:1", Trajectory()).label
        'chat.jsonl:1'
    """

    label: str
    trajectory: Trajectory


def chat_record_to_trajectory(
    record: Mapping[str, Any], *, source: str | None = None
) -> Trajectory:
    """An OpenAI chat record (``messages``, optional ``tools``) as an ART-style trajectory.

    Raises ``ValueError`` for a record that is not one (naming ``source`` when given).

    Example:
        >>> t = chat_record_to_trajectory({"messages": [{"role": "user", "content": "2+2?"},
        ...                                             {"role": "assistant", "content": "4"}]})
        >>> len(t.messages_and_choices), t.tools
        (2, None)
    """
    where = f"{source}: " if source else ""
    if not isinstance(record, Mapping):
        raise ValueError(f"{where}a chat record is a JSON object, got {type(record).__name__}")
    unknown = sorted(set(record) - CHAT_RECORD_KEYS)
    if "messages" not in record or unknown:
        raise ValueError(
            f"{where}a chat record has 'messages' (and optionally 'tools'); "
            + (f"unknown keys {unknown}" if unknown else "'messages' is missing")
        )
    messages, tools = record["messages"], record.get("tools")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise ValueError(f"{where}'messages' must be a list of message objects")
    if tools is not None and (
        not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)
    ):
        raise ValueError(f"{where}'tools' must be a list of tool objects")
    metadata = {"source": source} if source else {}
    return Trajectory(messages_and_choices=messages, tools=tools, reward=1.0, metadata=metadata)


def _from_json_object(value: Any, label: str) -> list[Demonstration]:
    """A JSON object of a file or a list: a group, a trajectory or a chat record."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{label}: expected a JSON object, got {type(value).__name__}")
    try:
        if "trajectories" in value:
            group = TrajectoryGroup.model_validate(dict(value))
            return [
                Demonstration(f"{label}.trajectories[{k}]", t)
                for k, t in enumerate(group.trajectories)
            ]
        if "messages_and_choices" in value or "calls" in value:
            return [Demonstration(label, Trajectory.model_validate(dict(value)))]
    except (ValidationError, ValueError) as exc:
        raise ValueError(f"{label}: not a valid trajectory or group: {exc}") from None
    return [Demonstration(label, chat_record_to_trajectory(value, source=label))]


def load_chat_jsonl(path: str | os.PathLike[str]) -> list[Trajectory]:
    """Read a JSONL file of chat records (OpenAI fine-tuning format), trajectories or groups.

    Each trajectory's ``metadata["source"]`` is ``file.jsonl:LINE`` for chat records; blank
    lines are skipped. Raises ``ValueError`` naming the line that is not valid.

    Example:
        >>> record = {"messages": [{"role": "user", "content": "1 + 1?"}, {"role": "assistant", "content": "2"}]}
        >>> _ = Path("digits.jsonl").write_text(json.dumps(record) + "\\n")
        >>> trajectories = load_chat_jsonl("digits.jsonl")
        >>> trajectories[0].metadata["source"]
        'digits.jsonl:1'
    """
    return [demo.trajectory for demo in _read_jsonl(Path(path))]


def _read_jsonl(path: Path) -> list[Demonstration]:
    if not path.is_file():
        raise FileNotFoundError(f"no SFT data file at {path}")
    demos: list[Demonstration] = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(iter(lambda: lines.readline(MAX_LINE_CHARS + 1), ""), 1):
            label = f"{path.name}:{number}"
            if len(line) > MAX_LINE_CHARS:
                raise ValueError(f"{label}: the line is longer than {MAX_LINE_CHARS} characters")
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{label}: not valid JSON: {exc}") from None
            demos += _from_json_object(value, label)
    return demos


def demonstrations(data: SFTData) -> list[Demonstration]:
    """Every demonstration in ``data`` (see the module), labelled, in order.

    Example:
        >>> demos = demonstrations([{"messages": [{"role": "user", "content": "hi"},
        ...                                       {"role": "assistant", "content": "hello"}]}])
        >>> demos[0].label
        'data[0]'
    """
    if isinstance(data, str | os.PathLike):
        return _read_jsonl(Path(data))
    if isinstance(data, bytes | Mapping | BaseModel) and not isinstance(
        data, Trajectory | TrajectoryGroup
    ):
        raise TypeError(
            "train_sft data is a path to a JSONL file or an iterable of trajectories, groups "
            f"and chat records, got {type(data).__name__}"
        )
    if isinstance(data, Trajectory | TrajectoryGroup):
        data = [data]
    demos: list[Demonstration] = []
    for index, item in enumerate(data):
        label = f"data[{index}]"
        if isinstance(item, Demonstration):
            demos.append(item)
        elif isinstance(item, Trajectory):
            source = item.metadata.get("source")
            suffix = f" ({source})" if isinstance(source, str) else f" (trajectory {item.id})"
            demos.append(Demonstration(label + suffix, item))
        elif isinstance(item, TrajectoryGroup):
            if item.pending:
                raise ValueError(f"{label}: the group still has rollouts that have not run")
            demos += [
                Demonstration(f"{label}.trajectories[{k}] (trajectory {t.id})", t)
                for k, t in enumerate(item.trajectories)
            ]
        elif isinstance(item, Mapping):
            demos += _from_json_object(item, label)
        else:
            raise TypeError(
                f"{label}: expected a Trajectory, a TrajectoryGroup or a chat record (dict), "
                f"got {type(item).__name__}"
            )
    return demos


def best_trajectories(
    groups: Iterable[TrajectoryGroup],
    *,
    per_group: int = 1,
    min_reward: float | None = None,
) -> list[Trajectory]:
    """Rejection sampling: the ``per_group`` highest-reward trajectories of each group.

    Ties keep the earlier trajectory; with ``min_reward`` only trajectories scoring at least
    that are kept (a group none of whose runs succeeded gives nothing). The result is SFT
    data: ``await model.train_sft(art.best_trajectories(groups, min_reward=1.0))``.

    Example:
        >>> groups = [TrajectoryGroup([Trajectory(reward=0.2), Trajectory(reward=0.9)]),
        ...           TrajectoryGroup([Trajectory(reward=0.1), Trajectory(reward=0.0)])]
        >>> [t.reward for t in best_trajectories(groups)]
        [0.9, 0.1]
        >>> [t.reward for t in best_trajectories(groups, min_reward=0.5)]
        [0.9]
    """
    if per_group < 1:
        raise ValueError(f"per_group must be >= 1, got {per_group}")
    kept: list[Trajectory] = []
    for index, group in enumerate(groups):
        if not isinstance(group, TrajectoryGroup):
            raise TypeError(f"groups[{index}] is a {type(group).__name__}, not a TrajectoryGroup")
        ranked = sorted(group.trajectories, key=lambda t: -t.reward)  # stable: ties keep order
        kept += [t for t in ranked[:per_group] if min_reward is None or t.reward >= min_reward]
    return kept


# ---------------------------------------------------------------------------------- checks
@dataclass
class ChatTurn:
    """One assistant turn of a rendered record: the prompt before it and the answer."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    answer: dict[str, Any]
    trained: bool


def normalized_tools(tools: list[dict[str, Any]] | None, label: str) -> list[dict[str, Any]] | None:
    """Tools validated and normalized as the gateway does before rendering them."""
    if not tools:
        return None
    out = []
    for index, tool in enumerate(tools):
        try:
            out.append(Tool.model_validate(tool).model_dump(exclude_none=True))
        except ValidationError as exc:
            raise ValueError(
                f"{label}: tools[{index}] is not a valid tool: {_first(exc)}"
            ) from None
    return out


def normalized_message(message: dict[str, Any], label: str, where: str) -> dict[str, Any]:
    """A message validated and normalized as the gateway does, plus its SFT ``weight``."""
    try:
        parsed = Message.model_validate(message).model_dump(exclude_none=True)
    except ValidationError as exc:
        raise ValueError(f"{label}: {where} is not a valid message: {_first(exc)}") from None
    normalized = normalize_message(parsed)
    weight = message.get("weight")
    if weight is not None:
        if normalized["role"] != "assistant" or weight not in (0, 1):
            raise ValueError(f"{label}: {where}: 'weight' is 0 or 1, on assistant messages only")
        normalized["weight"] = int(weight)
    return normalized


def _first(exc: ValidationError) -> str:
    error = exc.errors()[0]
    location = ".".join(str(part) for part in error.get("loc", ()))
    return f"{location}: {error.get('msg')}" if location else str(error.get("msg"))


def checked_tool_calls(
    answer: dict[str, Any],
    tools: list[dict[str, Any]] | None,
    label: str,
    where: str,
    *,
    partial: bool = False,
) -> dict[str, Any]:
    """``answer`` with its tool calls checked and their arguments in canonical JSON.

    Every call must name a listed tool and have JSON-object arguments. Arguments are
    re-serialized as the gateway's tool-call grammar writes them (``", "`` and ``": "``
    separators), so a demonstration teaches exactly the text constrained decoding allows.
    ``partial``: the answer was cut by ``max_tokens`` (its arguments are a prefix of JSON),
    so only the names are checked and the answer is returned as it is.
    """
    names = [tool["function"]["name"] for tool in tools or []]
    calls = []
    for position, call in enumerate(answer.get("tool_calls") or []):
        name = call["function"]["name"]
        if name not in names:
            listed = f"the record's tools are {names}" if names else "the record lists no tools"
            raise ValueError(
                f"{label}: {where} calls tool {name!r}, which is not listed ({listed})"
            )
        raw = call["function"].get("arguments") or "{}"
        if partial:
            continue
        try:
            arguments = json.loads(raw) if isinstance(raw, str) else raw
        except json.JSONDecodeError:
            arguments = None
        if not isinstance(arguments, dict):
            raise ValueError(
                f"{label}: {where}.tool_calls[{position}] ({name!r}): arguments must be a JSON "
                f"object, got {raw!r:.200}"
            )
        function = {**call["function"], "arguments": json.dumps(arguments, ensure_ascii=False)}
        calls.append({**call, "function": function})
    return {**answer, "tool_calls": calls} if calls and not partial else answer


def chat_turns(
    demo: Demonstration, assistant_turns: AssistantTurns = "all", *, recorded: bool = False
) -> list[ChatTurn]:
    """The record's assistant turns with their prompts, validated (see the module).

    A trajectory with recorded calls gives one turn per call (its request messages and the
    answer it returned); otherwise each assistant message of its messages (choices included)
    is a turn whose prompt is every message before it. Raises ``ValueError`` naming the record
    for no trained assistant turn, a tool call to a tool not listed, invalid messages.
    ``recorded``: the calls are this model's own record, trained token-exactly, so a call cut
    by ``max_tokens`` is what was sampled (GRPO trains on it too) rather than an error.

    Example:
        >>> demo = demonstrations([{"messages": [{"role": "user", "content": "2+2?"},
        ...                                      {"role": "assistant", "content": "4"}]}])[0]
        >>> [turn.answer["content"] for turn in chat_turns(demo)]
        ['4']
    """
    label, trajectory = demo.label, demo.trajectory
    turns: list[ChatTurn] = []
    if trajectory.calls:
        for index, call in enumerate(trajectory.calls):
            where = f"calls[{index}]"
            tools = normalized_tools(call.tools, label)
            messages = [
                normalized_message(m, label, f"{where}.messages[{k}]")
                for k, m in enumerate(call.messages)
            ]
            answer = normalized_message(call.response_message, label, f"{where}.response_message")
            if answer["role"] != "assistant":
                raise ValueError(f"{label}: {where}.response_message is not an assistant message")
            cut = call.finish_reason == "length"
            answer = checked_tool_calls(answer, tools, label, where, partial=cut)
            # Recorded calls train as sampled (as GRPO does, cut or not); an answer from
            # elsewhere that max_tokens cut short is no demonstration of a finished turn.
            turns.append(ChatTurn(messages, tools, answer, trained=recorded or not cut))
    else:
        tools = normalized_tools(trajectory.tools, label)
        canonical: list[dict[str, Any]] = []  # the messages so far, as prompts render them
        for index, item in enumerate(trajectory.messages_and_choices):
            choice = "message" in item and "finish_reason" in item
            cut = choice and item.get("finish_reason") == "length"
            where = f"messages_and_choices[{index}]" if choice else f"messages[{index}]"
            message = normalized_message(item["message"] if choice else item, label, where)
            clean = {k: v for k, v in message.items() if k != "weight"}
            if message["role"] == "assistant":
                # Canonical arguments: earlier answers as the model would have produced them.
                clean = checked_tool_calls(clean, tools, label, where, partial=cut)
                trained = message.get("weight", 1) == 1 and not cut
                turns.append(ChatTurn(list(canonical), tools, clean, trained=trained))
            canonical.append(clean)
    if assistant_turns == "last":
        for turn in [turn for turn in turns if turn.trained][:-1]:
            turn.trained = False
    if not any(turn.trained for turn in turns):
        raise ValueError(
            f"{label}: no assistant turn to train on"
            + (" (each has weight 0 or was cut by max_tokens)" if turns else "")
        )
    return turns


def check_demonstration(demo: Demonstration, assistant_turns: AssistantTurns = "all") -> None:
    """Raise ``ValueError`` naming ``demo`` if it cannot be trained on (see ``chat_turns``).

    Example:
        >>> check_demonstration(Demonstration("r", Trajectory(messages_and_choices=[
        ...     {"role": "user", "content": "hi"}])))
        Traceback (most recent call last):
        ValueError: r: no assistant turn to train on
    """
    chat_turns(demo, assistant_turns)
