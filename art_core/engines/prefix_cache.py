"""The prefix cache: keys and values of token-id prefixes the engine computed, found again.

GRPO samples a group of runs of one task, and each turn of an agent starts from the previous
turn's prompt plus what was sampled: the same long prefix (a system prompt with tool
definitions, the conversation so far) is asked for again and again. The engine keeps the KV
of what it computed here and prefills only what is new.

**Blocks hashed in a chain, like vLLM's automatic prefix caching** (rather than a radix
tree): a sequence is cut into blocks of ``block_tokens`` tokens, and block ``i``'s key is a
hash of block ``i - 1``'s key and its own tokens, so one key names a whole prefix. Looking
up a prompt is one dictionary probe per block; every entry has the same size, so the byte
bound and least-recently-used eviction are exact per block; and two prompts that share a
prefix share its blocks without any tree surgery when they diverge. The price is at most
``block_tokens - 1`` tokens at the end of a prefix computed again. Keys are BLAKE2b digests
(not Python's ``hash``, whose collisions a caller could craft to be served another prompt's
KV), seeded with a namespace: the adapter (and its load) that computed the KV, since a LoRA
changes keys and values, so a hot-swapped adapter never reads its predecessor's entries.

Eviction is least-recently-used, with a chain's blocks touched leaf first and root last:
the root of a prefix is then always more recent than its continuations and goes after them
(a block whose parent is gone can never be found again).

The bound counts the blocks this cache holds; the KV of a running batch is the batch's.

Example:
    >>> cache = PrefixCache(capacity_bytes=1 << 20, block_tokens=4)
    >>> keys = cache.keys("base", list(range(10)))
    >>> len(keys)  # two whole blocks; the last two tokens are not a block
    2
    >>> cache.lookup(keys)
    []
"""

from __future__ import annotations

import hashlib
import os
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

BLOCK_TOKENS = 16
"""Tokens per block: vLLM's default; small enough that a prefix loses little at its end."""


@dataclass
class PrefixCacheStats:
    """Counters since the engine started (tokens are prompt tokens of the rows asked for)."""

    tokens_asked: int = 0
    """Prompt tokens of every row the engine prefilled."""
    tokens_hit: int = 0
    """Of those, tokens whose KV came from the cache."""
    tokens_computed: int = 0
    """Tokens the engine actually ran through the model to prefill (shared ones once)."""
    evictions: int = 0
    blocks_inserted: int = 0
    rows: int = 0
    rows_hit: int = 0

    @property
    def hit_rate(self) -> float:
        return self.tokens_hit / self.tokens_asked if self.tokens_asked else 0.0


@dataclass
class _Block:
    kv: torch.Tensor  # [layers, 2 (keys, values), kv heads, block_tokens, head dim]
    namespace: str
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.nbytes = self.kv.numel() * self.kv.element_size()


