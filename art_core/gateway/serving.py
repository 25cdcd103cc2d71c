"""The gateway's shared state, under every wire API: the served models and the limits.

``Serving`` is what an API module's endpoints receive (vLLM's ``OpenAIServing`` in spirit):
the models by name and ``resolve`` (``NAME`` or ``NAME@STEP`` to a model and an adapter, a
404 or 503 in the caller's API shape), the body and metadata limits, the JSON Schemas
already checked, the rollouts' own sampling settings, and the stage log the serving
benchmark reads. ``app.Gateway`` is a ``Serving`` that mounts the API modules' routes.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from starlette.requests import Request

from art_core.gateway.body import DEFAULT_MAX_BODY_BYTES
from art_core.gateway.errors import APIError, scrub_paths
from art_core.gateway.pacing import StreamPacing
from art_core.gateway.requests import DEFAULT_MAX_METADATA_BYTES
from art_core.gateway.rollout_limits import RolloutLimitsStore
from art_core.gateway.rollout_sampling import RolloutSamplingStore
from art_core.gateway.schemas import SchemaChecks
from art_core.gateway.served import ServedModel
from art_core.gateway.timing import StageLog

logger = logging.getLogger(__name__)
T = TypeVar("T")
ROLLOUT_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
ADAPTER_STEP = re.compile(r"[0-9]{1,9}")  # ASCII digits only: str.isdigit() accepts '²'
# Called with a model name the gateway does not serve, before answering 404: a service
# loads models registered before a restart this way.
ModelLoader = Callable[[str], Awaitable[None]]
# At most this many (API, field) pairs are remembered as logged, per gateway.
MAX_LOGGED_IGNORED = 1024

__all__ = ["ROLLOUT_ID", "ModelLoader", "ServedModel", "Serving", "rollout_id"]


class Serving:
    """The served models and the limits every API module's endpoints read.

    Example:
        >>> serving = Serving(max_body_bytes=1024)
        >>> serving.model_ids()
        []
    """

    def __init__(
        self,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_metadata_bytes: int = DEFAULT_MAX_METADATA_BYTES,
        model_loader: ModelLoader | None = None,
        stream_pacing: StreamPacing | None = None,
    ) -> None:
        self.models: dict[str, ServedModel] = {}
        self.max_body_bytes = max_body_bytes
        self.max_metadata_bytes = max_metadata_bytes
        # How often streamed answers write (``pacing``).
        self.stream_pacing = stream_pacing if stream_pacing is not None else StreamPacing()
        # JSON Schemas that passed the (slow) check, by content: agents resend the same tools.
        self.schema_checks = SchemaChecks()
        self.model_loader = model_loader
        # Set to a StageLog to record where each request's time goes (the benchmark does).
        self.stage_log: StageLog | None = None
        # Request fields accepted and left out of the prompt, by API, each logged once.
        self.ignored_fields_logged: set[tuple[str, str]] = set()
        # Each rollout's own sampling settings (``PUT /rollouts/{id}/sampling``), applied to
        # its calls by ``prepare_call``; held here rather than per model: a rollout may call
        # any model, and the settings may come before its first call names one.
        self.rollout_sampling = RolloutSamplingStore()
        # Each rollout's bound on its calls (``PUT /rollouts/{id}/limits``), enforced where
        # its calls are prepared, before anything is sampled.
        self.rollout_limits = RolloutLimitsStore()
        self._api_state: dict[str, object] = {}

    def state(self, api: str, make: Callable[[], T]) -> T:
        """An API module's own state on this gateway (the Responses API's stored
        responses), made by ``make`` on first use.

        Example:
            >>> serving = Serving()
            >>> serving.state("toy", list) is serving.state("toy", list)
            True
        """
        if api not in self._api_state:
            self._api_state[api] = make()
        return cast(T, self._api_state[api])

    def add(self, served: ServedModel) -> None:
        """Serve ``served`` under its name (replacing a model of that name)."""
        self.models[served.name] = served
        # A rollout released (its calls handed to the trainer) is over: its settings go too.
        for discard in (self.rollout_sampling.discard, self.rollout_limits.discard):
            if discard not in served.store.release_listeners:
                served.store.release_listeners.append(discard)

    def model_ids(self) -> list[str]:
        """Every name a request may use: ``NAME`` and ``NAME@STEP`` of each loaded adapter."""
        ids = []
        for served in self.models.values():
            ids += [served.name] + [f"{served.name}@{a.step}" for a in served.engine.adapters()]
        return ids

    async def resolve(self, name: str) -> tuple[ServedModel, str | None]:
        """The served model a request names (``NAME`` or ``NAME@STEP``) and the adapter."""
        base, _, step = name.partition("@")
        if base not in self.models and self.model_loader is not None:
            await self._load(base)
        served = self.models.get(base)
        if served is None:
            raise APIError(
                404,
                f"model {name!r} does not exist; served: {sorted(self.models)}",
                type="not_found_error",
                param="model",
                code="model_not_found",
            )
        if not step:
            return served, None
        adapter = served.engine.adapter(int(step)) if ADAPTER_STEP.fullmatch(step) else None
        if adapter is None:
            raise APIError(
                404,
                f"no adapter of step {step!r} is loaded for {base!r}",
                type="not_found_error",
                param="model",
                code="model_not_found",
            )
        return served, adapter.name

    async def _load(self, base: str) -> None:
        assert self.model_loader is not None
        try:
            await self.model_loader(base)
        except LookupError:
            pass  # not a model of this server: the caller's 404
        except Exception as exc:
            # A model known here that cannot be loaded: say why (503), not "no such
            # model"; the loader keeps the failure for a while, so retries are cheap.
            logger.warning("could not load model %r on demand: %s", base, exc)
            raise APIError(
                503,
                scrub_paths(str(exc)),
                type="server_error",
                param="model",
                code="model_unavailable",
            ) from None

    def log_ignored(self, api: str, recorded: dict[str, Any]) -> None:
        """Log, once per gateway, each field of ``api`` that was accepted and left out of
        the prompt (``recorded["ignored_fields"]``, also kept in every call's record).

        Example:
            >>> Serving().log_ignored("responses", {"ignored_fields": ["store"]})
        """
        seen = self.ignored_fields_logged
        new = [
            name
            for name in recorded.get("ignored_fields", ())
            if (api, name) not in seen and len(seen) < MAX_LOGGED_IGNORED
        ]
        if new:
            seen.update((api, name) for name in new)
            logger.info(
                "%s: accepted and left out of the prompt (recorded with each call as "
                "request_params.ignored_fields): %s",
                api,
                ", ".join(new),
            )


def rollout_id(request: Request) -> str | None:
    """The request's rollout id (``/rollouts/{id}/v1/...``), validated; None on plain ``/v1``.

    Example:
        >>> rollout_id(Request({"type": "http", "path_params": {"rollout_id": "r1"}}))
        'r1'
    """
    value = request.path_params.get("rollout_id")
    if value is not None and not ROLLOUT_ID.fullmatch(value):
        raise APIError(
            400,
            "rollout ids are 1-128 letters, digits, '_', '-', '.' or ':'",
            param="rollout_id",
        )
    return value
