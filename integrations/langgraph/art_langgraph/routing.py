"""Where one chat-model call goes: the current rollout's base URL, or the model's plain URL.

The decision is made at call time, from ``art_core.current_run()`` (a context variable), so a
chat model built once serves any number of concurrent rollouts: each call lands in the rollout
of the task or thread that made it.
"""

from __future__ import annotations

from dataclasses import dataclass

import art_core as art


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible endpoint for one call, and the rollout it is recorded under."""

    base_url: str
    api_key: str
    model_name: str
    rollout_id: str | None = None


def follows_run(run: art.Run, model: art.Model | None, model_name: str | None) -> bool:
    """Whether a chat model bound to ``model`` / ``model_name`` belongs to ``run``'s rollout.

    A chat model with no model of its own follows any rollout. One bound to another model (a
    frozen judge node, another trainable model) is not recorded in this rollout: its calls are
    not samples of the policy being trained.

    Example:
        >>> follows_run(run, None, None)  # needs a registered model: a `run` of one  # doctest: +SKIP
        True
    """
    if model is not None and model is not run.model:
        if not (model.trainable and model.name == run.model.name):
            return False
    if model_name is not None and model_name.partition("@")[0] != run.model.name:
        return False
    return True


def resolve_endpoint(model: art.Model | None, model_name: str | None) -> Endpoint | None:
    """The endpoint of a call made now, in this context; None when nothing routes it.

    Inside a rollout of the chat model's model: the rollout's base URL (the call is recorded
    in that rollout). Otherwise, with a model: its plain ``/v1`` URL. Otherwise None, and the
    caller uses the base URL it was configured with, if any.

    Example:
        >>> async with art.capture(model) as run:  # needs a registered model  # doctest: +SKIP
        ...     resolve_endpoint(None, None).base_url == run.base_url
        True
    """
    run = art.current_run()
    if run is not None and follows_run(run, model, model_name):
        return Endpoint(
            base_url=run.base_url,
            api_key=run.model.inference_api_key or "art",
            model_name=model_name or run.model_name,
            rollout_id=run.rollout_id,
        )
    if model is None:
        return None
    if model.inference_base_url is None:
        raise RuntimeError(
            f"model {model.name!r} has no inference URL yet: `await model.register(backend)` "
            "before calling the chat model"
        )
    return Endpoint(
        base_url=model.inference_base_url,
        api_key=model.inference_api_key or "art",
        model_name=model_name or model.get_inference_name(),
    )
