"""The rules: each reads a step's records and fires past a stated threshold, naming the setting
that would change what it found.

Each rule is a function ``(StepFacts) -> Diagnosis | None``. The thresholds are shares (of
rollouts, tool calls or groups) chosen so that a run that learns does not trip them; each is a
module constant, documented where it is defined. ``RULES`` is the order they are reported in:
the most specific cause first, the generic "groups all equal" last.

Settings are named as the art_mcp integration spells them (``RolloutSettings`` fields and
``art-core mcp train`` flags), and as the request parameter any other agent can send.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from art_core.diagnoses.diagnosis import Diagnosis
from art_core.diagnoses.facts import (
    CUT,
    INVALID,
    INVENTED,
    MISSING,
    TOOL_FAILED,
    UNKNOWN_TOOL,
    UNPARSABLE,
    RolloutFacts,
    ToolCall,
)

# The answer tool called in the same response as another tool, in at least this share of the
# rollouts that called the answer tool: the answer was written before the other tool's result
# came back, so it is a guess (seen with Qwen2.5-0.5B on a PyPI MCP server: every run did it).
ANSWER_WITH_LOOKUP_SHARE = 0.25
# Tool calls that failed (argument errors in the records, or errors the tool returned), as a
# share of all tool calls, with at least MIN_TOOL_CALLS calls to judge from.
TOOL_ERROR_SHARE = 0.25
MIN_TOOL_CALLS = 4
# Rollouts that ended without an answer after making the same call (same tool, same
# arguments) at least REPEATS times.
REPEATED_CALL_SHARE = 0.25
REPEATS = 2
# Rollouts with at least one response cut at the token limit (finish_reason "length").
TRUNCATED_SHARE = 0.2
# Groups whose rewards were all equal below the step's best reward (tasks the model never
# solves at this group size: nothing for GRPO to learn from), counting the all-equal groups
# dynamic sampling discarded, when the rewards do vary across groups. All-equal groups at the
# best reward are solved tasks, not a problem.
ALL_EQUAL_GROUP_SHARE = 0.5
# Every rollout of the step got the same reward: needs at least this many rollouts.
MIN_ROLLOUTS_FOR_CONSTANT = 4


@dataclass
class StepFacts:
    """A step's rollouts by group, and the groups dynamic sampling discarded before it.

    Example:
        >>> step = StepFacts([[RolloutFacts(reward=0.0), RolloutFacts(reward=1.0)]])
        >>> step.rollouts, step.groups_all_equal
        (2, 0)
    """

    groups: list[list[RolloutFacts]]
    discarded_all_equal: int = 0

    @property
    def runs(self) -> list[RolloutFacts]:
        return [facts for group in self.groups for facts in group]

    @property
    def rollouts(self) -> int:
        return sum(len(group) for group in self.groups)

    @property
    def groups_all_equal(self) -> int:
        return sum(1 for group in self.groups if _all_equal(group))

    @property
    def groups_all_equal_unsolved(self) -> int:
        """All-equal groups below the step's best reward (the rest are solved tasks)."""
        best = max((f.reward for f in self.runs), default=0.0)
        return sum(
            1 for group in self.groups if _all_equal(group) and group[0].reward < best - 1e-9
        )


def _all_equal(group: list[RolloutFacts]) -> bool:
    return len(group) >= 2 and max(f.reward for f in group) - min(f.reward for f in group) <= 1e-9


def _share(count: int, total: int) -> float:
    return count / total if total else 0.0


def _one_call_setting(hits: list[tuple[RolloutFacts, list[ToolCall]]]) -> str:
    """One call per turn; where it was asked for already, how to have it enforced."""
    if all(f.parallel_tool_calls is False for f, _ in hits):
        # Asked for, not enforced: under tool_choice "auto" the gateway samples free text,
        # and the model wrote several calls anyway (seen with Qwen2.5-0.5B).
        choices = ", ".join(sorted({repr(f.tool_choice) for f, _ in hits}))
        return (
            f"parallel_tool_calls=False was asked for but tool_choice {choices} does not enforce "
            "it: tool_choice='required' with parallel_tool_calls=False makes the gateway's "
            "grammar allow one call per turn (art_mcp: --tool-choice required "
            "--one-call-per-turn)"
        )
    return (
        "ask for one tool call per turn: parallel_tool_calls=False "
        "(art_mcp: RolloutSettings(parallel_tool_calls=False), --one-call-per-turn)"
    )


