"""The interface every inference engine implements, and the values passing through it.

The gateway turns an OpenAI request into a ``GenerationRequest`` (token ids, sampling
params, and the grammar text the answer must follow), the engine samples, and a
``GenerationResult`` per choice comes back with the exact token ids and logprobs. Engines
batch concurrent requests themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

# Called from the engine's worker thread with (choice_index, new_token_ids) as tokens are
# sampled; the gateway uses it to stream. It must be thread-safe and must not block.
TokenCallback = Callable[[int, list[int]], None]


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 256
    n: int = 1
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    top_logprobs: int = 0
    # A llguidance grammar (Lark or JSON-schema derived) every choice must follow, or None.
    grammar: str | None = None
    # Score the prompt too (vLLM's ``prompt_logprobs``): None for no; k >= 0 for each prompt
    # token's logprob and rank plus the k most likely tokens at its position.
    prompt_logprobs: int | None = None


@dataclass
class GenerationRequest:
    prompt_token_ids: list[int]
    params: SamplingParams
    adapter: str | None = None  # adapter name to serve with; None = the engine's current one
    on_tokens: TokenCallback | None = None
    # Calls with one key are served by one replica (the gateway passes the rollout id), so a
    # rollout's prefix stays in that replica's cache; None: any replica (least loaded).
    route_key: str | None = None


@dataclass
class PromptLogprob:
    """The model's view of one prompt token given the tokens before it, as vLLM scores it:
    raw logits (temperature 1, no grammar mask), fp32 log-softmax.

    ``rank`` is 1 + the number of tokens more likely (vLLM counts a tie as more likely);
    ``top`` holds the ``k`` most likely tokens as (token id, logprob), most likely first (the
    token itself among them when its rank is at most ``k``). A logprob of ``-inf`` is written
    as -9999.0, as vLLM writes it (JSON has no infinity).

    Example:
        >>> PromptLogprob(logprob=-0.7, rank=2, top=[(5, -0.4), (9, -0.7)]).top[0]
        (5, -0.4)
    """

    logprob: float
    rank: int
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class GenerationResult:
    choice_index: int
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (end of turn or stop string) or "length"
    adapter_step: int
    # For each sampled token, the top alternatives as (token_id, logprob), when asked for.
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    # The stop string that ended generation, if any (its text is cut from the answer).
    stop_string: str | None = None
    # Which replica served it, when a ``ReplicaRouter`` spread the model over several.
    replica: int | None = None
    # When ``SamplingParams.prompt_logprobs`` asked for them: one entry per prompt token, the
    # first None (nothing comes before it), as vLLM's ``prompt_logprobs``; every choice of a
    # request shares one list.
    prompt_logprobs: list[PromptLogprob | None] | None = None


@dataclass
class AdapterInfo:
    name: str
    step: int
    path: Path | None


class AdapterRegistry:
    """The adapters an engine has loaded, oldest first, and the one it serves by default.

    Both engines keep their adapters here; each does its own loading and unloading, and
    ``add`` tells it which adapters fell out (beyond ``capacity``, oldest first).

    Example:
        >>> registry = AdapterRegistry(capacity=1)
        >>> registry.add(AdapterInfo("step-1", 1, None))
        []
        >>> [a.name for a in registry.add(AdapterInfo("step-2", 2, None))]
        ['step-1']
        >>> registry.current.step, registry.by_step(0).name
        (2, 'base')
    """

    def __init__(self, capacity: int, *, base_name: str = "base") -> None:
        self.capacity = capacity
        self.base_name = base_name
        self.current: AdapterInfo | None = None
        self._loaded: dict[str, AdapterInfo] = {}

    def __len__(self) -> int:
        return len(self._loaded)

    def __contains__(self, name: object) -> bool:
        return name in self._loaded

    def all(self) -> list[AdapterInfo]:
        """The loaded adapters, oldest first."""
        return list(self._loaded.values())

    def get(self, name: str) -> AdapterInfo | None:
        return self._loaded.get(name)

    def by_step(self, step: int) -> AdapterInfo | None:
        """The adapter of ``step`` (step 0: the base model), or None when not loaded."""
        if step == 0:
            return AdapterInfo(name=self.base_name, step=0, path=None)
        return next((a for a in self._loaded.values() if a.step == step), None)

    def add(self, info: AdapterInfo) -> list[AdapterInfo]:
        """Register ``info`` as the newest adapter and the default; return the evicted ones."""
        self._loaded.pop(info.name, None)
        self._loaded[info.name] = info
        self.current = info
        evicted = []
        while len(self._loaded) > self.capacity:
            evicted.append(self._loaded.pop(next(iter(self._loaded))))
        return evicted

    def remove(self, name: str) -> None:
        """Forget adapter ``name``; when it was the default, the base model becomes it."""
        info = self._loaded.pop(name, None)
        if info is not None and self.current is info:
            self.current = None


class EngineError(Exception):
    """A request the engine cannot serve (bad grammar, prompt too long); maps to HTTP 400."""


class EngineUnavailable(EngineError):
    """The engine (or the replica a call was sent to) died or stopped answering while it
    served the call; maps to HTTP 503. Nothing of the call is recorded: a retry is safe."""


# The most alternatives a prompt position may be scored with (``prompt_logprobs``): vLLM's
# default ``max_logprobs`` is 20 as well, so a client asking this gateway asks a vLLM alike.
MAX_PROMPT_LOGPROBS = 20

# A seed is a signed 64-bit integer (vLLM's range); the transformers engine seeds choice i
# with seed + i, which torch accepts up to 2**64 - 1.
SEED_RANGE = (-(2**63), 2**63 - 1)


def check_request(request: GenerationRequest, vocab_size: int | None = None) -> None:
    """``EngineError`` for a value that would fail inside the engine, checked before the
    request joins a batch (where its failure would fail the others' rows too).

    Example:
        >>> check_request(GenerationRequest([1], SamplingParams(seed=2**64)))
        Traceback (most recent call last):
        ...
        art_core.engines.base.EngineError: seed must be a signed 64-bit integer, got 18446744073709551616
    """
    params = request.params
    low, high = SEED_RANGE
    if params.seed is not None and not low <= params.seed <= high:
        raise EngineError(f"seed must be a signed 64-bit integer, got {params.seed}")
    if params.n < 1 or params.max_tokens < 1:
        raise EngineError(f"n and max_tokens must be >= 1, got {params.n}, {params.max_tokens}")
    if not (params.temperature >= 0 and 0 < params.top_p <= 1 and params.top_k >= 0):
        raise EngineError(
            "temperature must be >= 0, top_p in (0, 1] and top_k >= 0, got "
            f"{params.temperature}, {params.top_p}, {params.top_k}"
        )
    if params.top_logprobs < 0 or (vocab_size is not None and params.top_logprobs > vocab_size):
        raise EngineError(f"top_logprobs out of range: {params.top_logprobs}")
    scored = params.prompt_logprobs
    if scored is not None and not 0 <= scored <= MAX_PROMPT_LOGPROBS:
        raise EngineError(
            f"prompt_logprobs must be between 0 and {MAX_PROMPT_LOGPROBS}, got {scored}"
        )
    if scored is not None and vocab_size is not None and scored > vocab_size:
        raise EngineError(f"prompt_logprobs={scored} is more than the vocabulary ({vocab_size})")
    ids = request.prompt_token_ids
    if vocab_size is not None and ids and (min(ids) < 0 or max(ids) >= vocab_size):
        raise EngineError(
            f"the prompt holds token ids outside the vocabulary (0..{vocab_size - 1})"
        )


class ServesAdapters:
    """The adapter accessors every engine offers, read from its ``AdapterRegistry``."""

    _adapters: AdapterRegistry

    @property
    def current_adapter(self) -> AdapterInfo | None:
        """The adapter served when a request names none (None: the base model)."""
        return self._adapters.current

    def adapters(self) -> list[AdapterInfo]:
        """The adapters loaded now, oldest first."""
        return self._adapters.all()

    def adapter(self, step: int) -> AdapterInfo | None:
        """The loaded adapter of ``step`` (0 is the base model), or None."""
        return self._adapters.by_step(step)


@runtime_checkable
class Engine(Protocol):
    """What the gateway and the backend need from an inference engine.

    Token ids in, token ids out: an engine knows nothing of chat messages, templates or
    tool calls (the gateway owns those). In-process (``TransformersEngine``), a vLLM server
    (``VLLMEngine``) and an engine worker process all satisfy it.
    """

    context_length: int

    @property
    def current_adapter(self) -> AdapterInfo | None: ...

    def adapters(self) -> list[AdapterInfo]:
        """The adapters loaded now, oldest first."""
        ...

    def adapter(self, step: int) -> AdapterInfo | None:
        """The loaded adapter of ``step`` (0 is the base model), or None."""
        ...

    async def start(self) -> None: ...

    async def generate(self, request: GenerationRequest) -> list[GenerationResult]:
        """Sample every choice of ``request``; ``EngineError`` for a request it cannot serve
        (it then fails alone, never the batch it would have joined)."""
        ...

    async def load_adapter(self, path: Path, step: int, *, name: str | None = None) -> None:
        """Load a PEFT adapter folder and make it the one served by default."""
        ...

    async def pause(self) -> None:
        """Let the running batch finish; hold new requests until ``resume``."""
        ...

    async def resume(self) -> None: ...

    async def close(self) -> None: ...
