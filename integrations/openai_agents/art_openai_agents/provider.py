"""``ArtModelProvider``: serve the agents of a run from a trainable model, unchanged.

Pass it once, ``RunConfig(model_provider=ArtModelProvider(model))``, and every agent whose
``model`` is a name (or unset) is served by the trainable model through the current rollout's
base URL. Agent definitions stay as they are; the names they carry (``"gpt-4.1"``) are kept
in each call's metadata as ``requested_model``.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from agents import Model, ModelProvider

import art_core as art
from art_openai_agents.model import ArtModel
from art_openai_agents.tracing import configure_tracing as _configure_tracing

if TYPE_CHECKING:
    from openai import AsyncOpenAI


class ArtModelProvider(ModelProvider):
    """A model provider backed by an ``art.TrainableModel``.

    Args:
        model: the trainable model (registered before the first call).
        model_names: agent model names served by the trainable model; ``None`` (default)
            serves every name. Other names go to ``fallback``.
        fallback: provider for the names not in ``model_names`` (e.g. a frozen judge agent on
            another server). Their calls are not recorded by the gateway.
        metadata: extra metadata added to every call.
        configure_tracing: replace the SDK's trace processors with the rollout recorder
            (``art_openai_agents.configure_tracing``), which turns off the SDK's export to
            OpenAI. Pass False to manage the processors yourself.
        export_traces_to_openai: with ``configure_tracing``, keep the SDK's OpenAI exporter.

    Example:
        >>> provider = ArtModelProvider(model)  # needs a registered model: `model`, an `agent`  # doctest: +SKIP
        >>> result = await Runner.run(agent, "hi", run_config=RunConfig(model_provider=provider))  # needs a registered model  # doctest: +SKIP
    """

    def __init__(
        self,
        model: art.TrainableModel,
        *,
        model_names: Collection[str] | None = None,
        fallback: ModelProvider | None = None,
        metadata: dict[str, Any] | None = None,
        configure_tracing: bool = True,
        export_traces_to_openai: bool = False,
    ) -> None:
        if not isinstance(model, art.TrainableModel):
            raise TypeError(
                f"ArtModelProvider needs an art_core.TrainableModel, got {type(model).__name__}"
            )
        if isinstance(model_names, str):
            raise TypeError("model_names must be a collection of names, not a single string")
        self.model = model
        self.model_names = frozenset(model_names) if model_names is not None else None
        self.fallback = fallback
        self.metadata = dict(metadata or {})
        self._root_client: AsyncOpenAI | None = None
        if configure_tracing:
            _configure_tracing(export_to_openai=export_traces_to_openai)

    def serves(self, model_name: str | None) -> bool:
        """Whether agents asking for ``model_name`` are served by the trainable model."""
        return self.model_names is None or model_name is None or model_name in self.model_names

    def get_model(self, model_name: str | None) -> Model:
        """The model for an agent whose ``model`` is ``model_name`` (None: not set).

        Example:
            >>> ArtModelProvider(model).get_model("gpt-4.1")  # needs a registered model  # doctest: +SKIP
            <art_openai_agents.model.ArtModel ...>
        """
        if self.serves(model_name):
            return ArtModel(
                self.model, self._client_for, requested_name=model_name, metadata=self.metadata
            )
        if self.fallback is None:
            raise ValueError(
                f"an agent asks for model {model_name!r}, which is not in model_names "
                f"{sorted(self.model_names or ())} and no fallback provider was given"
            )
        return self.fallback.get_model(model_name)

    def _client_for(self, base_url: str) -> AsyncOpenAI:
        """A client for ``base_url``; all of them share the first one's connection pool."""
        if self._root_client is None:
            from openai import AsyncOpenAI

            self._root_client = AsyncOpenAI(
                base_url=base_url, api_key=self.model.inference_api_key or "art"
            )
        return self._root_client.with_options(base_url=base_url)

    async def aclose(self) -> None:
        """Close the HTTP connection pool (the SDK calls this for providers it owns)."""
        if self._root_client is not None:
            await self._root_client.close()
            self._root_client = None