def answer_with_lookup(step: StepFacts) -> Diagnosis | None:
    """The answer tool called in the same turn as another tool (``ANSWER_WITH_LOOKUP_SHARE``)."""
    answering = [
        f
        for f in step.runs
        if f.answer_tool and any(c.name == f.answer_tool for turn in f.turns for c in turn)
    ]
    hits = []
    for facts in answering:
        for turn in facts.turns:
            names = [c.name for c in turn]
            if facts.answer_tool in names and any(n != facts.answer_tool for n in names):
                hits.append((facts, turn))
                break
    share = _share(len(hits), len(answering))
    if not hits or share < ANSWER_WITH_LOOKUP_SHARE:
        return None
    facts, turn = hits[0]
    others = sorted({c.name for c in turn if c.name != facts.answer_tool})
    requested = {repr(f.parallel_tool_calls) for f, _ in hits}
    return Diagnosis(
        code="answer_with_lookup",
        finding=(
            f"in {len(hits)} of {len(answering)} runs that answered, the answer tool "
            f"{facts.answer_tool} was called in the same turn as {', '.join(others)}, before "
            "that result came back: the answer is a guess "
            f"(parallel_tool_calls requested: {', '.join(sorted(requested))})"
        ),
        setting=_one_call_setting(hits),
        share=share,
        threshold=ANSWER_WITH_LOOKUP_SHARE,
    )


_ERROR_SETTINGS = {
    CUT: "raise max_tokens: the calls were cut before their arguments ended "
    "(art_mcp: RolloutSettings(max_tokens=...), --max-tokens)",
    UNKNOWN_TOOL: "constrain calls to the offered tools with a grammar: tool_choice='required' "
    "(art_mcp: --tool-choice required)",
    UNPARSABLE: "constrain the arguments to their schema with a grammar: tool_choice='required' "
    "(art_mcp: --tool-choice required with strict_schemas=True)",
    INVALID: "constrain the arguments to their schema with a grammar: tool_choice='required' "
    "(art_mcp: --tool-choice required with strict_schemas=True)",
    MISSING: "constrain the arguments to their schema with a grammar: tool_choice='required' "
    "(art_mcp: --tool-choice required with strict_schemas=True)",
    TOOL_FAILED: "the arguments fit the schema but the tool rejects their values (invented ids, "
    "names): give the valid values in the task or the tool's description, or warm-start from "
    "runs that succeed (art_mcp: --warm-start)",
}
_INVENTED_SETTING = (
    "close the schemas so a grammar forbids made-up argument names: strict_schemas=True and "
    "tool_choice='required' (art_mcp: RolloutSettings(strict_schemas=True), --tool-choice required)"
)
# The schemas were closed already: the model wrote names they forbid because nothing
# enforced them (tool_choice "auto" leaves the call's text free).
_INVENTED_CLOSED_SETTING = (
    "the schemas are closed (additionalProperties: false) but tool_choice {choice} does not "
    "enforce them: tool_choice='required' makes the gateway's grammar allow only their "
    "arguments (art_mcp: --tool-choice required)"
)


def tool_errors(step: StepFacts) -> Diagnosis | None:
    """Tool calls that failed, by kind (``TOOL_ERROR_SHARE`` of at least ``MIN_TOOL_CALLS``)."""
    calls = sum(f.tool_calls for f in step.runs)
    kinds: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for facts in step.runs:
        kinds.update(facts.errors())
        for kind, example in facts.error_examples.items():
            examples.setdefault(kind, example)
    errors = sum(kinds.values())
    share = _share(errors, calls)
    if calls < MIN_TOOL_CALLS or share < TOOL_ERROR_SHARE:
        return None
    parts = []
    for kind, count in kinds.most_common():
        example = f", e.g. {examples[kind]}" if kind in examples else ""
        parts.append(f"{kind} {count}{example}")
    top = kinds.most_common(1)[0][0]
    setting = _ERROR_SETTINGS.get(top, _INVENTED_SETTING)
    runs = step.runs
    if top == INVENTED and runs and all(f.closed_schemas for f in runs):
        choices = sorted({repr(f.tool_choice) for f in runs})
        if choices != ["'required'"]:
            setting = _INVENTED_CLOSED_SETTING.format(choice=", ".join(choices))
    return Diagnosis(
        code="tool_errors",
        finding=f"{errors} of {calls} tool calls failed: " + "; ".join(parts),
        setting=setting,
        share=share,
        threshold=TOOL_ERROR_SHARE,
        unit="tool calls",
    )


