"""Choose which agents' calls are trained in a multi-agent run.

Calls are tagged with their agent's name (``call.metadata["agent"]``). ``train_agents`` keeps
the calls of the named agents (or those a predicate accepts) in ``trajectory.calls``, which is
what the trainer reads; the others are listed in the trajectory's metadata and logs.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from art_core import LLMCall

AgentFilter = Collection[str] | Callable[[str | None], bool] | None


def check_agent_filter(train_agents: AgentFilter) -> AgentFilter:
    """Validate ``train_agents`` early, with a clear error for the common slip of one string.

    Example:
        >>> check_agent_filter(["triage"])
        ['triage']
    """
    if isinstance(train_agents, str):
        raise TypeError(
            f"train_agents must be a collection of agent names, e.g. [{train_agents!r}], "
            "or a predicate; not a single string"
        )
    if train_agents is not None and not callable(train_agents):
        if not all(isinstance(name, str) for name in train_agents):
            raise TypeError("train_agents must hold agent names (strings)")
    return train_agents


def is_trained(call: LLMCall, train_agents: AgentFilter) -> bool:
    """Whether ``call`` is trained under ``train_agents`` (None: every call)."""
    if train_agents is None:
        return True
    agent = call.metadata.get("agent")
    if callable(train_agents):
        return bool(train_agents(agent))
    return agent in train_agents


def split_calls(
    calls: list[LLMCall], train_agents: AgentFilter
) -> tuple[list[LLMCall], list[dict[str, Any]]]:
    """(trained calls, a JSON summary of the calls left out).

    Example:
        >>> split_calls([], ["triage"])
        ([], [])
    """
    kept: list[LLMCall] = []
    left_out: list[dict[str, Any]] = []
    for call in calls:
        if is_trained(call, train_agents):
            kept.append(call)
        else:
            left_out.append(
                {
                    "call_id": call.id,
                    "index": call.index,
                    "agent": call.metadata.get("agent"),
                    "completion_tokens": call.num_completion_tokens,
                }
            )
    return kept, left_out
