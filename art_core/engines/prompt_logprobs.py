"""vLLM's ``prompt_logprobs`` on the wire: written by the gateway's ``/v1/completions`` and
the engine worker, read by the HTTP engine client and ``distill.endpoint.EndpointTeacher``.

A choice's ``prompt_logprobs`` holds one entry per prompt token. The first is ``null``
(nothing comes before it); each other is an object keyed by token id (a decimal string, as
JSON writes vLLM's int keys), each value ``{"logprob": float, "rank": int, "decoded_token":
str | null}``. It holds the prompt token itself (rank 1 + the tokens at least as likely as
it, itself excluded) and the ``k`` most likely tokens (ranks 1..k); the prompt token's key
comes first, and when it is one of the ``k`` one entry serves both (vLLM builds one dict).
A logprob of ``-inf`` is written -9999.0 (vLLM's ``clamp_prompt_logprobs``).

Example:
    >>> wire = to_wire([None, PromptLogprob(-0.5, 1, [(7, -0.5)])], [3, 7])
    >>> wire
    [None, {'7': {'logprob': -0.5, 'rank': 1, 'decoded_token': None}}]
    >>> from_wire(wire, [3, 7], k=1)[1].top
    [(7, -0.5)]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import Any

from art_core.engines.base import PromptLogprob

# A logprob above 0 by more than rounding is not a logprob.
LOGPROB_SLACK = 1e-4


def to_wire(
    scored: Sequence[PromptLogprob | None],
    prompt_ids: Sequence[int],
    decode: Callable[[list[int]], list[str]] | None = None,
) -> list[dict[str, dict[str, Any]] | None]:
    """``scored`` (one entry per token of ``prompt_ids``) in vLLM's wire format.

    ``decode`` turns token ids into their texts (``decoded_token``), called once with every
    distinct id; without it ``decoded_token`` is null (vLLM's value without a tokenizer).
    """
    if len(scored) != len(prompt_ids):
        raise ValueError(f"{len(scored)} scored positions for {len(prompt_ids)} prompt tokens")
    texts: dict[int, str] = {}
    if decode is not None:
        distinct = sorted(
            {t for e, t in zip(scored, prompt_ids, strict=True) if e is not None}
            | {i for e in scored if e is not None for i, _ in e.top}
        )
        texts = dict(zip(distinct, decode(distinct), strict=True))
    wire: list[dict[str, dict[str, Any]] | None] = []
    for entry, token in zip(scored, prompt_ids, strict=True):
        if entry is None:
            wire.append(None)
            continue
        position = {str(token): _logprob(entry.logprob, entry.rank, texts.get(token))}
        for rank, (top_id, logprob) in enumerate(entry.top, start=1):
            position[str(top_id)] = _logprob(logprob, rank, texts.get(top_id))
        wire.append(position)
    return wire


def _logprob(logprob: float, rank: int, text: str | None) -> dict[str, Any]:
    return {"logprob": logprob, "rank": rank, "decoded_token": text}


def from_wire(value: Any, prompt_ids: Sequence[int], k: int) -> list[PromptLogprob | None]:
    """Read (and check) a ``prompt_logprobs`` answer to a request for ``k`` alternatives
    over ``prompt_ids``; ``ValueError`` naming the position and what is wrong.

    Checked: one entry per prompt token; each after the first an object of at most ``k + 1``
    entries keyed by token ids; each entry a finite logprob <= 0 and an integer rank >= 1;
    the prompt token present; exactly ``k`` entries of rank 1..k (each rank once), their
    logprobs not increasing with the rank; a prompt token ranked past ``k`` no likelier than
    the ``k``-th. The first entry says nothing (nothing precedes it) and is not read.

    Example:
        >>> from_wire([None, {"9": {"logprob": -0.1, "rank": 1}}], [4, 9], k=0)[1].logprob
        -0.1
    """
    if not isinstance(value, list):
        raise ValueError(f"prompt_logprobs is {_kind(value)}, not a list")
    if len(value) != len(prompt_ids):
        raise ValueError(
            f"prompt_logprobs has {len(value)} entries for a prompt of {len(prompt_ids)} tokens"
        )
    scored: list[PromptLogprob | None] = [None]
    for position in range(1, len(prompt_ids)):
        try:
            scored.append(_position(value[position], prompt_ids[position], k))
        except ValueError as exc:
            raise ValueError(f"prompt_logprobs[{position}]: {exc}") from None
    return scored[: len(prompt_ids)]


def _position(entries: Any, token: int, k: int) -> PromptLogprob:
    if not isinstance(entries, dict):
        raise ValueError(f"is {_kind(entries)}, not an object of token logprobs")
    if len(entries) > k + 1:
        raise ValueError(f"holds {len(entries)} tokens; at most {k + 1} were asked for")
    own: tuple[float, int] | None = None
    ranked: dict[int, tuple[int, float]] = {}
    for key, item in entries.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 12):
            raise ValueError(f"key {key[:40]!r} is not a token id")
        token_id = int(key)
        logprob, rank = _entry(item, token_id)
        if token_id == token:
            own = (logprob, rank)
        if rank <= k:
            if rank in ranked:
                raise ValueError(f"tokens {ranked[rank][0]} and {token_id} both have rank {rank}")
            ranked[rank] = (token_id, logprob)
    if own is None:
        raise ValueError(f"the prompt token {token} is missing")
    if len(ranked) != k:
        raise ValueError(f"{len(ranked)} tokens have ranks 1..{k}, {k} were asked for")
    top = [ranked[rank] for rank in range(1, k + 1)]
    for (_, better), (worse_id, worse) in pairwise(top):
        if worse > better:
            raise ValueError(f"token {worse_id} is likelier than a token ranked before it")
    logprob, rank = own
    if rank > k and top and logprob > top[-1][1]:
        raise ValueError(f"the prompt token (rank {rank}) is likelier than the rank-{k} token")
    return PromptLogprob(logprob=logprob, rank=rank, top=top)


def _entry(item: Any, token_id: int) -> tuple[float, int]:
    """An entry's logprob and rank, checked."""
    if not isinstance(item, dict):
        raise ValueError(f"token {token_id}: {_kind(item)} instead of an object")
    logprob, rank = item.get("logprob"), item.get("rank")
    if isinstance(logprob, bool) or not isinstance(logprob, int | float):
        raise ValueError(f"token {token_id}: logprob is {_kind(logprob)}, not a number")
    if not math.isfinite(logprob) or logprob > LOGPROB_SLACK:
        raise ValueError(f"token {token_id}: logprob {logprob!r} is not finite and <= 0")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"token {token_id}: rank is {rank!r}, not an integer >= 1")
    return float(logprob), rank


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
