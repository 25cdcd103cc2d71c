"""What the diagnoses read of one rollout, taken from its records only.

The gateway's recorded calls (``Trajectory.calls``) say which tools each response called
with which arguments, against which offered tool schemas, how each call ended
(``finish_reason``) and what the request asked for (``request_params``: ``max_tokens``,
``parallel_tool_calls``, ``tool_choice``). The rollout's own report adds what only it saw: ``metadata``
(``stop_reason``, ``final_answer``, ``answer_tool``) and ``metrics`` (``tool_errors``, the
errors the tools returned). Nothing here guesses from text.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from art_core.trajectories import LLMCall, Trajectory

# Kinds of argument errors a call's arguments show against the schema it was offered.
UNKNOWN_TOOL = "unknown tool"
UNPARSABLE = "arguments not a JSON object"
INVENTED = "invented argument"
MISSING = "missing argument"
INVALID = "argument of the wrong type or value"
# Arguments that do not parse in a response cut at its token limit: the limit, not the model's
# grasp of the schema, broke them.
CUT = "arguments cut by max_tokens"
# An error the tool itself returned (the arguments fit the schema, the tool refused them:
# e.g. an id it does not know), counted by the rollout (``metrics["tool_errors"]``).
TOOL_FAILED = "error returned by the tool"

# Arguments longer than this are checked for their names only (their values are not validated:
# the check runs after every step, on every call).
MAX_CHECKED_ARGUMENT_CHARS = 16_384

# How a rollout that did not answer is recognized in its metadata (art_mcp's stop reasons).
_UNANSWERED_STOPS = {"max_turns", "no_tool_call", "context_length", "length"}


@dataclass(frozen=True)
class ToolCall:
    """One tool call of a response: its name and its arguments as sent (raw JSON text)."""

    name: str
    arguments: str

    def key(self) -> tuple[str, str]:
        """Name and canonical arguments: two calls with the same key asked the same thing."""
        try:
            canonical = json.dumps(json.loads(self.arguments or "{}"), sort_keys=True)
        except ValueError:
            canonical = (self.arguments or "").strip()
        return self.name, canonical

    def render(self, max_chars: int = 80) -> str:
        """``name(arguments)``, cut to ``max_chars``."""
        text = f"{self.name}({self.arguments})"
        return text if len(text) <= max_chars else text[: max_chars - 3] + "..."


@dataclass
class RolloutFacts:
    """One rollout as the diagnoses see it.

    Example:
        >>> facts = rollout_facts(Trajectory(reward=1.0))
        >>> facts.turns, facts.answered, facts.reward
        ([], True, 1.0)
    """

    reward: float
    turns: list[list[ToolCall]] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)
    max_tokens: int | None = None
    parallel_tool_calls: Any = None
    tool_choice: Any = None
    # Every offered tool's schema closed (``additionalProperties: false``): the names of the
    # arguments are fixed, though only a grammar (``tool_choice="required"``) enforces it.
    closed_schemas: bool = False
    answer_tool: str | None = None
    answered: bool = True
    argument_errors: Counter[str] = field(default_factory=Counter)
    error_examples: dict[str, str] = field(default_factory=dict)
    tool_failures: int = 0
    final_answer: str | None = None

    @property
    def tool_calls(self) -> int:
        return sum(len(turn) for turn in self.turns)

    def errors(self) -> Counter[str]:
        """Tool errors by kind: the argument errors seen in the records, and the errors the
        tools returned beyond those."""
        kinds = Counter(self.argument_errors)
        if self.tool_failures:
            kinds[TOOL_FAILED] += self.tool_failures
        return kinds


def response_tool_calls(call: LLMCall) -> list[ToolCall]:
    """The tool calls of one recorded response (any wire API: the record keeps them in the
    chat-completions shape).

    Example:
        >>> call = LLMCall(model="m", messages=[], prompt_token_ids=[], completion_token_ids=[],
        ...                logprobs=[], response_message={"role": "assistant", "tool_calls": [
        ...                    {"id": "1", "type": "function",
        ...                     "function": {"name": "add", "arguments": '{"a": 1}'}}]})
        >>> response_tool_calls(call)
        [ToolCall(name='add', arguments='{"a": 1}')]
    """
    calls = []
    for item in call.response_message.get("tool_calls") or []:
        function = item.get("function") if isinstance(item, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            continue
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments) if arguments is not None else ""
        calls.append(ToolCall(function["name"], arguments))
    return calls


def _schemas(call: LLMCall) -> dict[str, dict[str, Any]]:
    """The offered tools of a call by name: their parameters' JSON schema."""
    schemas = {}
    for tool in call.tools or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            parameters = function.get("parameters")
            schemas[function["name"]] = parameters if isinstance(parameters, dict) else {}
    return schemas


