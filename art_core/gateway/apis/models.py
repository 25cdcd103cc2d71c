"""The gateway's own routes, beside the wire APIs: ``GET /health``, ``GET /v1/models`` and
``GET /v1/models/{id}`` (OpenAI's model list, every served ``NAME`` and ``NAME@STEP``), and
``PUT /rollouts/{rollout_id}/sampling`` (a rollout's own sampling settings,
``gateway.rollout_sampling``), ``PUT`` and ``GET /rollouts/{rollout_id}/limits`` (a bound on
a rollout's calls and what it refused, ``gateway.rollout_limits``)."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from art_core.gateway.body import parse_json_object, read_body
from art_core.gateway.errors import APIError, validation_message
from art_core.gateway.rollout_limits import RolloutLimits
from art_core.gateway.rollout_sampling import RolloutSampling
from art_core.gateway.routes import ROLLOUT_PREFIX, APIRoute
from art_core.gateway.serving import Serving, rollout_id

Settings = TypeVar("Settings", bound=BaseModel)


async def health(serving: Serving, request: Request) -> Response:
    """``GET /health``: ``{"status": "ok", "models": [...]}``."""
    return JSONResponse({"status": "ok", "models": sorted(serving.models)})


async def list_models(serving: Serving, request: Request) -> Response:
    """``GET /v1/models``: every name a request may use."""
    rollout_id(request)
    return JSONResponse({"object": "list", "data": [model_card(n) for n in serving.model_ids()]})


async def get_model(serving: Serving, request: Request) -> Response:
    """``GET /v1/models/{id}`` (``client.models.retrieve``): the model, or 404."""
    rollout_id(request)
    model_id = str(request.path_params["model_id"])
    await serving.resolve(model_id)  # 404 unless served (loading a known one on demand)
    return JSONResponse(model_card(model_id))


async def _read_settings(serving: Serving, request: Request, model: type[Settings]) -> Settings:
    """A rollout's settings from the request's JSON body; 400 naming the field for a bad one."""
    payload = parse_json_object(await read_body(request, serving.max_body_bytes))
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        message, param = validation_message(exc)
        raise APIError(400, message, param=param) from None


async def set_rollout_sampling(serving: Serving, request: Request) -> Response:
    """``PUT /rollouts/{rollout_id}/sampling``: set (replace) the sampling settings of
    every later call of the rollout, in every wire API (``rollout_sampling``); a body
    whose settings are all null (``{}``) removes them. The rollout need not have called
    yet. Answers ``{"rollout_id", "sampling"}``; 400 naming the field for a bad body.

    Example:
        >>> httpx.put(f"{root}/rollouts/r1/sampling", json={"seed": 7, "temperature": 1.0})  # needs a network service: a gateway at `root`  # doctest: +SKIP
    """
    rollout = rollout_id(request)
    assert rollout is not None  # the route's path has it
    sampling = await _read_settings(serving, request, RolloutSampling)
    serving.rollout_sampling.set(rollout, sampling)
    return JSONResponse(
        {"rollout_id": rollout, "sampling": None if sampling.is_empty else sampling.model_dump()}
    )


async def set_rollout_limits(serving: Serving, request: Request) -> Response:
    """``PUT /rollouts/{rollout_id}/limits``: set (replace) the bound on the rollout's calls
    (``rollout_limits``: past ``max_calls`` a call is refused with a 403, unsampled and
    unrecorded); ``{}`` removes it. The rollout need not have called yet. Answers the
    rollout's state, as ``GET`` does; 400 naming the field for a bad body.

    Example:
        >>> httpx.put(f"{root}/rollouts/r1/limits", json={"max_calls": 1})  # needs a network service: a gateway at `root`  # doctest: +SKIP
    """
    rollout = rollout_id(request)
    assert rollout is not None  # the route's path has it
    limits = await _read_settings(serving, request, RolloutLimits)
    serving.rollout_limits.set(rollout, limits)
    return JSONResponse({"rollout_id": rollout, **serving.rollout_limits.state(rollout)})


async def get_rollout_limits(serving: Serving, request: Request) -> Response:
    """``GET /rollouts/{rollout_id}/limits``: ``{"rollout_id", "max_calls", "calls_admitted",
    "calls_refused"}`` (``max_calls`` null: unbounded).

    Example:
        >>> httpx.get(f"{root}/rollouts/r1/limits").json()["calls_refused"]  # needs a network service: a gateway at `root`  # doctest: +SKIP
        0
    """
    rollout = rollout_id(request)
    assert rollout is not None  # the route's path has it
    return JSONResponse({"rollout_id": rollout, **serving.rollout_limits.state(rollout)})


def model_card(model_id: str) -> dict[str, Any]:
    """One entry of ``/v1/models``.

    Example:
        >>> model_card("agent@3")["id"]
        'agent@3'
    """
    return {"id": model_id, "object": "model", "created": 0, "owned_by": "art"}


ROUTES = (
    APIRoute("/v1/models", list_models, methods=("GET",)),
    APIRoute("/v1/models/{model_id:path}", get_model, methods=("GET",)),
    APIRoute("/health", health, methods=("GET",), prefixes=("",)),
    APIRoute("/sampling", set_rollout_sampling, methods=("PUT",), prefixes=(ROLLOUT_PREFIX,)),
    APIRoute("/limits", set_rollout_limits, methods=("PUT",), prefixes=(ROLLOUT_PREFIX,)),
    APIRoute("/limits", get_rollout_limits, methods=("GET",), prefixes=(ROLLOUT_PREFIX,)),
)
