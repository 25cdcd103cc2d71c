"""What every wire API's edge does the same way: read the body, translate it to a chat
request, validate that, and prepare the call.

An API module owns one function, ``translate(payload) -> Translated``: its own request (as
parsed JSON) to the chat-completions body the rest of the gateway serves (messages in
OpenAI's chat shape, function tools, sampling fields), plus the parameters to record and
whatever its answer needs later. ``read_translated`` runs the parse, the translation and the
chat validation on the event loop when the body is small and its schemas were checked
before, else on a worker thread (as ``requests.read_request`` does for chat).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.requests import Request

from art_core.gateway.body import parse_json_object, read_body
from art_core.gateway.requests import (
    INLINE_BODY_BYTES,
    MAX_IGNORED_NAME_CHARS,
    MAX_IGNORED_NAMES,
    ChatRequest,
    PreparedCall,
    _unchecked_schemas,
    _validate_request,
    prepare_call,
)

if TYPE_CHECKING:
    from art_core.gateway.app import Gateway

logger = logging.getLogger(__name__)


@dataclass
class Translated:
    """One API request as the chat request it becomes.

    ``chat`` is a chat-completions body; ``recorded`` the API's own parameters recorded with
    each call (``recorded_fields`` builds it); ``context`` whatever the API's answer needs
    (tool kinds, ids, the original input).
    """

    chat: dict[str, Any]
    recorded: dict[str, Any] = field(default_factory=dict)
    context: dict[str, Any] = field(default_factory=dict)


Translate = Callable[[dict[str, Any]], Translated]


async def read_translated(
    gateway: Gateway, request: Request, translate: Translate
) -> tuple[ChatRequest, Translated]:
    """The request's body, translated by ``translate`` and validated as a chat request.
    ``APIError`` (400) for a body or a translation that is wrong.

    Example:
        >>> chat, translated = await read_translated(gateway, request, translate)  # doctest: +SKIP
    """
    raw = await read_body(request, gateway.max_body_bytes)
    header = request.headers.get("x-art-metadata")
    if len(raw) + len(header or "") > INLINE_BODY_BYTES:
        return await asyncio.to_thread(_translate_and_validate, gateway, raw, header, translate)
    payload = parse_json_object(raw)
    translated = translate(payload)
    if _unchecked_schemas(translated.chat, gateway.schema_checks):
        chat = await asyncio.to_thread(_validate, gateway, translated.chat, header)
    else:
        chat = _validate(gateway, translated.chat, header)
    return chat, translated


def _translate_and_validate(
    gateway: Gateway, raw: bytes, header: str | None, translate: Translate
) -> tuple[ChatRequest, Translated]:
    translated = translate(parse_json_object(raw))
    return _validate(gateway, translated.chat, header), translated


def _validate(gateway: Gateway, payload: dict[str, Any], header: str | None) -> ChatRequest:
    return _validate_request(payload, header, gateway.schema_checks, gateway.max_metadata_bytes)


async def prepare_translated(
    gateway: Gateway,
    request: Request,
    chat: ChatRequest,
    translated: Translated,
    *,
    api: str,
    rollout_id: str | None,
) -> PreparedCall:
    """The call to sample for a translated request: its model resolved (404 when not
    served), rendered and checked; a token limit the context cannot hold is lowered to fit.

    Example:
        >>> call = await prepare_translated(gateway, request, chat, t, api="responses", rollout_id=None)  # doctest: +SKIP
    """
    served, adapter = await gateway.resolve(chat.chat.model)
    return await prepare_call(
        served,
        adapter,
        chat,
        rollout_id=rollout_id,
        api=api,
        request_params=translated.recorded,
        sampling=gateway.rollout_sampling.get(rollout_id),
    )


def recorded_fields(
    payload: dict[str, Any], served: frozenset[str], not_recorded: frozenset[str]
) -> dict[str, Any]:
    """The parameters recorded with each call of an API request: the fields in ``served``
    (not those recorded on their own, ``not_recorded``), plus the sorted names (only) of
    every other field, which the gateway accepted and left out of the prompt.

    Example:
        >>> recorded_fields({"model": "m", "input": "hi", "store": False},
        ...                 frozenset({"model", "input"}), frozenset({"input"}))
        {'model': 'm', 'ignored_fields': ['store']}
    """
    params = {k: v for k, v in payload.items() if k in served and k not in not_recorded}
    ignored = sorted(k[:MAX_IGNORED_NAME_CHARS] for k in payload if k not in served)
    if ignored:
        params["ignored_fields"] = ignored[:MAX_IGNORED_NAMES]
    return params


# At most this many (API, field) pairs are remembered as logged, per gateway.
MAX_LOGGED_IGNORED = 1024


def log_ignored(gateway: Gateway, api: str, recorded: dict[str, Any]) -> None:
    """Log, once per gateway, each field of ``api`` that was accepted and left out of the
    prompt (``recorded["ignored_fields"]``, also kept in every call's record).

    Example:
        >>> log_ignored(gateway, "responses", {"ignored_fields": ["store"]})  # doctest: +SKIP
    """
    seen = gateway.ignored_fields_logged
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