def argument_error(tool_call: ToolCall, schemas: dict[str, dict[str, Any]]) -> str | None:
    """The kind of error ``tool_call``'s arguments show against the offered ``schemas``
    (None when they fit, or when the call offered no tools to check against).

    Example:
        >>> schemas = {"lookup": {"type": "object", "properties": {"id": {"type": "string"}},
        ...                       "required": ["id"]}}
        >>> argument_error(ToolCall("lookup", '{"sku": "A1"}'), schemas)
        'invented argument'
        >>> argument_error(ToolCall("lookup", '{"id": "A1"}'), schemas) is None
        True
    """
    if not schemas:
        return None
    schema = schemas.get(tool_call.name)
    if schema is None:
        return UNKNOWN_TOOL
    try:
        arguments = json.loads(tool_call.arguments or "{}")
    except ValueError:
        return UNPARSABLE
    if not isinstance(arguments, dict):
        return UNPARSABLE
    properties = schema.get("properties")
    if isinstance(properties, dict) and properties:
        if any(name not in properties for name in arguments):
            return INVENTED
    required = schema.get("required")
    if isinstance(required, list) and any(name not in arguments for name in required):
        return MISSING
    if len(tool_call.arguments) > MAX_CHECKED_ARGUMENT_CHARS:
        return None  # names checked above; the values of an argument this big are not
    try:
        jsonschema.validate(arguments, _without_patterns(schema))
    except jsonschema.ValidationError:
        return INVALID
    except (jsonschema.SchemaError, RecursionError):
        return None  # a schema jsonschema cannot read: nothing to say about the arguments
    return None


def _without_patterns(schema: Any) -> Any:
    """``schema`` without its ``pattern`` keywords: a tool's regular expression (any agent's)
    run on model-written text can backtrack for minutes; the diagnoses do without it."""
    if isinstance(schema, dict):
        return {k: _without_patterns(v) for k, v in schema.items() if k != "pattern"}
    if isinstance(schema, list):
        return [_without_patterns(v) for v in schema]
    return schema


def _max_tokens(params: dict[str, Any]) -> int | None:
    for name in ("max_tokens_fitted", "max_completion_tokens", "max_tokens", "max_output_tokens"):
        value = params.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _answered(trajectory: Trajectory, turns: list[list[ToolCall]], answer_tool: str | None) -> bool:
    metadata = trajectory.metadata
    if "final_answer" in metadata:
        return metadata["final_answer"] is not None
    stop = metadata.get("stop_reason")
    if isinstance(stop, str):
        return stop not in _UNANSWERED_STOPS
    if not turns:
        return True
    last = turns[-1]
    # A run whose last response still called tools (other than the answer) never answered.
    return not last or (answer_tool is not None and any(c.name == answer_tool for c in last))


def rollout_facts(trajectory: Trajectory, *, answer_tool: str | None = None) -> RolloutFacts:
    """Read one rollout's facts from its recorded calls, metadata and metrics.

    ``answer_tool`` (else ``trajectory.metadata["answer_tool"]``) is the tool whose call
    gives the task's answer (art_mcp's ``complete_task``, or a tool the task declares).
    """
    metadata = trajectory.metadata
    declared = metadata.get("answer_tool")
    answer_tool = answer_tool or (declared if isinstance(declared, str) else None)
    facts = RolloutFacts(reward=float(trajectory.reward), answer_tool=answer_tool)
    for call in sorted(trajectory.calls, key=lambda c: (c.index, c.choice_index)):
        turn = response_tool_calls(call)
        facts.turns.append(turn)
        facts.finish_reasons.append(call.finish_reason)
        facts.max_tokens = _max_tokens(call.request_params) or facts.max_tokens
        if "parallel_tool_calls" in call.request_params:
            facts.parallel_tool_calls = call.request_params["parallel_tool_calls"]
        if "tool_choice" in call.request_params:
            facts.tool_choice = call.request_params["tool_choice"]
        schemas = _schemas(call)
        if schemas:
            facts.closed_schemas = all(
                s.get("additionalProperties") is False for s in schemas.values()
            )
        for tool_call in turn:
            kind = argument_error(tool_call, schemas)
            if kind in (UNPARSABLE, MISSING, INVALID) and call.finish_reason == "length":
                kind = CUT
            if kind is not None:
                facts.argument_errors[kind] += 1
                facts.error_examples.setdefault(kind, tool_call.render())
    facts.answered = _answered(trajectory, facts.turns, answer_tool)
    reported = trajectory.metrics.get("tool_errors")
    if isinstance(reported, int | float) and not isinstance(reported, bool):
        # The rollout's count includes the argument errors it caught itself: the rest are
        # errors the tools returned.
        facts.tool_failures = max(0, int(reported) - sum(facts.argument_errors.values()))
    answer = metadata.get("final_answer")
    facts.final_answer = answer if isinstance(answer, str) else None
    return facts
