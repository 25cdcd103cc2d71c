"""Where the RULER judge lives: model name, base URL, API key, from our options or ART's.

Two ways to name a judge, both resolved here:

- ours: a model name plus ``judge_base_url`` / ``judge_api_key`` (any OpenAI-compatible
  server; falling back to ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` like the openai client);
- ART's (LiteLLM's): ``"provider/model"`` ids such as ``"openai/o3"`` or
  ``"anthropic/claude-sonnet-4-5"``, plus ``extra_litellm_params`` (``api_base``,
  ``api_key``, ``temperature``...). Each provider below is reached through its
  OpenAI-compatible endpoint with the openai client; LiteLLM itself is not needed.

| prefix | base URL (override: ``api_base``, or the base variable) | key variable |
|---|---|---|
| ``openai/`` | the openai client's default (``OPENAI_BASE_URL``) | ``OPENAI_API_KEY`` |
| ``anthropic/`` | ``https://api.anthropic.com/v1/`` | ``ANTHROPIC_API_KEY`` |
| ``openrouter/`` | ``https://openrouter.ai/api/v1`` | ``OPENROUTER_API_KEY`` |
| ``together_ai/`` | ``https://api.together.xyz/v1`` | ``TOGETHERAI_API_KEY`` |
| ``fireworks_ai/`` | ``https://api.fireworks.ai/inference/v1`` | ``FIREWORKS_AI_API_KEY`` |
| ``groq/`` | ``https://api.groq.com/openai/v1`` | ``GROQ_API_KEY`` |
| ``deepseek/`` | ``https://api.deepseek.com/v1`` | ``DEEPSEEK_API_KEY`` |
| ``gemini/`` | ``https://generativelanguage.googleapis.com/v1beta/openai/`` | ``GEMINI_API_KEY`` |
| ``mistral/`` | ``https://api.mistral.ai/v1`` | ``MISTRAL_API_KEY`` |
| ``xai/`` | ``https://api.x.ai/v1`` | ``XAI_API_KEY`` |
| ``hosted_vllm/``, ``vllm/`` | ``judge_base_url`` or ``HOSTED_VLLM_API_BASE`` (required) | optional |
| ``azure/DEPLOYMENT`` | ``AZURE_API_BASE`` (required), with ``AZURE_API_VERSION`` | ``AZURE_API_KEY`` |

The prefix is stripped from the name sent to the judge. With an explicit ``judge_base_url``
the name is sent as written (OpenRouter's and vLLM's own model ids look like
``"openai/gpt-4.1"``), except for ``hosted_vllm/`` and ``vllm/``. A name whose prefix is not
in the table is sent as written too (``"Qwen/Qwen3-8B"``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from art_core.clients import shared_ssl_context

if TYPE_CHECKING:
    from openai import AsyncOpenAI

# Placeholder key for local judges (vLLM, our gateway) that check none: the openai client
# refuses to start without one.
NO_KEY = "EMPTY"


class JudgeModelLike(Protocol):
    """Anything with a ``name`` (our ``Model``): its ``inference_base_url``,
    ``inference_api_key`` and ``inference_model_name`` are used when present."""

    @property
    def name(self) -> str: ...


@dataclass(frozen=True)
class Provider:
    """A LiteLLM provider prefix reached through its OpenAI-compatible endpoint."""

    base_url: str | None
    key_vars: tuple[str, ...]
    base_vars: tuple[str, ...] = ()
    needs_key: bool = True  # False: a local server; a placeholder key is sent
    needs_base: bool = False  # True: no public endpoint; the base URL must be given


_VLLM = Provider(None, ("HOSTED_VLLM_API_KEY",), ("HOSTED_VLLM_API_BASE",), False, True)

PROVIDERS: dict[str, Provider] = {
    "openai": Provider(None, ("OPENAI_API_KEY",), ("OPENAI_BASE_URL", "OPENAI_API_BASE")),
    "anthropic": Provider(
        "https://api.anthropic.com/v1/", ("ANTHROPIC_API_KEY",), ("ANTHROPIC_API_BASE",)
    ),
    "openrouter": Provider(
        "https://openrouter.ai/api/v1",
        ("OPENROUTER_API_KEY", "OR_API_KEY"),
        ("OPENROUTER_API_BASE",),
    ),
    "together_ai": Provider(
        "https://api.together.xyz/v1",
        ("TOGETHERAI_API_KEY", "TOGETHER_API_KEY", "TOGETHER_AI_API_KEY"),
        ("TOGETHERAI_API_BASE",),
    ),
    "fireworks_ai": Provider(
        "https://api.fireworks.ai/inference/v1",
        ("FIREWORKS_AI_API_KEY", "FIREWORKS_API_KEY", "FIREWORKSAI_API_KEY"),
        ("FIREWORKS_AI_API_BASE",),
    ),
    "groq": Provider("https://api.groq.com/openai/v1", ("GROQ_API_KEY",), ("GROQ_API_BASE",)),
    "deepseek": Provider(
        "https://api.deepseek.com/v1", ("DEEPSEEK_API_KEY",), ("DEEPSEEK_API_BASE",)
    ),
    "gemini": Provider(
        "https://generativelanguage.googleapis.com/v1beta/openai/",
        ("GEMINI_API_KEY",),
        ("GEMINI_API_BASE",),
    ),
    "mistral": Provider("https://api.mistral.ai/v1", ("MISTRAL_API_KEY",), ("MISTRAL_API_BASE",)),
    "xai": Provider("https://api.x.ai/v1", ("XAI_API_KEY",), ("XAI_API_BASE",)),
    "hosted_vllm": _VLLM,
    "vllm": _VLLM,
    "azure": Provider(
        None,
        ("AZURE_API_KEY", "AZURE_OPENAI_API_KEY"),
        ("AZURE_API_BASE", "AZURE_OPENAI_ENDPOINT"),
        needs_base=True,
    ),
}
_AZURE_VERSION_VARS = ("AZURE_API_VERSION", "OPENAI_API_VERSION")
# Every environment variable a judge's endpoint may be read from (tests clear them all).
JUDGE_ENV_VARS = frozenset(
    {v for p in PROVIDERS.values() for v in (*p.key_vars, *p.base_vars)} | set(_AZURE_VERSION_VARS)
)

# extra_litellm_params keys that say where and how to connect, not what to ask.
ROUTING_PARAMS = frozenset(
    {
        "api_base",
        "base_url",
        "api_key",
        "api_version",
        "custom_llm_provider",
        "extra_headers",
        "headers",
        "organization",
        "timeout",
        "request_timeout",
    }
)
# extra_litellm_params keys with no meaning here: LiteLLM's own client features (its cache,
# retries, callbacks, fallbacks, Azure AD), or request fields RULER sets itself.
IGNORED_PARAMS = frozenset(
    {
        "caching",
        "cache",
        "num_retries",
        "max_retries",
        "drop_params",
        "fallbacks",
        "context_window_fallback_dict",
        "mock_response",
        "logger_fn",
        "metadata",
        "api_type",
        "azure_ad_token",
        "azure_ad_token_provider",
        "input_cost_per_token",
        "output_cost_per_token",
        "model",
        "messages",
        "response_format",
        "stream",
        "stream_options",
        "n",
        "tools",
        "tool_choice",
        "functions",
        "function_call",
    }
)


@dataclass(frozen=True)
class LitellmParams:
    """``extra_litellm_params`` sorted: routing, request-body parameters, ignored keys.

    Example:
        >>> p = LitellmParams.split({"temperature": 0, "api_base": "http://h/v1", "caching": False})
        >>> p.body, p.api_base, p.ignored
        ({'temperature': 0}, 'http://h/v1', ('caching',))
    """

    body: dict[str, Any] = field(default_factory=dict)
    api_base: str | None = None
    api_key: str | None = None
    api_version: str | None = None
    provider: str | None = None
    organization: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    timeout: float | None = None
    ignored: tuple[str, ...] = ()

    @classmethod
    def split(cls, params: Mapping[str, Any] | None) -> LitellmParams:
        """Sort ``extra_litellm_params``; raise ValueError naming a key with a wrong type.

        Everything not routing and not ignored goes into the request body (``temperature``,
        ``max_tokens``, ``max_completion_tokens``, ``top_p``, ``seed``, ``stop``,
        ``reasoning_effort``, a provider's own fields...); ``extra_body`` is merged into it.
        """
        if params is None:
            return cls()
        if not isinstance(params, Mapping):
            raise ValueError(f"extra_litellm_params must be a dict, got {type(params).__name__}")
        body: dict[str, Any] = {}
        ignored = []
        for key, value in params.items():
            if not isinstance(key, str):
                raise ValueError(f"extra_litellm_params keys must be strings, got {key!r}")
            if key in IGNORED_PARAMS:
                ignored.append(key)
            elif key == "extra_body":
                if value is not None and not isinstance(value, Mapping):
                    raise ValueError("extra_litellm_params['extra_body'] must be a dict")
                body.update(value or {})
            elif key not in ROUTING_PARAMS:
                body[key] = value
        headers = params.get("extra_headers") or params.get("headers") or {}
        if not isinstance(headers, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            raise ValueError("extra_litellm_params['extra_headers'] must map strings to strings")
        timeout = params.get("timeout", params.get("request_timeout"))
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
        ):
            raise ValueError(
                f"extra_litellm_params['timeout'] must be a positive number, got {timeout!r}"
            )
        return cls(
            body=body,
            api_base=_text(params, "api_base") or _text(params, "base_url"),
            api_key=_text(params, "api_key"),
            api_version=_text(params, "api_version"),
            provider=_text(params, "custom_llm_provider"),
            organization=_text(params, "organization"),
            headers=dict(headers),
            timeout=float(timeout) if timeout is not None else None,
            ignored=tuple(ignored),
        )


def _text(params: Mapping[str, Any], key: str) -> str | None:
    value = params.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError(f"extra_litellm_params[{key!r}] must be a string, got {value!r}")
    return value


def _env(names: tuple[str, ...]) -> str | None:
    return next((os.environ[n] for n in names if os.environ.get(n)), None)


@dataclass(frozen=True)
class JudgeEndpoint:
    """Where the judge lives: the model name sent in requests, base URL and API key.

    ``api_version`` is set for Azure OpenAI deployments (``azure/NAME``), where ``base_url``
    is the resource endpoint; ``headers`` are sent with every request.
    """

    model: str
    base_url: str | None
    api_key: str
    api_version: str | None = None
    organization: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    def client(self, timeout_s: float) -> AsyncOpenAI:
        """An openai client for this judge; retries are RULER's own (exactly one)."""
        import openai

        common: dict[str, Any] = {
            # the one TLS context of our clients (art_core.clients): a judge client is made per
            # request, and each new context loads the CA bundle again (~20 ms of CPU)
            "http_client": openai.DefaultAsyncHttpxClient(verify=shared_ssl_context()),
            "api_key": self.api_key,
            "organization": self.organization,
            "timeout": timeout_s,
            "max_retries": 0,
            "default_headers": dict(self.headers) or None,
        }
        if self.api_version is not None and self.base_url is not None:
            return openai.AsyncAzureOpenAI(
                azure_endpoint=self.base_url, api_version=self.api_version, **common
            )
        return openai.AsyncOpenAI(base_url=self.base_url, **common)


def split_provider(name: str, provider: str | None = None) -> tuple[str | None, str]:
    """``("anthropic", "claude-x")`` for ``"anthropic/claude-x"``; ``(None, name)`` when the
    prefix is not a known provider. ``provider`` (LiteLLM's ``custom_llm_provider``) names the
    provider of an unprefixed name.

    Example:
        >>> split_provider("openai/o3"), split_provider("Qwen/Qwen3-8B")
        (('openai', 'o3'), (None, 'Qwen/Qwen3-8B'))
    """
    prefix, slash, rest = name.partition("/")
    if slash and prefix in PROVIDERS and rest.strip():
        return prefix, rest
    if provider is not None:
        if provider not in PROVIDERS:
            raise ValueError(
                f"unknown custom_llm_provider {provider!r}; known: {', '.join(PROVIDERS)}"
            )
        return provider, name
    return None, name


def resolve_judge(
    judge_model: str | JudgeModelLike,
    judge_base_url: str | None = None,
    judge_api_key: str | None = None,
    *,
    extra_litellm_params: Mapping[str, Any] | LitellmParams | None = None,
) -> JudgeEndpoint:
    """Work out the judge's model name, base URL and API key.

    Explicit arguments win, then ``extra_litellm_params`` (``api_base``, ``api_key``), then
    the attributes of a model object or the provider of a LiteLLM id (see the table in this
    module), then ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` (as the openai client does). A
    judge with a base URL but no key gets a placeholder key, since local servers usually
    check none. Raises ValueError naming what is missing.

    Example:
        >>> resolve_judge("qwen3", "http://127.0.0.1:8000/v1").api_key
        'EMPTY'
        >>> resolve_judge("hosted_vllm/qwen3", "http://127.0.0.1:8000/v1").model
        'qwen3'
    """
    litellm = (
        extra_litellm_params
        if isinstance(extra_litellm_params, LitellmParams)
        else LitellmParams.split(extra_litellm_params)
    )
    base_url = judge_base_url or litellm.api_base
    api_key = judge_api_key or litellm.api_key
    if not isinstance(judge_model, str):
        return _model_object(judge_model, base_url, api_key, litellm)
    if not judge_model.strip():
        raise ValueError("judge_model must be a non-empty model name")
    prefix, name = split_provider(judge_model, litellm.provider)
    provider = PROVIDERS.get(prefix) if prefix is not None else None
    if provider is None or (judge_base_url and not provider.needs_base):
        # Our own form: the name as written, at the given (or the openai client's) URL.
        return _endpoint(
            judge_model,
            base_url or _env(("OPENAI_BASE_URL",)),
            api_key or _env(("OPENAI_API_KEY",)),
            litellm,
        )
    base_url = base_url or _env(provider.base_vars) or provider.base_url
    if base_url is None and provider.needs_base:
        raise ValueError(
            f"the RULER judge {judge_model!r} needs a base URL: pass judge_base_url (or "
            f"extra_litellm_params['api_base']) or set {provider.base_vars[0]}"
        )
    api_key = api_key or _env(provider.key_vars)
    if api_key is None and provider.needs_key and base_url == provider.base_url:
        # The provider's own service needs a key; a server of yours (api_base) may not.
        raise ValueError(
            f"no API key for the RULER judge {judge_model!r}: pass judge_api_key (or "
            f"extra_litellm_params['api_key']) or set {provider.key_vars[0]}"
        )
    version = None
    if prefix == "azure":
        version = litellm.api_version or _env(_AZURE_VERSION_VARS)
        if version is None:  # Azure's v1 API is plain OpenAI-compatible, no version needed
            base_url = f"{str(base_url).rstrip('/')}/openai/v1/"
    return _endpoint(name, base_url, api_key, litellm, api_version=version)


def _model_object(
    judge_model: JudgeModelLike, base_url: str | None, api_key: str | None, litellm: LitellmParams
) -> JudgeEndpoint:
    served = getattr(judge_model, "inference_model_name", None)
    name = served if isinstance(served, str) and served else getattr(judge_model, "name", None)
    if not isinstance(name, str) or not name.strip():
        raise ValueError(
            "judge_model must be a model name or an object with a non-empty `name`, "
            f"got {judge_model!r}"
        )
    return _endpoint(
        name,
        base_url or getattr(judge_model, "inference_base_url", None) or _env(("OPENAI_BASE_URL",)),
        api_key or getattr(judge_model, "inference_api_key", None) or _env(("OPENAI_API_KEY",)),
        litellm,
    )


def _endpoint(
    name: str,
    base_url: str | None,
    api_key: str | None,
    litellm: LitellmParams,
    *,
    api_version: str | None = None,
) -> JudgeEndpoint:
    if api_key is None:
        if base_url is None:
            raise ValueError(
                "no API key for the RULER judge: pass judge_api_key, set OPENAI_API_KEY, or "
                "point judge_base_url at a local OpenAI-compatible server"
            )
        api_key = NO_KEY
    return JudgeEndpoint(
        model=name,
        base_url=base_url,
        api_key=api_key,
        api_version=api_version,
        organization=litellm.organization,
        headers=litellm.headers,
    )
