"""Reading a request of any wire API: the body, parsed off the event loop when large, then
translated to the gateway's one internal request (a chat request), validated, and prepared.

An API module owns one function, ``translate(payload) -> Translated``: its own request (as
parsed JSON) to the chat-completions body the rest of the gateway serves (messages in
OpenAI's chat shape, function tools, sampling fields), plus the parameters to record and
whatever its answer needs later (Chat Completions' own translation is the body itself).
``read_translated`` runs the parse, the translation and the chat validation on the event
loop when the body is small and its schemas were checked before, else on a worker thread.
An API without a chat request (Completions) reads its body with ``read_parsed``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from starlette.requests import Request

from art_core.gateway.body import parse_json_object, read_body
from art_core.gateway.requests import (
    INLINE_BODY_BYTES,
    MAX_IGNORED_NAME_CHARS,
    MAX_IGNORED_NAMES,
    ChatRequest,
    PreparedCall,
    prepare_call,
    unchecked_schemas,
    validate_request,
)
from art_core.gateway.serving import Serving

T = TypeVar("T")


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


async def read_parsed(serving: Serving, request: Request, parse: Callable[[bytes], T]) -> T:
    """The request's body, bounded by ``serving.max_body_bytes``, as ``parse`` reads it: on
    the event loop when the body and its metadata header are small, else on a worker thread.

    Example:
        >>> parsed = await read_parsed(serving, request, parse_json_object)  # fragment: the gateway's `serving` and a `request`  # doctest: +SKIP
    """
    raw = await read_body(request, serving.max_body_bytes)
    header = request.headers.get("x-art-metadata")
    if len(raw) + len(header or "") > INLINE_BODY_BYTES:
        return await asyncio.to_thread(parse, raw)
    return parse(raw)


async def read_translated(
    serving: Serving, request: Request, translate: Translate
) -> tuple[ChatRequest, Translated]:
    """The request's body, translated by ``translate`` and validated as a chat request.
    ``APIError`` (400) for a body or a translation that is wrong.

    Example:
        >>> chat, translated = await read_translated(serving, request, translate)  # fragment: the gateway's `serving` and a `request`  # doctest: +SKIP
    """
    header = request.headers.get("x-art-metadata")

    def translated_only(raw: bytes) -> Translated:
        return translate(parse_json_object(raw))

    def validated(raw: bytes) -> tuple[ChatRequest, Translated]:
        translated = translated_only(raw)
        return _validate(serving, translated.chat, header), translated

    raw = await read_body(request, serving.max_body_bytes)
    if len(raw) + len(header or "") > INLINE_BODY_BYTES:
        return await asyncio.to_thread(validated, raw)
    translated = translated_only(raw)
    if unchecked_schemas(translated.chat, serving.schema_checks):
        chat = await asyncio.to_thread(_validate, serving, translated.chat, header)
    else:
        chat = _validate(serving, translated.chat, header)
    return chat, translated


def _validate(serving: Serving, payload: dict[str, Any], header: str | None) -> ChatRequest:
    return validate_request(payload, header, serving.schema_checks, serving.max_metadata_bytes)


async def prepare_translated(
    serving: Serving,
    chat: ChatRequest,
    translated: Translated,
    *,
    api: str,
    rollout_id: str | None,
) -> PreparedCall:
    """The call to sample for a translated request: its model resolved (404 when not
    served), rendered and checked; a token limit the context cannot hold is lowered to fit.

    Example:
        >>> call = await prepare_translated(serving, chat, t, api="responses", rollout_id=None)  # fragment: the gateway's `serving` and a translated request  # doctest: +SKIP
    """
    served, adapter = await serving.resolve(chat.chat.model)
    return await prepare_call(
        served,
        adapter,
        chat,
        rollout_id=rollout_id,
        api=api,
        request_params=translated.recorded,
        sampling=serving.rollout_sampling.get(rollout_id),
        limits=serving.rollout_limits,
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
