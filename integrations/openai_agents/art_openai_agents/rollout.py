"""``rollout(model, agent, input)`` and ``@wrap_rollout(model)``: an agent run as a trajectory.

``rollout`` runs ``Runner.run`` (or ``Runner.run_streamed``, consumed to the end) under a
fresh rollout and returns its trajectory, scored by an optional reward function of the
``RunResult``. ``wrap_rollout`` turns any async function that runs agents and returns a reward
into one that returns the trajectory.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, overload

from agents import Agent, RunConfig, Runner
from agents.models.interface import Model
from agents.models.multi_provider import MultiProvider
from agents.result import RunResultBase
from agents.run import DEFAULT_MAX_TURNS

import art_core as art
from art_openai_agents.capture import AgentsRun, capture
from art_openai_agents.filtering import AgentFilter
from art_openai_agents.model import ArtModel
from art_openai_agents.provider import ArtModelProvider
from art_openai_agents.tracing import tracing_installed

P = ParamSpec("P")
RewardFn = Callable[[RunResultBase], float | Awaitable[float]]
RolloutFn = Callable[P, Awaitable[float | int | bool | None]]


def run_config(model: art.TrainableModel, **kwargs: Any) -> RunConfig:
    """A ``RunConfig`` whose agents are served by ``model`` (``ArtModelProvider(model)``).

    Example:
        >>> config = run_config(model, max_turns=4)  # needs a registered model: `model`, an `agent`  # doctest: +SKIP
        >>> await Runner.run(agent, "hi", run_config=config)  # needs a registered model  # doctest: +SKIP
    """
    return RunConfig(model_provider=ArtModelProvider(model), **kwargs)


def _resolve_config(
    model: art.TrainableModel, config: RunConfig | None, provider: ArtModelProvider | None
) -> tuple[RunConfig, ArtModelProvider | None]:
    """The run config to use, and the provider created for this rollout (to close after)."""
    config = config or RunConfig()
    if isinstance(config.model, Model) and not isinstance(config.model, ArtModel):
        raise ValueError(
            "run_config.model is a Model instance: it would serve every agent instead of the "
            "trainable model; leave run_config.model unset"
        )
    if provider is not None:
        return dataclasses.replace(config, model_provider=provider), None
    # An explicit provider in the config is the user's choice; the SDK's default is replaced.
    if type(config.model_provider) is not MultiProvider:
        return config, None
    owned = ArtModelProvider(model, configure_tracing=not tracing_installed())
    return dataclasses.replace(config, model_provider=owned), owned


def _usage_metrics(result: RunResultBase) -> dict[str, float | int | bool]:
    usage = result.context_wrapper.usage
    return {
        "requests": usage.requests,
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
    }


async def _reward_of(reward: RewardFn | None, result: RunResultBase) -> float:
    if reward is None:
        return 0.0
    value = reward(result)
    if inspect.isawaitable(value):
        value = await value
    return float(value)


async def rollout(
    model: art.TrainableModel,
    agent: Agent[Any],
    input: str | list[Any],
    *,
    reward: RewardFn | None = None,
    run_config: RunConfig | None = None,
    provider: ArtModelProvider | None = None,
    context: Any = None,
    max_turns: int = DEFAULT_MAX_TURNS,
    stream: bool = False,
    train_agents: AgentFilter = None,
    metadata: dict[str, Any] | None = None,
    **run_kwargs: Any,
) -> art.Trajectory:
    """Run ``agent`` on ``input`` as one rollout and return its trajectory.

    Every model call of every agent (handoffs, agents as tools, guardrail agents run with the
    same provider) is served by ``model`` and recorded; ``trajectory.metadata["openai_agents"]``
    holds the tool calls and outputs, handoffs, guardrails and MCP servers. ``reward`` scores
    the ``RunResult`` (sync or async). ``stream=True`` uses ``Runner.run_streamed``.
    ``train_agents`` keeps only these agents' calls for training. Other keyword arguments go
    to ``Runner.run`` (``hooks``, ``session``, ...).

    Example:
        >>> trajectory = await rollout(model, triage_agent, "Weather in Paris?",
        ...                            reward=lambda result: float("sunny" in str(result.final_output)))  # needs a registered model: `model`, `triage_agent`  # doctest: +SKIP
    """
    if not isinstance(agent, Agent):
        raise TypeError(f"agent must be an agents.Agent, got {type(agent).__name__}")
    config, owned = _resolve_config(model, run_config, provider)
    # "agent_name" names the rollout in the project's tracing (its invoke_agent span).
    metadata = {"agent_name": agent.name, **(metadata or {})}
    try:
        async with capture(model, train_agents=train_agents, metadata=metadata) as run:
            result = await _run(agent, input, config, context, max_turns, stream, run_kwargs)
            run.result = result
    finally:
        if owned is not None:
            await owned.aclose()
    return run.trajectory(reward=await _reward_of(reward, result), metrics=_usage_metrics(result))


async def _run(
    agent: Agent[Any],
    input: str | list[Any],
    config: RunConfig,
    context: Any,
    max_turns: int,
    stream: bool,
    run_kwargs: dict[str, Any],
) -> RunResultBase:
    kwargs = dict(context=context, max_turns=max_turns, run_config=config, **run_kwargs)
    if not stream:
        return await Runner.run(agent, input, **kwargs)
    streamed = Runner.run_streamed(agent, input, **kwargs)
    # The run advances as its events are consumed; errors (max turns, tripwires) raise here.
    async for _ in streamed.stream_events():
        pass
    return streamed


@overload
def wrap_rollout(
    model: art.TrainableModel,
    fn: None = None,
    *,
    train_agents: AgentFilter = None,
    metadata: dict[str, Any] | None = None,
) -> Callable[[RolloutFn[P]], Callable[P, Awaitable[art.Trajectory]]]: ...


@overload
def wrap_rollout(
    model: art.TrainableModel,
    fn: RolloutFn[P],
    *,
    train_agents: AgentFilter = None,
    metadata: dict[str, Any] | None = None,
) -> Callable[P, Awaitable[art.Trajectory]]: ...


def wrap_rollout(
    model: art.TrainableModel,
    fn: RolloutFn[P] | None = None,
    *,
    train_agents: AgentFilter = None,
    metadata: dict[str, Any] | None = None,
) -> Any:
    """Make an async function that runs agents and returns a reward return a trajectory.

    The function runs inside a fresh rollout (use ``ArtModelProvider(model)`` in its
    ``RunConfig``); its return value (a number, or None for 0) is the reward.

    Example:
        >>> config = RunConfig(model_provider=ArtModelProvider(model))  # needs a registered model: `model`, an `agent`  # doctest: +SKIP
        >>> @wrap_rollout(model)
        ... async def solve(question: str) -> float:
        ...     result = await Runner.run(agent, question, run_config=config)
        ...     return float(result.final_output == "42")  # needs a registered model  # doctest: +SKIP
        >>> trajectory = await solve("6 x 7?")  # needs a registered model  # doctest: +SKIP
    """

    def decorate(function: RolloutFn[P]) -> Callable[P, Awaitable[art.Trajectory]]:
        if not inspect.iscoroutinefunction(function):
            raise TypeError(f"wrap_rollout needs an async function, got {function!r}")

        @functools.wraps(function)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> art.Trajectory:
            async with capture(model, train_agents=train_agents, metadata=metadata) as run:
                value = await function(*args, **kwargs)
            return _trajectory_with_reward(run, value, function)

        return wrapper

    return decorate(fn) if fn is not None else decorate


def _trajectory_with_reward(run: AgentsRun, value: object, function: object) -> art.Trajectory:
    if value is None:
        return run.trajectory()
    if isinstance(value, int | float):  # bool is an int
        return run.trajectory(reward=float(value))
    raise TypeError(
        f"{getattr(function, '__name__', function)!r} returned {type(value).__name__}: a "
        "function wrapped by wrap_rollout returns its reward (a number) or None"
    )
