"""``rollout``: one agent run on an MCP server, captured token-exactly through the gateway.

The loop: the model sees the task and the server's tools; each tool call it makes is executed
on the server and the result sent back as a ``tool`` message; the run ends with a final answer
(a message without tool calls, or a call of ``complete_task``) or after ``max_turns`` model
calls. A tool that fails, hangs or returns too much never ends the run: the model reads an
error (or a truncated result) and carries on. Only a broken server connection fails the run.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TextIO

import art_core as art
from art_mcp.scenarios import Scenario, as_scenario
from art_mcp.servers import ServerLike, parse_server
from art_mcp.session import (
    DEFAULT_MAX_RESULT_CHARS,
    DEFAULT_TOOL_TIMEOUT_S,
    McpSession,
    ServerConnectionError,
    connect,
)
from art_mcp.tools import COMPLETE_TASK, ToolSet

if TYPE_CHECKING:
    from openai import AsyncOpenAI

RewardFn = Callable[[Scenario, art.Trajectory], float | Awaitable[float]]

DEFAULT_SYSTEM_PROMPT = (
    "You are an agent that solves tasks with the tools of the {server} server. "
    "Call the tools you need, read their results, and when you are done call {finish} "
    "with the final answer."
)


@dataclass
class RolloutSettings:
    """How ``rollout`` runs the agent (all optional; the defaults suit a small model).

    ``tool_choice="required"`` makes every turn a tool call (grammar-enforced by the gateway),
    so the run ends through ``complete_task`` (or after ``max_turns`` without it): useful for
    models too small to emit tool calls on their own. ``tools`` limits the tools offered to those named.
    ``parallel_tool_calls=False`` asks for one tool call per turn (None: the server's default).
    ``strict_schemas`` closes object schemas that do not say otherwise
    (``additionalProperties: false``), so a grammar-constrained model cannot invent arguments.
    ``max_answer_chars`` bounds ``complete_task``'s answer.
    ``repeated_call_notice``: a call that repeats an earlier *successful* call of the run (same
    tool, same arguments) is not run again; its tool message gives the earlier result again
    and says to give the final answer (a failed call may be retried as often as the model
    likes). Small models repeat a lookup until the turn limit and never answer: the
    real Qwen2.5-Coder-0.5B on ``mcp-server-time`` answered 0 of 8 tasks without it and 12 of
    16 with it (greedy, ``tool_choice="required"``; ``benchmarks/learning_suite.py``). Counted
    in the ``repeated_calls`` metric. Default on; False runs every call.
    """

    max_turns: int = 6
    system_prompt: str | None = None
    tool_choice: Literal["auto", "required"] = "auto"
    complete_task: bool = True
    tools: list[str] | None = None
    parallel_tool_calls: bool | None = None
    strict_schemas: bool = True
    max_answer_chars: int | None = None
    max_tokens: int = 256
    temperature: float = 1.0
    repeated_call_notice: bool = True
    tool_timeout_s: float = DEFAULT_TOOL_TIMEOUT_S
    max_tool_result_chars: int = DEFAULT_MAX_RESULT_CHARS
    connect_timeout_s: float = 30.0
    extra_body: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if self.tool_choice not in ("auto", "required"):
            raise ValueError(f"tool_choice must be 'auto' or 'required', got {self.tool_choice!r}")


@dataclass
class _Stats:
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tool_timeouts: int = 0
    truncated_results: int = 0
    tools_used: list[str] = field(default_factory=list)
    repeated_calls: int = 0
    # Each distinct call's result, by (tool, canonical arguments).
    results: dict[tuple[str, str], str] = field(default_factory=dict)
    final_answer: str | None = None
    stop_reason: str = "max_turns"

    def metrics(self) -> dict[str, float | int | bool]:
        return {
            "turns": self.turns,
            "tool_calls": self.tool_calls,
            "tool_errors": self.tool_errors,
            "tool_timeouts": self.tool_timeouts,
            "truncated_results": self.truncated_results,
            "repeated_calls": self.repeated_calls,
            "completed": self.final_answer is not None,
        }


async def rollout(
    model: art.TrainableModel,
    scenario: Scenario | str,
    server: ServerLike,
    *,
    max_turns: int | None = None,
    reward_fn: RewardFn | None = None,
    settings: RolloutSettings | None = None,
    metadata: dict[str, Any] | None = None,
    errlog: TextIO | None = None,
) -> art.Trajectory:
    """Run the agent once on ``scenario`` against ``server``; return its trajectory.

    One MCP session is opened for the run and closed when it ends (also on failure). Each
    LLM call is tagged (``LLMCall.metadata``) with ``mcp_server``, ``mcp_transport``, ``turn``,
    ``mcp_tool_results`` (the tools whose results the call reads) and, once answered,
    ``mcp_tools_called``. The trajectory's metadata holds the scenario, ``final_answer``,
    ``stop_reason`` and ``tools_used``; its metrics count turns, tool calls and errors. The
    reward is ``reward_fn(scenario, trajectory)`` when given (e.g. a checker), else 0.0 (to be
    set later, e.g. by RULER). Raises ``ServerConnectionError`` if the server dies mid-run.

    Example:
        >>> trajectory = await art_mcp.rollout(model, "What time is it in Tokyo?",
        ...                                    "mcp-server-time", max_turns=4)  # needs a registered model  # doctest: +SKIP
        >>> trajectory.metadata["final_answer"], trajectory.metrics["tool_calls"]  # needs a registered model  # doctest: +SKIP
    """
    settings = settings or RolloutSettings()
    if max_turns is not None:
        settings = dataclasses.replace(settings, max_turns=max_turns)
    task = as_scenario(scenario)
    spec = parse_server(server)
    stats = _Stats()
    runs: list[art.Run] = []
    try:
        async with connect(
            spec, connect_timeout_s=settings.connect_timeout_s, errlog=errlog
        ) as session:
            toolset = ToolSet.from_mcp(
                session.tools,
                include=settings.tools,
                complete_task=settings.complete_task,
                strict=settings.strict_schemas,
                max_answer_chars=settings.max_answer_chars,
            )
            _check_answer_tool(task, toolset)
            run_metadata = {
                "mcp_server": spec.label,
                "mcp_transport": spec.transport,
                "scenario_id": task.id,
                **(metadata or {}),
            }
            async with art.capture(model, metadata=run_metadata) as run:
                runs.append(run)
                async with run.openai_client() as client:
                    await _loop(run, client, session, toolset, task, settings, stats)
    except ServerConnectionError as exc:
        if not runs:
            raise
        # The connection broke mid-run (over HTTP the failure may surface as the transport
        # closes): say which rollout failed and where its recorded calls are.
        raise ServerConnectionError(
            f"rollout {runs[0].rollout_id} failed: {exc}; its {len(runs[0].calls)} recorded LLM "
            "calls are kept in the model's calls.sqlite"
        ) from exc
    trajectory = run.trajectory(
        metrics=stats.metrics(), metadata=_run_metadata(task, settings, toolset, stats)
    )
    _tag_tool_calls(trajectory)
    if reward_fn is not None:
        trajectory.reward = await _score(reward_fn, task, trajectory)
    return trajectory


def _check_answer_tool(task: Scenario, toolset: ToolSet) -> None:
    if task.answer_tool is not None and task.answer_tool not in toolset.mcp_names.values():
        raise ValueError(
            f"scenario {task.id}: its answer_tool {task.answer_tool!r} is not among the "
            f"tools offered: {sorted(toolset.mcp_names.values())}"
        )


def _run_metadata(
    task: Scenario, settings: RolloutSettings, toolset: ToolSet, stats: _Stats
) -> dict[str, Any]:
    """The trajectory's metadata: the scenario, how the run ended and the tools it used."""
    return {
        "task": task.task,
        "difficulty": task.difficulty,
        "final_answer": stats.final_answer,
        "stop_reason": stats.stop_reason,
        "tools_used": stats.tools_used,
        "answer_tool": _answer_tool(task, settings, toolset),
        "max_turns": settings.max_turns,
    }


async def _loop(
    run: art.Run,
    client: AsyncOpenAI,
    session: McpSession,
    toolset: ToolSet,
    task: Scenario,
    settings: RolloutSettings,
    stats: _Stats,
) -> None:
    import openai

    finish = COMPLETE_TASK if settings.complete_task else "no tool (answer in plain text)"
    system = (settings.system_prompt or DEFAULT_SYSTEM_PROMPT).format(
        server=session.label, finish=finish
    )
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": task.task},
    ]
    results_read: list[str] = []
    for turn in range(settings.max_turns):
        extra_body = _extra_body(settings, session, turn, results_read)
        try:
            response = await client.chat.completions.create(
                model=run.model_name,
                messages=messages,  # type: ignore[arg-type]
                tools=toolset.definitions,  # type: ignore[arg-type]
                tool_choice=settings.tool_choice,
                max_tokens=settings.max_tokens,
                temperature=settings.temperature,
                extra_body=extra_body,
            )
        except openai.BadRequestError as exc:
            # The conversation outgrew the model's context: the run ends here, scored as is.
            if turn > 0 and _is_context_error(exc):
                stats.stop_reason = "context_length"
                return
            raise
        stats.turns += 1
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True, exclude_unset=True))
        if not message.tool_calls:
            if settings.tool_choice == "required":
                # A forced call that did not come out whole (cut by max_tokens): no answer.
                stats.stop_reason = "no_tool_call"
                return
            stats.final_answer = message.content or ""
            stats.stop_reason = (
                "answer" if response.choices[0].finish_reason != "length" else "length"
            )
            return
        finished, stop, results_read = await _answer_tool_calls(
            message.tool_calls, messages, session, toolset, task, settings, stats
        )
        if finished is not None:
            stats.final_answer = finished
            stats.stop_reason = stop
            return


