"""``capture(model)``: scope any agent code's LLM calls to one rollout and get its trajectory."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from art_core.clients import async_openai_client, shared_ssl_context, sync_openai_client
from art_core.gateway.rollout_limits import RolloutLimits
from art_core.gateway.rollout_sampling import RolloutSampling
from art_core.run_context import current_run as current_run  # re-exported: art.current_run
from art_core.run_context import enter_run, exit_run
from art_core.tracing import hooks as tracing
from art_core.trajectories import LLMCall, Trajectory, new_id

if TYPE_CHECKING:
    from openai import AsyncOpenAI, OpenAI

    from art_core.model import TrainableModel

# The adapter step that rollouts opened in this context call by name (``NAME@STEP``); None:
# the step the backend serves by default. ``art_core.evals`` sets it so that an unchanged
# rollout function runs against the checkpoint under evaluation (step 0: the base model).
_pinned_step: ContextVar[int | None] = ContextVar("art_pinned_step", default=None)


@contextmanager
def pin_step(step: int | None) -> Iterator[None]:
    """Within the block, ``run.model_name`` of every rollout opened (in this task and the
    tasks it starts) names adapter ``step`` (``NAME@STEP``, which the gateway serves while
    that adapter is loaded); None: the default one.

    Example:
        >>> with pin_step(0):  # needs a registered model: `model`, `rollout`  # doctest: +SKIP
        ...     trajectory = await rollout(model, task)  # its calls use the base model
    """
    if step is not None and step < 0:
        raise ValueError(f"a step is >= 0, got {step}")
    token = _pinned_step.set(step)
    try:
        yield
    finally:
        _pinned_step.reset(token)


class Run:
    """One rollout: its id, its base URL, and the calls the gateway recorded for it."""

    def __init__(
        self,
        model: TrainableModel,
        rollout_id: str,
        metadata: dict[str, Any],
        sampling: RolloutSampling | None = None,
    ) -> None:
        if model.inference_base_url is None:
            raise RuntimeError(f"model {model.name!r} is not registered")
        self.model = model
        self.rollout_id = rollout_id
        self.metadata = metadata
        # The sampling settings the gateway applies to every call of this rollout (None:
        # each call samples as it asks).
        self.sampling = sampling
        # The adapter step this rollout calls by name (``pin_step``); None: the default one.
        self.adapter_step = _pinned_step.get()
        root = model.inference_base_url.removesuffix("/").removesuffix("/v1")
        # Anthropic's clients append /v1/messages to their base URL; OpenAI's append
        # /responses, /chat/completions, /completions to theirs, which ends in /v1.
        self.anthropic_base_url = f"{root}/rollouts/{rollout_id}"
        self.base_url = f"{self.anthropic_base_url}/v1"
        self.start_time = time.time()
        self.end_time: float | None = None
        self._final_calls: list[LLMCall] | None = None
        # Clients handed out for this rollout: their connections close when it ends.
        self._clients: list[Any] = []

    @property
    def model_name(self) -> str:
        return self.model.get_inference_name(self.adapter_step)

    def openai_client(self, **kwargs: Any) -> AsyncOpenAI:
        """An ``openai.AsyncOpenAI`` client whose calls are recorded in this rollout; its
        connections are closed when the capture block exits."""
        client = async_openai_client(self.base_url, self.model.inference_api_key or "art", **kwargs)
        self._clients.append(client)
        return client

    def sync_openai_client(self, **kwargs: Any) -> OpenAI:
        """The synchronous ``openai.OpenAI`` equivalent, for sync agent code (closed with the
        capture block too)."""
        client = sync_openai_client(self.base_url, self.model.inference_api_key or "art", **kwargs)
        self._clients.append(client)
        return client

    def env(self) -> dict[str, str]:
        """The environment a subprocess agent needs to send its calls to this rollout, in
        whichever API it speaks: the base URLs and API keys OpenAI's and Anthropic's clients
        read, and this model's name under the variables agents read it from. Merge it into
        the subprocess's environment.

        Example:
            >>> async with capture(model) as run:  # needs a registered model  # doctest: +SKIP
            ...     subprocess.run(["my-agent"], env={**os.environ, **run.env()})
        """
        key = self.model.inference_api_key or "art"
        name = self.model_name
        return {
            "OPENAI_BASE_URL": self.base_url,
            "OPENAI_API_BASE": self.base_url,  # older clients (openai<1, LiteLLM)
            "OPENAI_API_KEY": key,
            "OPENAI_MODEL": name,
            "ANTHROPIC_BASE_URL": self.anthropic_base_url,
            "ANTHROPIC_API_KEY": key,
            "ANTHROPIC_MODEL": name,
            # The smaller model Anthropic-speaking agents use for side tasks: the same one,
            # so every call of the run is recorded and trained.
            "ANTHROPIC_SMALL_FAST_MODEL": name,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": name,
            "ANTHROPIC_DEFAULT_SONNET_MODEL": name,
            "ANTHROPIC_DEFAULT_OPUS_MODEL": name,
            "ART_MODEL": name,
            "ART_ROLLOUT_ID": self.rollout_id,
        }

    def anthropic_client(self, **kwargs: Any) -> Any:
        """An ``anthropic.AsyncAnthropic`` client whose calls are recorded in this rollout
        (needs the ``anthropic`` package); closed with the capture block.

        Example:
            >>> async with capture(model) as run:  # needs a registered model  # doctest: +SKIP
            ...     await run.anthropic_client().messages.create(model=run.model_name, ...)
        """
        from anthropic import AsyncAnthropic, DefaultAsyncHttpxClient

        if "http_client" not in kwargs:  # the TLS context our clients share (art_core.clients)
            kwargs["http_client"] = DefaultAsyncHttpxClient(verify=shared_ssl_context())
        client = AsyncAnthropic(
            base_url=self.anthropic_base_url,
            api_key=self.model.inference_api_key or "art",
            **kwargs,
        )
        self._clients.append(client)
        return client

    async def _close_clients(self) -> None:
        clients, self._clients = self._clients, []
        for client in clients:
            closing = client.close()
            if inspect.isawaitable(closing):
                await closing

    async def fetch_calls(self, *, release: bool = False) -> list[LLMCall]:
        """The calls recorded so far, in the order they were issued."""
        calls = await self.model.backend().rollout_calls(
            self.model, self.rollout_id, release=release
        )
        return list(calls)

    async def calls_refused(self) -> int:
        """How many calls of this rollout the gateway refused for its ``max_calls`` (0
        without a bound): the agent asked for more than it was allowed.

        Example:
            >>> async with capture(model, max_calls=1) as run:  # needs a registered model  # doctest: +SKIP
            ...     await run.calls_refused()
            0
        """
        state = await _rollout_settings(self, "GET", "/limits", "call limits")
        refused = state.get("calls_refused")
        if not isinstance(refused, int) or isinstance(refused, bool) or refused < 0:
            raise RuntimeError(
                f"the gateway's call limits of rollout {self.rollout_id!r} "
                f"hold no count of refused calls: {state!r}"
            )
        return refused

    @property
    def final_calls(self) -> list[LLMCall] | None:
        """The calls recorded in this rollout once the capture block has exited; None before.

        Example:
            >>> async with capture(model) as run:  # needs a registered model  # doctest: +SKIP
            ...     assert run.final_calls is None
            >>> len(run.final_calls)  # needs a registered model  # doctest: +SKIP
            2
        """
        return None if self._final_calls is None else list(self._final_calls)

    @property
    def calls(self) -> list[LLMCall]:
        if self._final_calls is None:
            raise RuntimeError(
                "run.calls is available once the capture block has exited; use `await run.fetch_calls()` inside it"
            )
        return list(self._final_calls)

    def trajectory(
        self,
        reward: float = 0.0,
        *,
        metrics: dict[str, float | int | bool] | None = None,
        metadata: dict[str, Any] | None = None,
        logs: list[str] | None = None,
    ) -> Trajectory:
        """The rollout's trajectory, built from its recorded calls.

        Example:
            >>> async with capture(model) as run:  # needs a registered model  # doctest: +SKIP
            ...     await run.openai_client().chat.completions.create(...)
            >>> run.trajectory(reward=1.0).calls  # needs a registered model  # doctest: +SKIP
        """
        calls = self.calls
        tools = next((c.tools for c in reversed(calls) if c.tools), None)
        trajectory = Trajectory(
            id=self.rollout_id,
            calls=calls,
            tools=tools,
            reward=reward,
            metrics=dict(metrics or {}),
            metadata={**self.metadata, **(metadata or {})},
            logs=list(logs or []),
            start_time=self.start_time,
            end_time=self.end_time,
        )
        tracing.trajectory_built(self, trajectory)
        return trajectory


# Attempts at a rollout's settings request when the gateway cannot be reached (each is
# idempotent: resending it is safe), and the wait before the second one.
SAMPLING_ATTEMPTS, SAMPLING_RETRY_S = 3, 0.25


async def _rollout_settings(
    run: Run, method: str, path: str, what: str, body: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``method`` on the rollout's ``path`` (``/sampling``, ``/limits``) at the gateway serving
    ``run``, authenticated as the rollout's calls are: one path for a gateway in this
    process and one behind ``art-core serve``. Its JSON answer; ``RuntimeError`` naming
    ``what`` and the gateway's answer when it refuses, or when it cannot be reached."""
    import httpx

    url = f"{run.anthropic_base_url}{path}"
    key = run.model.inference_api_key or "art"
    async with httpx.AsyncClient(
        verify=shared_ssl_context(),
        headers={"Authorization": f"Bearer {key}"},
        timeout=httpx.Timeout(30.0, connect=10.0),
    ) as http:
        for attempt in range(1, SAMPLING_ATTEMPTS + 1):
            try:
                response = await http.request(method, url, json=body)
                break
            except httpx.TransportError as exc:
                if attempt == SAMPLING_ATTEMPTS:
                    raise RuntimeError(
                        f"could not reach the {what} of rollout {run.rollout_id!r} at {url}: "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc
                await asyncio.sleep(SAMPLING_RETRY_S * attempt)
    if response.status_code == 200:
        try:
            answer = response.json()
        except ValueError:
            answer = None
        if isinstance(answer, dict):
            return answer
        raise RuntimeError(
            f"the gateway answered the {what} of rollout {run.rollout_id!r} "
            f"with no JSON object: {response.text[:200]!r}"
        )
    try:
        reason = response.json()["error"]["message"]
    except Exception:
        reason = response.text[:500]
    hint = f" (a gateway older than rollout {what}?)" if response.status_code in (404, 405) else ""
    raise RuntimeError(
        f"the gateway refused the {what} of rollout {run.rollout_id!r}: "
        f"{response.status_code} {reason}{hint}"
    )


async def set_rollout_sampling(run: Run, sampling: RolloutSampling) -> None:
    """Tell the gateway serving ``run`` to apply ``sampling`` to every call of the rollout
    (``PUT /rollouts/{id}/sampling``). ``RuntimeError`` naming the gateway's answer when it
    refuses, or when it cannot be reached.

    Example:
        >>> await set_rollout_sampling(run, RolloutSampling(seed=7))  # needs a registered model: inside `capture`  # doctest: +SKIP
    """
    await _rollout_settings(run, "PUT", "/sampling", "sampling settings", sampling.model_dump())


async def set_rollout_limits(run: Run, limits: RolloutLimits) -> None:
    """Tell the gateway serving ``run`` to answer at most ``limits.max_calls`` calls of the
    rollout and refuse the later ones (``PUT /rollouts/{id}/limits``, see
    ``art_core.gateway.rollout_limits``). ``RuntimeError`` as ``set_rollout_sampling``.

    Example:
        >>> await set_rollout_limits(run, RolloutLimits(max_calls=1))  # needs a registered model: inside `capture`  # doctest: +SKIP
    """
    await _rollout_settings(run, "PUT", "/limits", "call limits", limits.model_dump())


@asynccontextmanager
async def capture(
    model: TrainableModel,
    *,
    rollout_id: str | None = None,
    metadata: dict[str, Any] | None = None,
    sampling: RolloutSampling | None = None,
    max_calls: int | None = None,
) -> AsyncIterator[Run]:
    """Open a rollout: calls sent to ``run.base_url`` are recorded under a fresh rollout id.

    ``sampling`` (``art.RolloutSampling``) applies to every call of the rollout, in every
    wire API, whatever the agent sends: its ``temperature`` / ``top_p`` replace the
    request's, and a call without a seed gets one derived from ``sampling.seed`` and its
    index in the rollout (the same seed replays the same run). The gateway learns them on
    entry and forgets them when the rollout is released at exit; each call records what was
    applied as ``request_params["rollout_sampling"]``.

    ``max_calls``: the gateway answers at most this many calls of the rollout; a later one
    is refused (403, ``rollout_limit_error``) before anything is sampled or recorded, and
    counted (``await run.calls_refused()``): an agent with no turn bound of its own can be
    stopped the moment it asks for more.

    Example:
        >>> async with art.capture(model) as run:  # needs a registered model  # doctest: +SKIP
        ...     client = run.openai_client()
        ...     await client.chat.completions.create(model=run.model_name, messages=[...])
        >>> trajectory = run.trajectory(reward=1.0)  # needs a registered model  # doctest: +SKIP
        >>> async with art.capture(model, sampling=art.RolloutSampling(seed=1, temperature=1.2)) as run:  # needs a registered model, and the codex CLI  # doctest: +SKIP
        ...     subprocess.run(["codex", "exec", task], env={**os.environ, **run.env()})
    """
    if sampling is not None and not isinstance(sampling, RolloutSampling):
        raise TypeError(f"sampling must be an art.RolloutSampling, got {type(sampling).__name__}")
    limits = RolloutLimits(max_calls=max_calls)  # ValidationError for a bound below 1
    run = Run(model, rollout_id or new_id("rollout"), dict(metadata or {}), sampling)
    # Before any call of the rollout can reach the gateway (and before the run is traced: a
    # run the gateway refused never started).
    if sampling is not None:
        await set_rollout_sampling(run, sampling)
    if limits.max_calls is not None:
        await set_rollout_limits(run, limits)
    tracing.run_started(run)
    token = enter_run(run)
    error: Exception | None = None
    try:
        yield run
    except Exception as exc:
        error = exc
        raise
    finally:
        exit_run(token)
        run.end_time = time.time()
        await run._close_clients()
        run._final_calls = await run.fetch_calls(release=True)
        if error is not None:
            tracing.run_failed(run, error)
