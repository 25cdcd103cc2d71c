"""One model the gateway serves: its engine, its chat tokenizer, its call record."""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass, field
from typing import Any

from art_core.engines.base import Engine
from art_core.engines.tokenizer import ChatTokenizer
from art_core.gateway.prompts import PromptBuilder
from art_core.gateway.relay import TokenRelay
from art_core.gateway.store import CallStore


@dataclass
class ServedModel:
    """A model the gateway serves: its engine, its chat tokenizer and its call record.

    Example:
        >>> served = ServedModel("agent", engine, store, chat)  # fragment: a started `engine`, its `store` and `chat` tokenizer  # doctest: +SKIP
        >>> served.prompts.build(messages, None, [], None)  # fragment  # doctest: +SKIP
    """

    name: str
    engine: Engine
    store: CallStore
    chat: ChatTokenizer
    default_max_tokens: int = 1024
    prompts: PromptBuilder = field(init=False)
    # The sampling of streamed calls, referenced until it ends: a client that hangs up stops
    # reading, not the sampling and the recording (the event loop keeps only weak
    # references to tasks).
    sampling: set[asyncio.Task[Any]] = field(init=False, default_factory=set)
    _relays: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, TokenRelay] = field(
        init=False, default_factory=weakref.WeakKeyDictionary, repr=False
    )

    def __post_init__(self) -> None:
        self.prompts = PromptBuilder(
            self.chat.tokenizer, self.chat.eos_token_ids, chat_format=self.chat.format
        )

    @property
    def tokenizer(self) -> Any:
        return self.chat.tokenizer

    def token_relay(self, loop: asyncio.AbstractEventLoop) -> TokenRelay:
        """The relay of this model's streamed tokens to ``loop`` (one per loop: a model may
        be served by gateways on several loops)."""
        relay = self._relays.get(loop)
        if relay is None:
            relay = self._relays[loop] = TokenRelay(loop)
        return relay

    def start_sampling(self, coroutine: Any) -> asyncio.Task[Any]:
        """``coroutine`` as a task kept referenced until it is done."""
        task = asyncio.ensure_future(coroutine)
        self.sampling.add(task)
        task.add_done_callback(self.sampling.discard)
        return task