def _extra_body(
    settings: RolloutSettings, session: McpSession, turn: int, results_read: list[str]
) -> dict[str, Any]:
    """A call's extra body: the settings', with the call's MCP metadata (its server, turn
    and the tools whose results it reads) and ``parallel_tool_calls`` when set."""
    call_metadata = {
        "mcp_server": session.label,
        "mcp_transport": session.server.transport,
        "turn": turn,
        "mcp_tool_results": results_read,
    }
    extra_body = dict(settings.extra_body)
    extra_body["metadata"] = {**extra_body.get("metadata", {}), **call_metadata}
    if settings.parallel_tool_calls is not None:
        extra_body["parallel_tool_calls"] = settings.parallel_tool_calls
    return extra_body


async def _answer_tool_calls(
    tool_calls: Sequence[Any],
    messages: list[dict[str, Any]],
    session: McpSession,
    toolset: ToolSet,
    task: Scenario,
    settings: RolloutSettings,
    stats: _Stats,
) -> tuple[str | None, str, list[str]]:
    """Run a turn's tool calls (a repeated successful call gets a notice instead) and add
    their results to ``messages``. Returns the final answer (None: the run goes on), how it
    was given, and the tools whose results the next call reads."""
    results_read: list[str] = []
    finished: str | None = None
    stop = "complete_task"
    for tool_call in tool_calls:
        function = getattr(tool_call, "function", None)
        if function is None:
            continue
        name = function.name
        if name == COMPLETE_TASK and settings.complete_task:
            finished = _answer_of(toolset, function.arguments)
            continue
        key = (name, _canonical(function.arguments))
        if settings.repeated_call_notice and key in stats.results:
            # The same successful call again: its result is already in the conversation. A
            # small model that repeats a lookup until the turn limit never answers; say so
            # instead of running the tool again.
            stats.repeated_calls += 1
            content = _repeat_notice(
                name, stats.results[key], _answer_tool(task, settings, toolset)
            )
        else:
            errors = stats.tool_errors
            content = await _execute(session, toolset, name, function.arguments, settings, stats)
            if stats.tool_errors == errors:  # a failed call may be worth retrying
                stats.results[key] = content
        messages.append({"role": "tool", "tool_call_id": tool_call.id, "content": content})
        results_read.append(name)
        if task.answer_tool is not None and toolset.mcp_names.get(name) == task.answer_tool:
            # The task's own answer tool was called (and run, so the server saw it).
            finished, stop = _answer_of(toolset, function.arguments), "answer_tool"
    return finished, stop, results_read


