"""``ReplicaRouter``: several engine replicas of one model behind one ``Engine``.

Routing, per call (``GenerationRequest.route_key`` is the rollout id; None on plain ``/v1``):

- **Sticky.** Every call of a rollout goes to the replica that served its first call, so an
  engine with a prefix cache (vLLM's) finds the rollout's prefix there (the transformers
  engine has no cache across calls yet: stickiness keeps a rollout on one replica and one
  adapter history). The gateway's splice of sampled ids is exact whichever replica runs
  it, since prompts are built from the recorded ids, not from a replica's state.
- **Least loaded.** A new rollout (or a call without a key) goes to the live replica with
  the fewest tokens in flight (prompt + ``n * max_tokens`` of every call sent and not
  answered), not the fewest requests: one long-context call weighs what it costs.
- **Bounded.** A pinned replica that carries more than ``hot_factor`` times the mean
  tokens in flight of the live replicas, plus ``hot_slack_tokens``, does not get the
  rollout's next call: the rollout moves to the least loaded replica (and stays there), as
  in consistent hashing with bounded loads. So a mix of long rollouts cannot pile onto one
  replica while the others idle, and ordinary imbalance never breaks stickiness.
- **Failure.** A replica that is not ``available`` (its worker died and is restarting) gets
  no calls; rollouts pinned to it move on their next call. A call in flight on a replica
  that dies fails with ``EngineUnavailable`` (503), and is never recorded.

Adapters and pause apply to every replica: ``pause`` drains all, ``load_adapter`` loads on
all (a replica that is down loads it when it is back), ``resume`` resumes all. Each result
carries the replica that served it (recorded in ``LLMCall.replica``).

Example:
    >>> router = ReplicaRouter([engine_a, engine_b])  # fragment: two started engines  # doctest: +SKIP
    >>> await router.start()  # fragment  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from art_core.engines.base import (
    AdapterInfo,
    AdapterRegistry,
    Engine,
    EngineUnavailable,
    GenerationRequest,
    GenerationResult,
    ServesAdapters,
)


@dataclass
class ReplicaLoad:
    """What one replica is doing, as the router sees it."""

    in_flight: int = 0  # calls sent, not answered
    in_flight_tokens: int = 0  # their prompt + n * max_tokens
    calls: int = 0  # answered
    failed: int = 0  # failed as unavailable
    tokens_sampled: int = 0
    # For tokens/s between two ``metrics`` readings.
    _sampled_at_reading: int = 0
    _read_at: float = 0.0


class ReplicaRouter(ServesAdapters):
    """Route calls over ``replicas`` (engines of one model); an ``Engine`` itself."""

    def __init__(
        self,
        replicas: list[Engine],
        *,
        hot_factor: float = 1.5,
        hot_slack_tokens: int = 8192,
        max_sticky_keys: int = 65536,
    ) -> None:
        if not replicas:
            raise ValueError("a router needs at least one replica")
        self.replicas = list(replicas)
        self.hot_factor = hot_factor
        self.hot_slack_tokens = hot_slack_tokens
        self.max_sticky_keys = max_sticky_keys
        self.context_length = 0
        self.load = [ReplicaLoad() for _ in self.replicas]
        self._pins: OrderedDict[str, int] = OrderedDict()
        self._adapters = AdapterRegistry(
            max(getattr(r, "max_loras", 4) for r in self.replicas),
            base_name="base",
        )
        self.moved = 0  # rollouts moved off a dead or hot replica

    # ----------------------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        await asyncio.gather(*(replica.start() for replica in self.replicas))
        self.context_length = min(replica.context_length for replica in self.replicas)
        now = time.monotonic()
        for load in self.load:
            load._read_at = now

    async def close(self) -> None:
        await asyncio.gather(
            *(replica.close() for replica in self.replicas), return_exceptions=True
        )

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer (every replica serves the same model)."""
        return getattr(self.replicas[0], "tokenizer", None)

    def available(self, index: int) -> bool:
        return bool(getattr(self.replicas[index], "available", True))

    # ----------------------------------------------------------------------------- routing
    def route(self, request: GenerationRequest) -> int:
        """The replica that serves ``request`` (pins its key to it); ``EngineUnavailable``
        when none is live."""
        live = [i for i in range(len(self.replicas)) if self.available(i)]
        if not live:
            raise EngineUnavailable("no replica of this model is serving now (restarting)")
        key = request.route_key
        pinned = self._pins.get(key) if key is not None else None
        least = min(live, key=self._load_order)
        if pinned is not None:
            if pinned in live and not self._too_hot(pinned, live):
                self._pins.move_to_end(key)  # type: ignore[arg-type]
                return pinned
            self.moved += 1
        if key is not None:
            self._pins[key] = least
            self._pins.move_to_end(key)
            while len(self._pins) > self.max_sticky_keys:
                self._pins.popitem(last=False)
        return least

    def _load_order(self, index: int) -> tuple[int, int, int, int]:
        # Tokens in flight first; among equals, the replica that answered fewer calls (so
        # calls one after another alternate), then the lower index.
        load = self.load[index]
        return (load.in_flight_tokens, load.in_flight, load.calls, index)

    def _too_hot(self, index: int, live: list[int]) -> bool:
        mean = sum(self.load[i].in_flight_tokens for i in live) / len(live)
        return self.load[index].in_flight_tokens > self.hot_factor * mean + self.hot_slack_tokens

    def pinned(self, key: str) -> int | None:
        """The replica a rollout's calls go to, if it made one."""
        return self._pins.get(key)

    async def generate(self, request: GenerationRequest) -> list[GenerationResult]:
        index = self.route(request)
        load = self.load[index]
        tokens = len(request.prompt_token_ids) + request.params.n * request.params.max_tokens
        load.in_flight += 1
        load.in_flight_tokens += tokens
        try:
            results = await self.replicas[index].generate(request)
        except EngineUnavailable as exc:
            load.failed += 1
            raise EngineUnavailable(f"replica {index}: {exc}") from exc
        finally:
            load.in_flight -= 1
            load.in_flight_tokens -= tokens
        load.calls += 1
        for result in results:
            result.replica = index
            load.tokens_sampled += len(result.token_ids)
        return results

    # ----------------------------------------------------------------------------- adapters
    async def load_adapter(self, path: Path, step: int, *, name: str | None = None) -> None:
        """Load on every replica (concurrently); then it is the router's default too."""
        outcomes = await asyncio.gather(
            *(r.load_adapter(path, step, name=name) for r in self.replicas),
            return_exceptions=True,
        )
        errors = [o for o in outcomes if isinstance(o, BaseException)]
        if errors:
            raise errors[0]
        self._adapters.add(AdapterInfo(name=name or f"step-{step}", step=step, path=Path(path)))

    async def pause(self) -> None:
        """Drain every replica: calls in flight finish, new ones wait for ``resume``."""
        await asyncio.gather(*(replica.pause() for replica in self.replicas))

    async def resume(self) -> None:
        await asyncio.gather(*(replica.resume() for replica in self.replicas))

    # ----------------------------------------------------------------------------- metrics
    async def refresh_metrics(self) -> None:
        """Each replica's own figures (prefill, prefix cache) asked for now, where a replica
        reports them through its health check (engine workers), so ``metrics`` is current."""
        refreshes = [getattr(replica, "refresh_metrics", None) for replica in self.replicas]
        await asyncio.gather(*(refresh() for refresh in refreshes if callable(refresh)))

    def metrics(self, prefix: str = "serving/") -> dict[str, float]:
        """Per replica: calls and tokens in flight, calls answered and failed, tokens/s
        sampled since the previous reading, restarts, whether it is live.

        Example:
            >>> router.metrics()["serving/replica0/in_flight"]  # fragment: a router serving requests  # doctest: +SKIP
            3.0
        """
        now = time.monotonic()
        out: dict[str, float] = {"serving/replicas": float(len(self.replicas))}
        for index, (replica, load) in enumerate(zip(self.replicas, self.load, strict=True)):
            name = f"{prefix}replica{index}/"
            elapsed = max(now - load._read_at, 1e-9)
            out[name + "in_flight"] = float(load.in_flight)
            out[name + "in_flight_tokens"] = float(load.in_flight_tokens)
            out[name + "calls"] = float(load.calls)
            out[name + "failed"] = float(load.failed)
            out[name + "tokens_per_s"] = (load.tokens_sampled - load._sampled_at_reading) / elapsed
            out[name + "restarts"] = float(getattr(replica, "restarts", 0))
            out[name + "live"] = float(self.available(index))
            for key, value in getattr(replica, "engine_metrics", {}).items():
                out[name + key] = value
            load._sampled_at_reading, load._read_at = load.tokens_sampled, now
        out[prefix + "rollouts_moved"] = float(self.moved)
        return out

    def describe(self) -> list[dict[str, Any]]:
        """One line per replica for progress output: index, live, in flight, restarts."""
        return [
            {
                "replica": index,
                "live": self.available(index),
                "in_flight": load.in_flight,
                "in_flight_tokens": load.in_flight_tokens,
                "calls": load.calls,
                "restarts": getattr(self.replicas[index], "restarts", 0),
            }
            for index, load in enumerate(self.load)
        ]
