"""``wrap_rollout(model, fn)``: run a rollout function under a fresh rollout, get its trajectory.

The contract: ``fn`` is an async function that runs the graph and returns its outcome, one of

- a reward (``float`` / ``int`` / ``bool``): the trajectory gets this reward;
- an ``art.Trajectory`` (ART style, e.g. ``art.Trajectory(reward=r, metrics={...})``): its
  reward, metrics, metadata and logs are kept, and the captured calls are filled in;
- ``None``: reward 0.0 (score the group later, e.g. with RULER).

The wrapper always returns an ``art.Trajectory`` holding every LLM call made while ``fn`` ran,
in issue order, each tagged with the LangGraph node that made it.
"""

from __future__ import annotations

import functools
import inspect
import itertools
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec

import art_core as art

P = ParamSpec("P")

Outcome = art.Trajectory | float | int | bool | None


def trajectory_from(run: art.Run, outcome: object) -> art.Trajectory:
    """The trajectory of a finished ``run``, given what the rollout function returned.

    Example:
        >>> trajectory_from(run, 1.0).reward  # needs a registered model: a finished `run` of one  # doctest: +SKIP
        1.0
    """
    if isinstance(outcome, art.Trajectory):
        captured = run.calls
        known = {call.id for call in outcome.calls}
        # Calls the function put on its trajectory itself (e.g. from an inner capture) stay.
        calls = [*outcome.calls, *(c for c in captured if c.id not in known)]
        tools = outcome.tools or next((c.tools for c in reversed(calls) if c.tools), None)
        return outcome.model_copy(
            update={
                "id": run.rollout_id,
                "calls": calls,
                "tools": tools,
                "metadata": {**run.metadata, **outcome.metadata},
                "start_time": run.start_time,
                "end_time": run.end_time,
            }
        )
    if outcome is None:
        return run.trajectory(reward=0.0)
    if isinstance(outcome, int | float):
        return run.trajectory(reward=float(outcome))
    raise TypeError(
        "a rollout function wrapped by wrap_rollout must return a reward (float), an "
        f"art.Trajectory or None, not {type(outcome).__name__}"
    )


def wrap_rollout(
    model: art.TrainableModel,
    fn: Callable[P, Awaitable[Outcome]],
    *,
    metadata: dict[str, Any] | None = None,
    sampling: art.RolloutSampling | None = None,
) -> Callable[P, Awaitable[art.Trajectory]]:
    """Wrap an async rollout function: each call runs in a fresh rollout of ``model``.

    Concurrent calls never mix: the rollout is held in a context variable, which LangGraph
    carries into its nodes, tools, subgraphs and thread-pooled sync nodes. ``metadata`` is
    copied onto every trajectory. ``sampling`` (``art.RolloutSampling``) applies to every call
    of every rollout; with a seed, the k-th rollout this wrapper starts (0, 1, 2...) gets
    ``sampling.for_run(k)``: the rollouts of a group differ, and a run that starts its
    rollouts in the same order replays them.

    Example:
        >>> import art_core as art
        >>> import art_langgraph
        >>> from langchain.agents import create_agent  # the `agents` extra
        >>> model = art.TrainableModel(name="agent-001", project="demo", base_model="tiny-random")
        >>> llm = art_langgraph.init_chat_model()
        >>> agent = create_agent(llm, tools=[])
        >>> async def run_agent(question: str) -> float:
        ...     state = await agent.ainvoke({"messages": [("user", question)]})
        ...     return float("Paris" in state["messages"][-1].content)
        >>> rollout = wrap_rollout(model, run_agent)
        >>> trajectory = await rollout("Capital of France?")  # needs a registered model: `model` registered with a backend  # doctest: +SKIP
    """
    if not isinstance(model, art.TrainableModel):
        raise TypeError(f"wrap_rollout needs an art.TrainableModel, not {type(model).__name__}")
    if not callable(fn):
        raise TypeError(f"wrap_rollout needs an async function, not {type(fn).__name__}")

    if sampling is not None and not isinstance(sampling, art.RolloutSampling):
        raise TypeError(f"sampling must be an art.RolloutSampling, not {type(sampling).__name__}")
    started = itertools.count()  # this wrapper's rollouts, in the order they start

    @functools.wraps(fn)
    async def rollout(*args: P.args, **kwargs: P.kwargs) -> art.Trajectory:
        settings = None if sampling is None else sampling.for_run(next(started))
        async with art.capture(model, metadata=metadata, sampling=settings) as run:
            pending = fn(*args, **kwargs)
            if not inspect.isawaitable(pending):
                raise TypeError(
                    f"wrap_rollout needs an async function; {getattr(fn, '__name__', fn)!r} "
                    f"returned {type(pending).__name__}"
                )
            outcome = await pending
        return trajectory_from(run, outcome)

    return rollout