async def _execute(
    session: McpSession,
    toolset: ToolSet,
    name: str,
    raw_arguments: str | None,
    settings: RolloutSettings,
    stats: _Stats,
) -> str:
    stats.tool_calls += 1
    mcp_name = toolset.mcp_names.get(name)
    if mcp_name is None:
        stats.tool_errors += 1
        return f"Error: there is no tool named {name!r}; the tools are {toolset.names}"
    try:
        arguments = toolset.parse_arguments(raw_arguments)
    except ValueError as exc:
        stats.tool_errors += 1
        return f"Error: cannot call {name!r}: {exc}"
    stats.tools_used.append(mcp_name)
    output = await session.call_tool(
        mcp_name,
        arguments,
        timeout_s=settings.tool_timeout_s,
        max_result_chars=settings.max_tool_result_chars,
    )
    stats.tool_errors += int(output.is_error)
    stats.tool_timeouts += int(output.timed_out)
    stats.truncated_results += int(output.truncated)
    return output.text


def _canonical(raw_arguments: str | None) -> str:
    """Arguments as canonical JSON (key order and spacing do not make a call different)."""
    try:
        return json.dumps(json.loads(raw_arguments or "{}"), sort_keys=True)
    except ValueError:
        return raw_arguments or ""


def _repeat_notice(name: str, result: str, answer_tool: str | None) -> str:
    """What a repeated call gets instead of running again: the earlier result once more, and
    what to do next. The result comes last but one: a small model that copies from the latest
    message then copies the data, not the instruction (with the instruction last and no
    result, the real Qwen2.5-0.5B answered "Error: git_log was already called ...").

    Example:
        >>> print(_repeat_notice("add", "5", "complete_task"))
        You already called add with these arguments. Its result was:
        5
        Do not call it again: call complete_task with the final answer.
        >>> _repeat_notice("add", "5", None).splitlines()[-1]
        'Do not call it again: give the final answer.'
    """
    finish = f"call {answer_tool} with the final answer" if answer_tool else "give the final answer"
    return (
        f"You already called {name} with these arguments. Its result was:\n{result}\n"
        f"Do not call it again: {finish}."
    )