def repeated_calls(step: StepFacts) -> Diagnosis | None:
    """The same call repeated until the run ended unanswered (``REPEATED_CALL_SHARE``)."""
    looping = []
    for facts in step.runs:
        if facts.answered:
            continue
        counts = Counter(c.key() for turn in facts.turns for c in turn)
        repeated = [key for key, n in counts.items() if n >= REPEATS]
        if repeated:
            example = next(c for turn in facts.turns for c in turn if c.key() == repeated[0])
            looping.append((facts, example, counts[repeated[0]]))
    share = _share(len(looping), step.rollouts)
    if not looping or share < REPEATED_CALL_SHARE:
        return None
    _, example, times = looping[0]
    answer = looping[0][0].answer_tool
    finish = f"call {answer}" if answer else "answer"
    return Diagnosis(
        code="repeated_calls",
        finding=(
            f"{len(looping)} of {step.rollouts} runs repeated the same call until the turn "
            f"limit without answering (e.g. {example.render()} {times} times)"
        ),
        setting=(
            "warm-start from runs that answer (art_mcp: --warm-start, SFT on a teacher's or "
            "the model's own successful runs); answer a repeated call with a notice instead of "
            "running it again (art_mcp: RolloutSettings.repeated_call_notice, on by default), "
            f"or say in the system prompt to {finish} once the result is read "
            "(--system-prompt); dynamic_sampling keeps the rare groups that answer"
        ),
        share=share,
        threshold=REPEATED_CALL_SHARE,
    )


def truncated(step: StepFacts) -> Diagnosis | None:
    """Responses cut at the token limit (``TRUNCATED_SHARE`` of rollouts)."""
    cut = [f for f in step.runs if "length" in f.finish_reasons]
    share = _share(len(cut), step.rollouts)
    if not cut or share < TRUNCATED_SHARE:
        return None
    limits = sorted({f.max_tokens for f in cut if f.max_tokens is not None})
    now = f" ({', '.join(map(str, limits))})" if limits else ""
    return Diagnosis(
        code="truncated",
        finding=f"{len(cut)} of {step.rollouts} runs had a response cut by max_tokens{now}",
        setting="raise max_tokens (art_mcp: RolloutSettings(max_tokens=...), --max-tokens)",
        share=share,
        threshold=TRUNCATED_SHARE,
    )


def constant_reward(step: StepFacts) -> Diagnosis | None:
    """Every rollout of the step got the same reward (at least ``MIN_ROLLOUTS_FOR_CONSTANT``)."""
    rewards = [f.reward for f in step.runs]
    if len(rewards) < MIN_ROLLOUTS_FOR_CONSTANT or max(rewards) - min(rewards) > 1e-9:
        return None
    answers = {f.final_answer for f in step.runs if f.final_answer is not None}
    differed = (
        f"; their final answers differed ({len(answers)} distinct), so the reward does not "
        "read them or none is right"
        if len(answers) > 1
        else ""
    )
    return Diagnosis(
        code="constant_reward",
        finding=(f"every one of the {len(rewards)} runs got reward {rewards[0]:g}{differed}"),
        setting=(
            "if that is the full reward, the tasks are solved: harder ones; else check the "
            "reward function on a run you know is right (and one you know is wrong), and if no "
            "run can earn it yet, make the tasks easier, give partial credit, or warm-start "
            "(art_mcp: --warm-start)"
        ),
        share=1.0,
        threshold=1.0,
    )


def all_equal_groups(step: StepFacts) -> Diagnosis | None:
    """Most groups all-equal below the best reward, while the rewards vary across groups
    (``ALL_EQUAL_GROUP_SHARE``)."""
    groups = len(step.groups) + step.discarded_all_equal
    equal = step.groups_all_equal_unsolved + step.discarded_all_equal
    share = _share(equal, groups)
    if not equal or share < ALL_EQUAL_GROUP_SHARE or constant_reward(step) is not None:
        return None
    discarded = (
        f", {step.discarded_all_equal} of them discarded by dynamic sampling"
        if step.discarded_all_equal
        else ""
    )
    return Diagnosis(
        code="all_equal_groups",
        finding=(
            f"{equal} of {groups} groups had all-equal rewards below the best one{discarded} "
            "(nothing to learn from them): those tasks are all-or-nothing for the model at "
            "this group size"
        ),
        setting=(
            "more rollouts per group (art_mcp: --rollouts-per-group, --max-group-size), "
            "dynamic sampling (--dynamic-sampling) or a curriculum (--curriculum)"
        ),
        share=share,
        threshold=ALL_EQUAL_GROUP_SHARE,
        unit="groups",
    )


Rule = Callable[[StepFacts], Diagnosis | None]
RULES: list[Rule] = [
    answer_with_lookup,
    tool_errors,
    repeated_calls,
    truncated,
    constant_reward,
    all_equal_groups,
]
