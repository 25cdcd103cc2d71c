"""``capture(model)``: one rollout of agent code, with the SDK's spans and an agent filter.

It opens ``art.capture(model)`` (a fresh rollout id; every call through ``ArtModelProvider``
lands in it) and a span log for the SDK's tracing, and builds the trajectory: the calls of
the agents chosen for training, plus what the run did (agents, tool calls and outputs,
handoffs, guardrails, MCP servers, spans) in ``trajectory.metadata["openai_agents"]``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from agents.result import RunResultBase
from pydantic import BaseModel

import art_core as art
from art_openai_agents.filtering import AgentFilter, check_agent_filter, split_calls
from art_openai_agents.spans import SpanLog, span_log_scope
from art_openai_agents.summary import run_summary

METADATA_KEY = "openai_agents"


def _plain(value: Any) -> Any:
    """A final output as JSON (structured outputs are pydantic models or dataclasses)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return str(value)


class AgentsRun:
    """One captured rollout of agent code: the core ``Run`` plus the SDK's spans.

    Example:
        >>> async with capture(model, train_agents=["writer"]) as run:  # needs a registered model: `model`, an `agent`, its `config`  # doctest: +SKIP
        ...     run.result = await Runner.run(agent, "hi", run_config=config)
        >>> run.trajectory(reward=1.0).calls  # only the writer's calls  # needs a registered model  # doctest: +SKIP
    """

    def __init__(self, run: art.Run, spans: SpanLog, train_agents: AgentFilter) -> None:
        self.run = run
        self.spans = spans
        self.train_agents = train_agents
        # Set it to the RunResult to add the final output and last agent to the metadata.
        self.result: RunResultBase | None = None

    @property
    def rollout_id(self) -> str:
        return self.run.rollout_id

    @property
    def base_url(self) -> str:
        return self.run.base_url

    def summary(self) -> dict[str, Any]:
        """What the run did so far, from its spans (and its result, once set)."""
        summary = run_summary(self.spans)
        if self.result is not None:
            summary["final_output"] = _plain(self.result.final_output)
            summary["last_agent"] = self.result.last_agent.name
        return summary

    def trajectory(
        self,
        reward: float = 0.0,
        *,
        metrics: dict[str, float | int | bool] | None = None,
        metadata: dict[str, Any] | None = None,
        logs: list[str] | None = None,
    ) -> art.Trajectory:
        """The trajectory: the trained agents' calls in issue order, and the run's summary.

        Example:
            >>> run.trajectory(reward=1.0, metrics={"turns": 3})  # needs a registered model: a captured `run`  # doctest: +SKIP
        """
        full = self.run.trajectory(reward, metrics=metrics, metadata=metadata, logs=logs)
        kept, left_out = split_calls(full.calls, self.train_agents)
        summary = self.summary()
        summary["trained_agents"] = sorted({str(c.metadata.get("agent")) for c in kept})
        summary["excluded_calls"] = left_out
        notes = [
            f"call {c['index']} of agent {c['agent']!r} is not trained (train_agents)"
            for c in left_out
        ]
        return full.model_copy(
            update={
                "calls": kept,
                "tools": next((c.tools for c in reversed(kept) if c.tools), None),
                "metadata": {**full.metadata, METADATA_KEY: summary},
                "logs": [*full.logs, *notes],
            }
        )


@asynccontextmanager
async def capture(
    model: art.TrainableModel,
    *,
    train_agents: AgentFilter = None,
    metadata: dict[str, Any] | None = None,
    rollout_id: str | None = None,
) -> AsyncIterator[AgentsRun]:
    """Capture one rollout of agent code run with ``ArtModelProvider(model)``.

    ``train_agents``: the agent names whose calls are trained (or a predicate on the name);
    None trains every call the run made through the trainable model.

    Example:
        >>> async with art_openai_agents.capture(model) as run:  # needs a registered model: `model`, an `agent`, its `config`  # doctest: +SKIP
        ...     result = await Runner.run(agent, "hi", run_config=config)
        >>> trajectory = run.trajectory(reward=score(result))  # needs a registered model  # doctest: +SKIP
    """
    check_agent_filter(train_agents)
    log = SpanLog()
    async with art.capture(model, rollout_id=rollout_id, metadata=metadata) as run:
        with span_log_scope(log):
            yield AgentsRun(run, log, train_agents)