def _answer_tool(task: Scenario, settings: RolloutSettings, toolset: ToolSet) -> str | None:
    """The tool whose call gives the answer, as the model sees its name (None: plain text)."""
    if task.answer_tool is not None:
        seen_as = [name for name, mcp in toolset.mcp_names.items() if mcp == task.answer_tool]
        return seen_as[0] if seen_as else task.answer_tool
    return COMPLETE_TASK if settings.complete_task else None


def _answer_of(toolset: ToolSet, raw_arguments: str | None) -> str:
    try:
        arguments = toolset.parse_arguments(raw_arguments)
    except ValueError:
        return raw_arguments or ""
    if "answer" not in arguments:  # a task's own answer tool: its arguments are the answer
        return json.dumps(arguments, sort_keys=True)
    answer = arguments["answer"]
    return answer if isinstance(answer, str) else json.dumps(answer)


def _is_context_error(exc: Exception) -> bool:
    body = getattr(exc, "body", None)
    code = body.get("code") if isinstance(body, dict) else None
    return code == "context_length_exceeded" or "maximum context length" in str(exc)


def _tag_tool_calls(trajectory: art.Trajectory) -> None:
    """Add the tools each call asked for (known only once it answered) to its metadata."""
    for call in trajectory.calls:
        names = [
            c.get("function", {}).get("name")
            for c in call.response_message.get("tool_calls") or []
            if isinstance(c, dict)
        ]
        call.metadata["mcp_tools_called"] = [n for n in names if n]


async def _score(reward_fn: RewardFn, scenario: Scenario, trajectory: art.Trajectory) -> float:
    value = reward_fn(scenario, trajectory)
    if inspect.isawaitable(value):
        value = await value
    reward = float(value)
    if reward != reward or reward in (float("inf"), float("-inf")):
        raise ValueError(
            f"reward_fn returned {value!r} for scenario {scenario.id}: not a finite number"
        )
    return reward
