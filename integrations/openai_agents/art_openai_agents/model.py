"""``ArtModel``: the SDK's chat-completions model, pointed at the current rollout per call.

Each call resolves its base URL when it is made: inside ``art.capture(model)`` it is the
rollout's URL (``/rollouts/{id}/v1``, recorded token-exactly), outside it the plain ``/v1``
URL. So one model object serves any number of concurrent rollouts. Each request carries the
calling agent's name (and turn, guardrail, tool, MCP servers) in the ``x-art-metadata``
header, which the gateway stores with the recorded call.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

from agents import Model, ModelSettings, ModelTracing, OpenAIChatCompletionsModel

import art_core as art
from art_openai_agents.call_metadata import call_metadata

if TYPE_CHECKING:
    from agents.agent_output import AgentOutputSchemaBase
    from agents.handoffs import Handoff
    from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
    from agents.retry import ModelRetryAdvice, ModelRetryAdviceRequest
    from agents.tool import Tool
    from openai import AsyncOpenAI
    from openai.types.responses.response_prompt_param import ResponsePromptParam

METADATA_HEADER = "x-art-metadata"

ClientFor = Callable[[str], "AsyncOpenAI"]


class ArtModel(Model):
    """Serves an agent from a trainable model through the current rollout's base URL.

    Built by ``ArtModelProvider``; ``client_for(base_url)`` returns an ``AsyncOpenAI`` client
    for a base URL (sharing one connection pool).

    Example:
        >>> provider = ArtModelProvider(model)  # needs a registered model  # doctest: +SKIP
        >>> provider.get_model(None)  # an ArtModel  # needs a registered model  # doctest: +SKIP
    """

    def __init__(
        self,
        trainable: art.TrainableModel,
        client_for: ClientFor,
        *,
        requested_name: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        self.trainable = trainable
        self.requested_name = requested_name
        self._client_for = client_for
        self._metadata = dict(metadata or {})

    def _target(self) -> tuple[str, str]:
        """(base URL, model name) for a call made now."""
        run = art.current_run()
        name = self.trainable.get_inference_name()
        # "NAME@STEP" pins an agent to one adapter step (e.g. a frozen opponent: "NAME@0").
        if self.requested_name and self.requested_name.startswith(f"{name}@"):
            name = self.requested_name
        if run is not None and run.model.name == self.trainable.name:
            return run.base_url, name
        if self.trainable.inference_base_url is None:
            raise RuntimeError(
                f"model {self.trainable.name!r} is not registered: "
                "`await model.register(backend)` before running agents with it"
            )
        return self.trainable.inference_base_url, name

    def _inner(self) -> OpenAIChatCompletionsModel:
        base_url, name = self._target()
        return OpenAIChatCompletionsModel(model=name, openai_client=self._client_for(base_url))

    def _tagged(self, settings: ModelSettings) -> ModelSettings:
        """The settings plus this call's metadata header (and usage for streamed calls)."""
        extra: dict[str, Any] = {}
        if self.requested_name is not None:
            extra["requested_model"] = self.requested_name
        metadata = call_metadata({**self._metadata, **extra})
        headers = {**(settings.extra_headers or {}), METADATA_HEADER: json.dumps(metadata)}
        # The SDK asks for streamed usage only from api.openai.com; our gateway reports it too,
        # so streamed runs count tokens like non-streamed ones.
        include_usage = True if settings.include_usage is None else settings.include_usage
        return dataclasses.replace(settings, extra_headers=headers, include_usage=include_usage)

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None = None,
        conversation_id: str | None = None,
        prompt: ResponsePromptParam | None = None,
    ) -> ModelResponse:
        return await self._inner().get_response(
            system_instructions,
            input,
            self._tagged(model_settings),
            tools,
            output_schema,
            handoffs,
            tracing,
            previous_response_id=previous_response_id,
            conversation_id=conversation_id,
            prompt=prompt,
        )

    async def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None = None,
        conversation_id: str | None = None,
        prompt: ResponsePromptParam | None = None,
    ) -> AsyncIterator[TResponseStreamEvent]:
        events = self._inner().stream_response(
            system_instructions,
            input,
            self._tagged(model_settings),
            tools,
            output_schema,
            handoffs,
            tracing,
            previous_response_id=previous_response_id,
            conversation_id=conversation_id,
            prompt=prompt,
        )
        # Closing this generator early (the SDK stops at the terminal event) closes the inner
        # one too, so the HTTP stream is released at once rather than at garbage collection.
        async with aclosing(events):  # type: ignore[type-var]
            async for event in events:
                yield event

    def get_retry_advice(self, request: ModelRetryAdviceRequest) -> ModelRetryAdvice | None:
        return OpenAIChatCompletionsModel.get_retry_advice(self, request)  # type: ignore[arg-type]
