"""``ArtChatModel``: LangChain's ``ChatOpenAI``, routed to the current rollout at call time.

It is a real ``ChatOpenAI`` (so a ``BaseChatModel``): ``bind_tools``, ``with_structured_output``,
``with_retry``, ``with_config``, ``invoke``/``ainvoke``, ``stream``/``astream``, batching and
callbacks are LangChain's own. Only the four methods that send a request are wrapped: each
call picks its endpoint from ``art_core.current_run()`` in the calling context (the task or
thread that runs the LangGraph node) and forwards the node's metadata with the request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import LanguageModelInput
from langchain_core.messages import AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables import RunnableConfig, ensure_config
from langchain_openai import ChatOpenAI
from pydantic import Field

import art_core as art
from art_langgraph.metadata import call_metadata
from art_langgraph.routing import resolve_endpoint

# A chat model with no model of its own is only routed inside a rollout; this URL is never
# contacted (a call outside a rollout raises first).
UNROUTED_BASE_URL = "http://art-rollout.invalid/v1"
UNROUTED_MODEL_NAME = "art-current-rollout"

RunManager = CallbackManagerForLLMRun | AsyncCallbackManagerForLLMRun
# The keyword that carries a stream's metadata from ``stream``/``astream`` to ``_stream``.
STREAM_METADATA_KWARG = "art_stream_metadata"


class ArtChatModel(ChatOpenAI):
    """A ``ChatOpenAI`` whose calls go to the current rollout of its art-core model.

    Build it with ``art_langgraph.init_chat_model``. ``art_model`` (a registered
    ``art.TrainableModel`` or ``art.Model``) is where calls outside a rollout go;
    ``art_model_name`` pins the name sent (e.g. ``"agent-001@0"``, the base model).

    Example:
        >>> llm = ArtChatModel(art_model=None, art_model_name=None,
        ...                    base_url=UNROUTED_BASE_URL, api_key="art", model=UNROUTED_MODEL_NAME)
        >>> llm.bind_tools([...]).invoke("hi")  # inside a rollout  # needs a registered model  # doctest: +SKIP
    """

    art_model: Any = Field(default=None, exclude=True)
    art_model_name: str | None = Field(default=None, exclude=True)
    # Set on the per-call copy: should a ChatOpenAI code path call another request method of
    # the copy, it is not routed (nor tagged) a second time.
    art_routed: bool = Field(default=False, exclude=True)

    @classmethod
    def is_lc_serializable(cls) -> bool:
        # The art model holds a live backend; it is not part of a serialized config.
        return False

    @property
    def _llm_type(self) -> str:
        return "art-openai-chat"

    # ------------------------------------------------------------------------------ routing
    def _for_this_call(
        self, run_manager: RunManager | None, kwargs: dict[str, Any]
    ) -> ArtChatModel:
        """A shallow copy of this model pointed at this call's endpoint; adds the metadata."""
        streamed = kwargs.pop(STREAM_METADATA_KWARG, None)
        if self.art_routed:
            return self
        if run_manager is not None:
            metadata = call_metadata(run_manager.metadata, run_manager.run_id)
        elif streamed is not None:
            metadata = call_metadata(streamed)
        else:
            # LangChain calls ``_stream`` without a run manager under a streaming handler
            # (LangGraph's ``stream_mode="messages"``); the running node's config is in the
            # context.
            metadata = call_metadata(ensure_config().get("metadata") or {})
        if metadata:
            given = {**(self.model_kwargs.get("metadata") or {}), **(kwargs.get("metadata") or {})}
            kwargs["metadata"] = {**metadata, **given}
        endpoint = resolve_endpoint(self.art_model, self.art_model_name)
        if endpoint is None:
            if self.openai_api_base == UNROUTED_BASE_URL:
                raise RuntimeError(
                    "this chat model follows the current rollout, and the call ran outside one: "
                    "run the graph under `art_langgraph.wrap_rollout(model, fn)` or "
                    "`art.capture(model)`, or build it with `init_chat_model(model)` to call "
                    "the model outside rollouts too"
                )
            return self.model_copy(update={"art_routed": True})
        update: dict[str, Any] = {"model_name": endpoint.model_name, "art_routed": True}
        options = {"base_url": endpoint.base_url, "api_key": endpoint.api_key}
        # ``with_options`` copies an OpenAI client (~0.1 ms) and shares its HTTP connection
        # pool. Both clients are re-pointed, whichever one ChatOpenAI's code path picks.
        if self.root_client is not None:
            root = self.root_client.with_options(**options)
            update.update(root_client=root, client=root.chat.completions)
        if self.root_async_client is not None:
            root_async = self.root_async_client.with_options(**options)
            update.update(root_async_client=root_async, async_client=root_async.chat.completions)
        return self.model_copy(update=update)

    # ------------------------------------------------------------------------------ streams
    # LangChain's ``stream``/``astream`` call ``_stream``/``_astream`` without the run manager
    # that carries the call's metadata: hand the config's metadata down as a keyword instead.
    def stream(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> Iterator[AIMessageChunk]:
        kwargs[STREAM_METADATA_KWARG] = self._config_metadata(config)
        yield from super().stream(input, config, stop=stop, **kwargs)

    async def astream(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[AIMessageChunk]:
        kwargs[STREAM_METADATA_KWARG] = self._config_metadata(config)
        async for chunk in super().astream(input, config, stop=stop, **kwargs):
            yield chunk

    def _config_metadata(self, config: RunnableConfig | None) -> dict[str, Any]:
        return {**(ensure_config(config).get("metadata") or {}), **(self.metadata or {})}

    # ------------------------------------------------------------------------------ requests
    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        routed = self._for_this_call(run_manager, kwargs)
        return ChatOpenAI._generate(routed, messages, stop=stop, run_manager=run_manager, **kwargs)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        routed = self._for_this_call(run_manager, kwargs)
        return await ChatOpenAI._agenerate(
            routed, messages, stop=stop, run_manager=run_manager, **kwargs
        )

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        routed = self._for_this_call(run_manager, kwargs)
        yield from ChatOpenAI._stream(
            routed, messages, stop=stop, run_manager=run_manager, **kwargs
        )

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        routed = self._for_this_call(run_manager, kwargs)
        async for chunk in ChatOpenAI._astream(
            routed, messages, stop=stop, run_manager=run_manager, **kwargs
        ):
            yield chunk


def init_chat_model(
    model: art.Model | str | None = None,
    *,
    model_provider: str | None = None,
    configurable_fields: None = None,
    config_prefix: str | None = None,
    **kwargs: Any,
) -> ArtChatModel:
    """A LangChain chat model whose calls are captured in the current rollout.

    Build it once, anywhere (module level is fine): each call is sent to the rollout of the
    task or thread that makes it (``art_langgraph.wrap_rollout`` / ``art.capture``) and is
    tagged with the LangGraph node that made it.

    ``model``: None (follow the current rollout; a call outside a rollout raises), a registered
    ``art.TrainableModel`` (outside rollouts calls go to its plain ``/v1`` URL, unrecorded by
    any rollout) or a model name string (``"agent-001@0"`` pins a checkpoint step). Other
    keyword arguments are ``ChatOpenAI``'s (``temperature``, ``max_tokens``, ``timeout``, ...).
    ``model_provider``, ``configurable_fields`` and ``config_prefix`` exist for signature
    compatibility with ``langchain.chat_models.init_chat_model``/ART; only the OpenAI protocol
    is spoken.

    Example:
        >>> from langchain.agents import create_agent  # the `agents` extra
        >>> llm = init_chat_model(temperature=1.0)
        >>> agent = create_agent(llm, tools=[])
        >>> rollout = wrap_rollout(model, run_agent)  # calls inside are recorded  # fragment: `model`, and `run_agent` (see wrap_rollout)  # doctest: +SKIP
    """
    if model_provider not in (None, "openai"):
        raise ValueError(
            f"model_provider={model_provider!r}: art-core serves the OpenAI chat API; leave it out"
        )
    if configurable_fields is not None or config_prefix is not None:
        raise ValueError("configurable_fields/config_prefix are not supported by init_chat_model")
    if "model_name" in kwargs:
        raise ValueError("pass the model as `model` (the first argument), not `model_name`")
    art_model: art.Model | None = None
    art_model_name: str | None = None
    if isinstance(model, art.Model):
        art_model = model
    elif isinstance(model, str):
        if not model:
            raise ValueError("the model name must not be empty")
        art_model_name = model
    elif model is not None:
        raise TypeError(
            f"model must be an art_core Model, a model name or None, not {type(model).__name__}"
        )
    if kwargs.get("use_responses_api"):
        raise ValueError("the art-core gateway serves chat completions, not the Responses API")
    kwargs["use_responses_api"] = False
    # The gateway reports usage on streams too; ChatOpenAI only asks for it on OpenAI's URL.
    kwargs.setdefault("stream_usage", True)
    # A LangChain LLM cache would answer repeated prompts without sampling (or recording):
    # RL needs fresh samples.
    kwargs.setdefault("cache", False)
    has_base_url = any(kwargs.get(k) for k in ("base_url", "openai_api_base"))
    if not has_base_url:
        registered = art_model.inference_base_url if art_model is not None else None
        kwargs["base_url"] = registered or UNROUTED_BASE_URL
    if not any(kwargs.get(k) for k in ("api_key", "openai_api_key")):
        kwargs["api_key"] = (art_model.inference_api_key if art_model else None) or "art"
    name = art_model_name or (art_model.get_inference_name() if art_model else UNROUTED_MODEL_NAME)
    return ArtChatModel(art_model=art_model, art_model_name=art_model_name, model=name, **kwargs)