class PrefixCache:
    """Blocks of KV by chained key, bounded in bytes, evicted least-recently-used.

    Not thread-safe: the engine uses it from its one torch thread only.
    """

    def __init__(self, capacity_bytes: int, *, block_tokens: int = BLOCK_TOKENS) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
        self.capacity_bytes = capacity_bytes
        self.block_tokens = block_tokens
        self._blocks: OrderedDict[bytes, _Block] = OrderedDict()
        self.bytes_held = 0
        self.stats = PrefixCacheStats()

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, key: object) -> bool:
        return key in self._blocks

    def keys(self, namespace: str, token_ids: Sequence[int]) -> list[bytes]:
        """The chained key of every whole block of ``token_ids`` (a partial last block has
        none)."""
        whole = len(token_ids) // self.block_tokens
        raw = array("q", token_ids[: whole * self.block_tokens]).tobytes()
        step = self.block_tokens * 8
        key = hashlib.blake2b(namespace.encode(), digest_size=16).digest()
        out = []
        for start in range(0, whole * step, step):
            key = hashlib.blake2b(key + raw[start : start + step], digest_size=16).digest()
            out.append(key)
        return out

    def lookup(
        self, keys: Sequence[bytes], extra: dict[bytes, torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        """The KV of the longest leading run of ``keys`` held here (or in ``extra``, blocks a
        caller computed but may not have been able to keep); marks them used."""
        found: list[torch.Tensor] = []
        held: list[bytes] = []
        for key in keys:
            block = self._blocks.get(key)
            if block is not None:
                found.append(block.kv)
                held.append(key)
            elif extra is not None and key in extra:
                found.append(extra[key])
            else:
                break
        for key in reversed(held):  # leaf first, root last: roots outlive their leaves
            self._blocks.move_to_end(key)
        return found

    def held_run(self, keys: Sequence[bytes]) -> int:
        """How many leading ``keys`` are held (without marking them used)."""
        count = 0
        for key in keys:
            if key not in self._blocks:
                break
            count += 1
        return count

    def insert(self, namespace: str, keys: Sequence[bytes], blocks: Sequence[torch.Tensor]) -> None:
        """Keep ``blocks`` (one per key, in chain order, each its own storage) under their
        keys, evicting the least recently used beyond the bound. A chain longer than the
        bound keeps its leading blocks only (a leaf without its root is never found)."""
        if not keys:
            return
        fits = 0
        total = 0
        for key, kv in zip(keys, blocks, strict=True):
            if key not in self._blocks:
                total += kv.numel() * kv.element_size()
            if total > self.capacity_bytes:
                break
            fits += 1
        for key, kv in zip(keys[:fits], blocks[:fits], strict=True):
            if key in self._blocks:
                continue
            block = _Block(kv, namespace)
            self._blocks[key] = block
            self.bytes_held += block.nbytes
            self.stats.blocks_inserted += 1
        for key in reversed(keys[:fits]):
            self._blocks.move_to_end(key)
        self._evict(keep=set(keys[:fits]))

    def _evict(self, keep: set[bytes]) -> None:
        while self.bytes_held > self.capacity_bytes and self._blocks:
            key, block = next(iter(self._blocks.items()))
            if key in keep:  # cannot happen (the chain fits alone), but never loop forever
                break
            del self._blocks[key]
            self.bytes_held -= block.nbytes
            self.stats.evictions += 1

    def drop(self, namespace: str) -> None:
        """Forget every block computed under ``namespace`` (an adapter that was unloaded)."""
        for key in [k for k, b in self._blocks.items() if b.namespace == namespace]:
            self.bytes_held -= self._blocks.pop(key).nbytes

    def clear(self) -> None:
        self._blocks.clear()
        self.bytes_held = 0

    def metrics(self, prefix: str = "prefix_cache/") -> dict[str, float]:
        """Hit rate (tokens), tokens asked / hit / computed, bytes and blocks held, evictions.

        Example:
            >>> PrefixCache(1024).metrics()["prefix_cache/hit_rate"]
            0.0
        """
        s = self.stats
        return {
            prefix + "hit_rate": s.hit_rate,
            prefix + "tokens_asked": float(s.tokens_asked),
            prefix + "tokens_hit": float(s.tokens_hit),
            prefix + "tokens_computed": float(s.tokens_computed),
            prefix + "bytes": float(self.bytes_held),
            prefix + "capacity_bytes": float(self.capacity_bytes),
            prefix + "blocks": float(len(self._blocks)),
            prefix + "evictions": float(s.evictions),
        }


def default_prefix_cache_bytes(device: str | torch.device) -> int:
    """The bound when none is given: a quarter of the GPU's free memory (after the model
    loaded), or an eighth of the host's available memory on CPU, at most 8 GiB there.

    Example:
        >>> default_prefix_cache_bytes("cpu") > 0
        True
    """
    device = torch.device(device)
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free // 4)
    return min(_available_host_bytes() // 8, 8 << 30)


def _available_host_bytes() -> int:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 1 << 30
