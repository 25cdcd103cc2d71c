"""The embedded engine: batched sampling with Hugging Face transformers, in-process.

Requests queue up while a batch runs and are served together in the next one, so N concurrent
rollouts cost roughly one forward pass per token, not N. The sampling loop is written out here
(rather than ``model.generate``) because every row of a batch needs its own temperature, top-p,
seed, grammar, stop strings and token budget, and because we record each sampled id with its
logprob as it happens.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

from art_core.chat_formats.decoding import decode_ids
from art_core.device import choose_device, follow_free_cores, serving_dtype, use_cpu_threads
from art_core.engines.base import (
    AdapterInfo,
    AdapterRegistry,
    EngineError,
    GenerationRequest,
    GenerationResult,
    PromptLogprob,
    SamplingParams,
    ServesAdapters,
    check_request,
)
from art_core.engines.compiled_step import BatchKV, CompiledDecodeStep, warm_up
from art_core.engines.lora import LoraServer, UnsupportedAdapter
from art_core.engines.packed import drop_serving_forwards, pack_linears, packing_supported
from art_core.engines.prefix_cache import PrefixCache, default_prefix_cache_bytes
from art_core.engines.sampling import RowSampling, sample_next_tokens, score_tokens
from art_core.engines.step_times import StepTimes
from art_core.engines.tokenizer import ChatTokenizer, load_chat_tokenizer

logger = logging.getLogger(__name__)

# The vocabulary-sized logits a prompt is scored with (``prompt_logprobs``) take at most about
# this many bytes at once: the prompt runs through the model in chunks this bound sets.
PROMPT_SCORE_BYTES = 256 * 2**20


@dataclass
class _Pending:
    request: GenerationRequest
    future: asyncio.Future[list[GenerationResult]]
    loop: asyncio.AbstractEventLoop
    adapter: AdapterInfo | None = None
    rows: list[_Row] = field(default_factory=list)
    remaining: int = 0
    # Set when this request failed on its own (a value the engine could not use): its rows
    # leave the batch at the next step; the other requests' rows go on.
    failed: bool = False
    # Its grammar, compiled (before it was queued): each row follows a copy.
    grammar: Any | None = None
    # Its prompt scored (when ``prompt_logprobs`` asked), before its rows' prefill.
    prompt_logprobs: list[PromptLogprob | None] | None = None


# What a request is answered with: a result per choice, or why it failed.
_Outcome = list[GenerationResult] | BaseException


@dataclass
class _Seq:
    """A sequence to prefill: its tokens, the adapter it runs with, and the KV blocks of its
    first ``cached`` tokens (from the prefix cache; the last block may be cut short)."""

    token_ids: list[int]
    adapter: AdapterInfo | None
    blocks: list[torch.Tensor] = field(default_factory=list)
    cached: int = 0


@dataclass
class _Row:
    pending: _Pending
    choice_index: int
    params: SamplingParams
    generator: torch.Generator | None
    matcher: Any | None  # llguidance.LLMatcher
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str | None = None
    stop_string: str | None = None


class _AfterBatch(Exception):
    """An op that must wait for the running batch to end (it changes every layer)."""


class TransformersEngine(ServesAdapters):
    """In-process engine over a local Hugging Face model folder (CPU or CUDA).

    ``batch_window``: seconds an idle engine waits, while requests keep arriving, before it
    starts a batch (so a burst of rollouts shares one prefill). ``worker``: the single thread
    to run torch work on (LocalBackend shares one with the trainer); by default its own.
    ``chat``: the model's tokenizer when the caller loaded it already (else loaded here).
    ``prefix_cache_bytes``: the bound of the prefix cache (``prefix_cache.py``: a prefix
    computed once is not prefilled again, within a batch or across calls); None for a
    default from free memory, 0 for none.
    ``compile_decode``: decode steps run compiled (``torch.compile``, ``compiled_step.py``)
    over a fixed-width copy of the running batch's cache; default False (eager). The graphs
    are compiled at load and held to the eager step there (``warm_up``): SmolLM2-135M on 2
    CPU cores, about a minute with an empty compile cache, ~20 s from it. A model the step
    does not fit (sliding windows, soft-capped attention: ``compiled_step.fixed_width_unsupported``), a
    step that fails to compile or disagrees with the eager one, leaves the engine eager,
    saying why in ``compiled_decode_off``. Batches whose rows use several adapters at once,
    and adapters served by peft, decode eagerly.

    Example:
        >>> from art_core.embedded import resolve_base_model
        >>> engine = TransformersEngine(resolve_base_model("tiny-random"))
        >>> await engine.start()
        >>> [result] = await engine.generate(GenerationRequest([1, 2, 3], SamplingParams(max_tokens=4)))
        >>> len(result.token_ids), result.finish_reason
        (4, 'length')
        >>> await engine.close()
    """

    def __init__(
        self,
        model_path: Path,
        *,
        device: str | None = None,
        dtype: torch.dtype | str | None = None,
        max_batch_size: int = 32,
        max_loaded_adapters: int = 4,
        batch_window: float = 0.005,
        worker: ThreadPoolExecutor | None = None,
        chat: ChatTokenizer | None = None,
        prefix_cache_bytes: int | None = None,
        compile_decode: bool = False,
    ) -> None:
        if prefix_cache_bytes is not None and prefix_cache_bytes < 0:
            raise ValueError(f"prefix_cache_bytes must be >= 0, got {prefix_cache_bytes}")
        self.model_path = Path(model_path)
        self._prefix_cache_bytes = prefix_cache_bytes
        self.prefix_cache: PrefixCache | None = None
        self.compile_decode = compile_decode
        # The compiled decode step (None: eager), why it is off when asked for, and how many
        # decode steps (of a batch) it ran.
        self._compiled_decode: CompiledDecodeStep | None = None
        self.compiled_decode_off: str | None = None
        self.compiled_steps = 0
        # Each adapter load gets its own serial: the prefix cache's namespace, so a reloaded
        # name never reads the KV its previous weights computed.
        self._adapter_serials: dict[str, int] = {}
        self._loads = 0
        # Prompt tokens asked for and actually run through the model, cache on or off.
        self.prefill_tokens_asked = 0
        self.prefill_tokens_computed = 0
        self._chat = chat
        self.batch_window = batch_window
        self.device = str(choose_device(device))
        resolved = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        self.dtype: torch.dtype = resolved or serving_dtype(self.device)
        self.max_batch_size = max_batch_size
        self.tokenizer: Any = None
        self.context_length = 0
        self.model: Any = None
        self._closed = False  # by close(), for good
        self._base_model: Any = None
        # Our own LoRA layers (fast), or None once an adapter needed peft's (see lora.py).
        self._lora: LoraServer | None = None
        self._ll_tokenizer: Any = None
        self._ll_lock = threading.Lock()
        # Compiled grammars by text (agents force the same tool call again and again): each
        # row gets a copy of the compiled matcher instead of compiling it again.
        self._grammars: OrderedDict[str, Any] = OrderedDict()
        self._grammar_cache_size = 64
        self._grammar_cache_chars = 4 * 1024 * 1024  # grammar text kept as keys, at most
        self._vocab_size: int | None = None
        self._eos_ids: set[int] = set()
        self._pad_id = 0
        self._adapters = AdapterRegistry(max_loaded_adapters)
        self._queue: deque[_Pending] = deque()
        self._queue_lock = threading.Lock()
        self._wake: asyncio.Event | None = None
        self._model_lock: asyncio.Lock | None = None
        self._paused = False
        # Requests that ended at this decode step, answered together (``_answer_finished``).
        self._finished: list[tuple[_Pending, _Outcome]] = []
        # Where decode steps spend their time, when a benchmark asks (``step_times``).
        self.step_times: StepTimes | None = None
        self._scheduler: asyncio.Task[None] | None = None
        # Work on the model that must not wait for a batch to end (loading an adapter while
        # serving): run by the torch thread between decode steps, or by the scheduler when
        # no batch runs.
        self._ops: list[tuple[Callable[[], Any], Future[Any]]] = []
        self._ops_lock = threading.Lock()
        self._decoding = False
        self.batches_run = 0
        self.rows_served = 0
        # All torch work runs on one thread (``worker``, shared with the trainer by
        # LocalBackend, or our own): OpenMP keeps a thread team per calling thread, and the
        # teams of other threads compete for the cores (asyncio.to_thread, which hops between
        # pool threads, measured ~1.7x slower decode steps).
        self._worker = worker
        self._owns_worker = worker is None

    # ----------------------------------------------------------------------------- lifecycle
    def load(self) -> None:
        """Load tokenizer and weights (blocking; ``start`` runs it in a thread)."""
        from transformers import AutoModelForCausalLM

        if self.device == "cpu":
            use_cpu_threads()
        chat = self._chat or load_chat_tokenizer(self.model_path)
        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=self.dtype)
        model.to(self.device)  # type: ignore[arg-type]
        model.eval()
        self.tokenizer = chat.tokenizer
        self._base_model = self.model = model
        self._cache_keyword = cache_keyword(model)
        if packing_supported(self.device, self.dtype):
            packed = pack_linears(model)
            logger.debug("pre-packed %d linear layers for oneDNN", packed)
        self._lora = LoraServer(model)
        embeddings: Any = model.get_input_embeddings()
        self._vocab_size = int(embeddings.num_embeddings)
        self.context_length = chat.context_length
        self._eos_ids = chat.eos_token_ids
        self._pad_id = chat.pad_token_id
        self.prefix_cache = self._new_prefix_cache(model)
        if self.compile_decode:
            self._compiled_decode = self._compiled_step(model)

    def _compiled_step(self, model: Any) -> CompiledDecodeStep | None:
        """The compiled decode step, compiled now and held to the eager step; None (and
        ``compiled_decode_off`` says why) when it cannot serve this model."""
        try:  # refused for a model it does not fit (fixed_width_unsupported)
            step = CompiledDecodeStep(model, pad_id=self._pad_id, dynamic=True)
        except ValueError as exc:
            reason: str | None = str(exc)
        else:
            started = time.perf_counter()
            reason = warm_up(step, token_id=self._pad_id)
            logger.info("compiled decode step ready in %.1f s", time.perf_counter() - started)
        if reason is not None:
            logger.warning("decode steps run eagerly: %s", reason)
            self.compiled_decode_off = reason
            return None
        return step

    def _compiled_for(self, rows: list[_Row]) -> CompiledDecodeStep | None:
        """The compiled step, where it serves this batch's next step: our LoRA layers
        (not peft's), one adapter (or none) for every row, and it has not fallen back."""
        step = self._compiled_decode
        if step is None or self._lora is None or step.fallback is not None:
            return None
        first = self._served_name(rows[0].pending.adapter)
        if any(self._served_name(row.pending.adapter) != first for row in rows):
            return None
        return step

    @staticmethod
    def _served_name(adapter: AdapterInfo | None) -> str | None:
        """The LoRA a row runs with (None: the base model; an adapter of step 0 is it)."""
        return None if adapter is None or adapter.step == 0 else adapter.name

    def _new_prefix_cache(self, model: Any) -> PrefixCache | None:
        """The prefix cache, where this model's KV cache is one plain tensor per layer."""
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        size = self._prefix_cache_bytes
        if size is None:
            size = default_prefix_cache_bytes(self.device)
        if size <= 0:
            return None
        layers = DynamicCache(config=model.config).layers
        if not layers or any(type(layer) is not DynamicLayer for layer in layers):
            # Sliding windows and recurrent layers keep no per-token KV to reuse.
            logger.info("no prefix cache: %s's KV cache is not per-token", type(model).__name__)
            return None
        logger.debug("prefix cache of %.0f MiB", size / 2**20)
        return PrefixCache(size)

    async def start(self) -> None:
        if self._closed:
            raise EngineError("this engine was closed: build a new one to serve again")
        if self.model is None:
            await self._in_worker(self.load)
        self._wake = asyncio.Event()
        self._model_lock = asyncio.Lock()
        self._scheduler = asyncio.create_task(self._schedule(), name="art-engine-scheduler")

    async def close(self) -> None:
        if self._scheduler is not None:
            self._scheduler.cancel()
            try:
                await self._scheduler
            except asyncio.CancelledError:
                pass
            self._scheduler = None
        with self._queue_lock:
            leftover, self._queue = list(self._queue), deque()
        for pending in leftover:
            if not pending.future.done():
                pending.future.set_exception(EngineError("the engine was shut down"))
        if self._worker is not None and self._owns_worker:
            self._worker.shutdown(wait=False)
            self._worker = None
        if self.model is not None:
            # For good (``start`` refuses): without the forwards serving set on its modules,
            # which hold them in cycles, the model is freed by reference counting alone
            # when its last holder lets go, with no full collection of a frozen heap.
            drop_serving_forwards(self.model)
        self._closed = True

    async def run_in_model_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the thread the model runs on, between two batches: what must see
        the engine's own torch calls (a profiler) starts there.

        Example:
            >>> from art_core.embedded import resolve_base_model
            >>> engine = TransformersEngine(resolve_base_model("tiny-random"))
            >>> await engine.run_in_model_thread(torch.get_num_threads) >= 1
            True
            >>> await engine.close()
        """
        return await self._in_worker(fn, *args)

    async def _in_worker(self, fn: Any, *args: Any) -> Any:
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="art-engine")
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)

    @property
    def max_loaded_adapters(self) -> int:
        """How many adapters stay loaded (the oldest is unloaded beyond it)."""
        return self._adapters.capacity

    @max_loaded_adapters.setter
    def max_loaded_adapters(self, value: int) -> None:
        self._adapters.capacity = value

    @property
    def eos_token_ids(self) -> set[int]:
        return set(self._eos_ids)

    def metrics(self, prefix: str = "") -> dict[str, float]:
        """Prefill counters, the prefix cache's figures (hit rate, bytes, evictions) and,
        with ``compile_decode``, the decode steps the compiled step ran.

        Example:
            >>> from art_core.embedded import resolve_base_model
            >>> engine = TransformersEngine(resolve_base_model("tiny-random"))
            >>> await engine.start()
            >>> prompt = GenerationRequest(list(range(5, 105)), SamplingParams(max_tokens=2))
            >>> _ = await engine.generate(prompt); _ = await engine.generate(prompt)
            >>> engine.metrics()["prefix_cache/hit_rate"]  # the second prefill was mostly cached
            0.48
            >>> await engine.close()
        """
        out = {
            prefix + "prefill/tokens_asked": float(self.prefill_tokens_asked),
            prefix + "prefill/tokens_computed": float(self.prefill_tokens_computed),
        }
        if self.compile_decode:
            out[prefix + "decode/compiled_steps"] = float(self.compiled_steps)
        if self.prefix_cache is not None:
            out.update(self.prefix_cache.metrics(prefix + "prefix_cache/"))
        return out

    # ----------------------------------------------------------------------------- requests
    async def generate(self, request: GenerationRequest) -> list[GenerationResult]:
        """Queue a request; it joins the next batch. Returns one result per choice."""
        if self._wake is None:
            raise EngineError("the engine is not started")
        self._check_request(request)
        grammar = request.params.grammar
        compiled = None
        if grammar is not None:
            compiled = (
                self._compiled(grammar)  # a lookup
                if self._grammar_cached(grammar)
                else await asyncio.to_thread(self._compiled, grammar)  # CPU work: off the loop
            )
        loop = asyncio.get_running_loop()
        pending = _Pending(
            request=request, future=loop.create_future(), loop=loop, grammar=compiled
        )
        with self._queue_lock:
            self._queue.append(pending)
        self._wake.set()
        return await pending.future

    def _check_request(self, request: GenerationRequest) -> None:
        check_request(request, self._vocab_size)
        if request.params.n > self.max_batch_size:
            # It could never join a batch: it would wait forever at the head of the queue.
            raise EngineError(
                f"n={request.params.n} is more than this engine's batch size "
                f"({self.max_batch_size})"
            )
        prompt_len = len(request.prompt_token_ids)
        if prompt_len == 0:
            raise EngineError("the prompt is empty")
        if prompt_len + request.params.max_tokens > self.context_length:
            raise EngineError(
                f"the prompt has {prompt_len} tokens and max_tokens is "
                f"{request.params.max_tokens}, more than the context length "
                f"{self.context_length}"
            )

    async def pause(self) -> None:
        """Finish the running batch; hold new requests in the queue until ``resume``."""
        self._paused = True
        assert self._model_lock is not None
        async with self._model_lock:
            pass

    async def resume(self) -> None:
        self._paused = False
        if self._wake is not None:
            self._wake.set()

    async def load_adapter(self, path: Path, step: int, *, name: str | None = None) -> None:
        """Load a PEFT adapter folder and serve it by default from now on.

        With the engine's own LoRA layers this happens between two decode steps, without
        draining: rows already running finish on the adapter they started with (one batch
        serves rows of several adapters) and new requests start on the new one. With peft
        (adapters our layers cannot serve), it waits for the running batch to end.
        """
        await self._run_op(lambda: self._load_adapter(Path(path), step, name or f"step-{step}"))

    async def unload_adapter(self, name: str) -> None:
        """Stop serving adapter ``name`` and free it (after the running batch, whose rows may
        use it); a name not loaded is ignored."""

        def unload() -> None:
            if name not in self._adapters:
                return
            if self._decoding:
                raise _AfterBatch
            self._adapters.remove(name)
            self._unload(name)

        await self._run_op(unload)

    async def _run_op(self, op: Callable[[], Any]) -> Any:
        """Run ``op`` on the torch thread as soon as the model may change (see ``_ops``)."""
        if self._wake is None:
            raise EngineError("the engine is not started")
        future: Future[Any] = Future()
        with self._ops_lock:
            self._ops.append((op, future))
        self._wake.set()
        return await asyncio.wrap_future(future)

    def _run_ops(self) -> None:
        """On the torch thread: run the queued ops, in order; each fails alone. An op that
        cannot run inside a batch (``_AfterBatch``) waits for its end."""
        with self._ops_lock:
            ops, self._ops = self._ops, []
        waiting = []
        for op, future in ops:
            if future.cancelled():  # its caller gave up (e.g. a cancelled train): skip it
                continue
            try:
                result = op()
            except _AfterBatch:
                waiting.append((op, future))
                continue
            except BaseException as exc:
                _settle(future, exception=exc)
                continue
            _settle(future, result=result)
        if waiting:  # run again at the batch's end (``_run_batch`` runs the ops then)
            with self._ops_lock:
                self._ops[:0] = waiting

    def _load_adapter(self, path: Path, step: int, name: str) -> None:
        if not (path / "adapter_config.json").is_file():
            raise EngineError(f"{path} is not a PEFT adapter folder (no adapter_config.json)")
        if self._lora is not None:
            try:
                self._lora.load(name, path)
            except UnsupportedAdapter as exc:
                if self._decoding:
                    raise _AfterBatch from exc  # the switch to peft changes every layer
                logger.info("serving adapters with peft from now on: %s", exc)
                self._switch_to_peft()
        if self._lora is None:
            self._load_with_peft(path, name)
        self._forget_prefixes(name)
        self._loads += 1
        self._adapter_serials[name] = self._loads
        for evicted in self._adapters.add(AdapterInfo(name=name, step=step, path=path)):
            self._unload(evicted.name)

    def _load_with_peft(self, path: Path, name: str) -> None:
        from peft import PeftModel

        if isinstance(self.model, PeftModel) and name in self.model.peft_config:
            self.model.delete_adapter(name)
        if isinstance(self.model, PeftModel):
            self.model.load_adapter(str(path), adapter_name=name)
        else:
            self.model = PeftModel.from_pretrained(self._base_model, str(path), adapter_name=name)
        self.model.eval()

    def _unload(self, name: str) -> None:
        """Free an adapter the registry let go of."""
        self._forget_prefixes(name)
        self._adapter_serials.pop(name, None)
        if self._lora is not None:
            self._lora.remove(name)
        else:
            self.model.delete_adapter(name)

    def _forget_prefixes(self, name: str) -> None:
        """Drop the prefix cache's entries of adapter ``name``'s current load."""
        if self.prefix_cache is not None and name in self._adapter_serials:
            self.prefix_cache.drop(f"{name}#{self._adapter_serials[name]}")

    def _namespace(self, adapter: AdapterInfo | None) -> str:
        """Whose weights computed a row's KV: the base, or one load of one adapter."""
        if adapter is None or adapter.step == 0:
            return "base"
        return f"{adapter.name}#{self._adapter_serials.get(adapter.name, 0)}"

    def _switch_to_peft(self) -> None:
        """An adapter our LoRA layers cannot serve arrived: serve all of them with peft."""
        assert self._lora is not None
        if self.prefix_cache is not None:  # KV computed by our layers, not peft's
            self.prefix_cache.clear()
        self._lora.uninstall()
        self._lora = None
        for info in self._adapters.all():
            if info.path is not None and (info.path / "adapter_config.json").is_file():
                self._load_with_peft(info.path, info.name)
            else:
                logger.warning("adapter %s (%s) is gone from disk; unloaded", info.name, info.path)
                self._adapters.remove(info.name)

    # ----------------------------------------------------------------------------- scheduling
    async def _schedule(self) -> None:
        assert self._wake is not None and self._model_lock is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._ops:
                async with self._model_lock:
                    await self._in_worker(self._run_ops)
            await self._gather_arrivals()
            while self._queue and not self._paused:
                async with self._model_lock:
                    if self._paused:
                        break
                    batch = self._take_batch()
                    if not batch:
                        continue
                    try:
                        await self._in_worker(self._run_batch, batch)
                    except Exception as exc:  # a bug or OOM: fail this batch, keep serving
                        logger.exception("batch failed")
                        for pending in batch:
                            _resolve(pending, exc)

    async def _gather_arrivals(self) -> None:
        """Wait while requests keep arriving, so a burst starts as one batch.

        Concurrent rollouts reach an idle engine a millisecond or so apart; starting on the
        first alone would prefill it by itself, then make the rest wait for that and join
        with a second prefill. Waits ``batch_window`` at a time while the queue grows, at
        most ten windows.
        """
        if self.batch_window <= 0:
            return
        seen = len(self._queue)
        for _ in range(10):
            if seen >= self.max_batch_size:
                return
            await asyncio.sleep(self.batch_window)
            if len(self._queue) == seen:
                return
            seen = len(self._queue)

    def _adapter_for(self, pending: _Pending) -> AdapterInfo | None:
        if pending.request.adapter is None:
            return self._adapters.current
        return self._adapters.get(pending.request.adapter) or self._adapters.by_step(0)

    def _take_batch(self, key: str | None = None, room: int | None = None) -> list[_Pending]:
        """Queued requests for one adapter (``key``, or the first one's), up to ``room`` rows.

        Called by the scheduler to start a batch, and by the worker thread between decode
        steps to let new requests join the running batch.
        """
        room = self.max_batch_size if room is None else room
        batch: list[_Pending] = []
        rows = 0
        with self._queue_lock:
            kept: deque[_Pending] = deque()
            while self._queue:
                pending = self._queue.popleft()
                if pending.future.done():  # cancelled by a disconnected client
                    continue
                adapter = self._adapter_for(pending)
                name = adapter.name if adapter else "base"
                key = name if key is None and not batch else key
                n = pending.request.params.n
                # Our LoRA layers serve rows of several adapters in one batch; peft does not.
                if (name != key and self._lora is None) or rows + n > room:
                    kept.append(pending)
                    continue
                pending.adapter = adapter
                batch.append(pending)
                rows += n
            self._queue = kept
        return batch

    # ----------------------------------------------------------------------------- sampling
    def _grammar_cached(self, grammar: str) -> bool:
        with self._ll_lock:
            return grammar in self._grammars

    def _compiled(self, grammar: str) -> Any:
        """The compiled matcher of ``grammar`` (cached; rows use copies); ``EngineError`` when
        it does not compile."""
        import llguidance
        import llguidance.hf

        with self._ll_lock:
            if grammar in self._grammars:
                self._grammars.move_to_end(grammar)
                return self._grammars[grammar]
            if self._ll_tokenizer is None:
                n_vocab = int(self._base_model.get_output_embeddings().weight.shape[0])
                self._ll_tokenizer = llguidance.hf.from_tokenizer(
                    self.tokenizer, n_vocab=n_vocab, eos_token=sorted(self._eos_ids)
                )
        matcher = llguidance.LLMatcher(self._ll_tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise EngineError(f"invalid grammar / schema: {matcher.get_error()}")
        if len(grammar) > self._grammar_cache_chars // 16:
            return matcher  # too large to keep: compiled again when sent again
        with self._ll_lock:
            self._grammars[grammar] = matcher
            while len(self._grammars) > self._grammar_cache_size or (
                sum(map(len, self._grammars)) > self._grammar_cache_chars
            ):
                self._grammars.popitem(last=False)
        return matcher

    def _rows(self, batch: list[_Pending]) -> list[_Row]:
        """The rows of each request; a request whose rows cannot be set up fails alone."""
        rows: list[_Row] = []
        for pending in batch:
            try:
                if pending.request.params.prompt_logprobs is not None:
                    pending.prompt_logprobs = self._score_prompt(pending)
                own = self._rows_of(pending)
            except Exception as exc:
                self._fail(pending, exc)
                continue
            pending.rows += own
            rows += own
        self.rows_served += len(rows)
        return rows

    def _rows_of(self, pending: _Pending) -> list[_Row]:
        params = pending.request.params
        pending.remaining = params.n
        rows = []
        for choice in range(params.n):
            generator = None
            if params.seed is not None:
                generator = torch.Generator(device="cpu").manual_seed(params.seed + choice)
            matcher = pending.grammar.deep_copy() if pending.grammar is not None else None
            rows.append(_Row(pending, choice, params, generator, matcher))
        return rows

    @staticmethod
    def _fail(pending: _Pending, exc: BaseException) -> None:
        """Fail one request alone: its rows leave the batch, the others' go on."""
        logger.warning("a request failed inside its batch (the others go on): %r", exc)
        pending.failed = True
        _resolve(pending, exc)

    def _run_batch(self, batch: list[_Pending]) -> None:
        adapter = batch[0].adapter
        self.batches_run += 1
        joined: list[_Pending] = []
        try:
            if self._lora is not None:
                self._decoding = True
                try:
                    self._decode(batch, joined)
                finally:
                    self._decoding = False
                    self._lora.use_rows([])  # adapters dropped meanwhile are freed now
                    self._run_ops()
            elif adapter is None or adapter.step == 0:
                if hasattr(self.model, "disable_adapter") and self._adapters:
                    with self.model.disable_adapter():
                        self._decode(batch, joined)
                else:
                    self._decode(batch, joined)
            else:
                self.model.set_adapter(adapter.name)
                self._decode(batch, joined)
        except Exception as exc:
            self._answer_finished()  # the requests that ended before it keep their results
            for pending in batch + joined:
                _resolve(pending, exc)

    def _finish(self, row: _Row) -> None:
        """A row is done; its request is answered as soon as all its choices are (with the
        other requests that end at the same decode step: ``_answer_finished``)."""
        pending = row.pending
        pending.remaining -= 1
        if pending.remaining:
            return
        step = pending.adapter.step if pending.adapter else 0
        self._finished.append(
            (
                pending,
                [
                    GenerationResult(
                        choice_index=r.choice_index,
                        token_ids=r.tokens,
                        logprobs=r.logprobs,
                        finish_reason=r.finish_reason or "length",
                        adapter_step=step,
                        top_logprobs=r.top,
                        stop_string=r.stop_string,
                        prompt_logprobs=pending.prompt_logprobs,
                    )
                    for r in pending.rows
                ],
            )
        )

    def _answer_finished(self) -> None:
        """Hand every request that ended since the last call its results (``_resolve_all``:
        one wake-up of each caller's event loop for all of them)."""
        if self._finished:
            finished, self._finished = self._finished, []
            _resolve_all(finished)

    @torch.inference_mode()
    def _score_prompt(self, pending: _Pending) -> list[PromptLogprob | None]:
        """Each prompt token's logprob, rank and top alternatives given the tokens before it
        (``prompt_logprobs``), computed by the weights that serve the request (its adapter:
        our LoRA layers are told here; with peft, the batch runs under it already).

        The prompt runs through the model in chunks, each after the KV of those before it,
        so the vocabulary-sized logits held at once stay near ``PROMPT_SCORE_BYTES`` however
        long the prompt. The KV left behind goes into the prefix cache: the request's own
        prefill, next, finds it there instead of computing the prompt again.
        """
        from transformers import DynamicCache

        ids = pending.request.prompt_token_ids
        k = pending.request.params.prompt_logprobs or 0
        assert self._vocab_size is not None
        # Per position: the logits in the model's dtype, their fp32 copy and log-softmax.
        chunk = max(16, PROMPT_SCORE_BYTES // (12 * self._vocab_size))
        self._use_adapters([pending.adapter])
        tokens = torch.tensor([ids], dtype=torch.long, device=self.device)
        cache = DynamicCache(config=self._base_model.config)
        scored: list[PromptLogprob | None] = [None]  # the first token has nothing before it
        # The last token's logits would score what follows the prompt: not run here.
        scored_len = len(ids) - 1
        for start in range(0, scored_len, chunk):
            end = min(start + chunk, scored_len)
            out = self.model(
                input_ids=tokens[:, start:end],
                attention_mask=torch.ones((1, end), dtype=torch.long, device=self.device),
                position_ids=torch.arange(start, end, device=self.device).unsqueeze(0),
                use_cache=True,
                **{self._cache_keyword: cache},
            )
            scored += score_tokens(out.logits[0], tokens[0, start + 1 : end + 1], k)
            del out
        self.prefill_tokens_computed += scored_len
        if self.prefix_cache is not None and scored_len > 0:
            keys = self.prefix_cache.keys(self._namespace(pending.adapter), ids[:scored_len])
            attention = torch.ones((1, scored_len), dtype=torch.long, device=self.device)
            self._keep(cache, attention, 0, pending.adapter, keys)
        return scored

    def _use_rows(self, rows: list[_Row]) -> None:
        """Tell our LoRA layers which adapter each row of the next forward uses."""
        self._use_adapters([row.pending.adapter for row in rows])

    def _use_adapters(self, adapters: list[AdapterInfo | None]) -> None:
        if self._lora is not None:
            self._lora.use_rows([self._served_name(a) for a in adapters])

    # ----------------------------------------------------------------------------- prefill
    def _prefill(self, rows: list[_Row]) -> _BatchState:
        """Run the rows' prompts through the model: their KV and first logits.

        With the prefix cache, a prompt's cached prefix is not computed again, and a prefix
        that several rows share (the ``n`` choices of a request, a group's runs) is computed
        once, first, for all of them.
        """
        self.prefill_tokens_asked += sum(len(r.pending.request.prompt_token_ids) for r in rows)
        if self.prefix_cache is None:
            seqs = [_Seq(row.pending.request.prompt_token_ids, row.pending.adapter) for row in rows]
            return _BatchState(rows, *self._forward(seqs))
        cache, stats = self.prefix_cache, self.prefix_cache.stats
        keys = {
            id(p): cache.keys(self._namespace(p.adapter), p.request.prompt_token_ids)
            for p in {id(row.pending): row.pending for row in rows}.values()
        }
        computed_before = self.prefill_tokens_computed
        shared = self._prefill_shared(rows, keys)
        seqs = []
        for row in rows:
            prompt = row.pending.request.prompt_token_ids
            seq = self._cached_seq(prompt, row.pending.adapter, keys[id(row.pending)], shared)
            seqs.append(seq)
            stats.rows += 1
            stats.rows_hit += seq.cached > 0
            stats.tokens_asked += len(prompt)
            stats.tokens_hit += seq.cached
        state = _BatchState(rows, *self._forward(seqs))
        stats.tokens_computed += self.prefill_tokens_computed - computed_before
        # Keep each prompt's blocks now, not only when its row ends: rollouts of the same
        # group that arrive while this batch runs find them.
        first_row = {id(row.pending): i for i, row in reversed(list(enumerate(rows)))}
        for request, i in first_row.items():
            self._keep(state.cache, state.attention, i, rows[i].pending.adapter, keys[request])
        return state

    def _cached_seq(
        self,
        token_ids: list[int],
        adapter: AdapterInfo | None,
        keys: list[bytes],
        extra: dict[bytes, torch.Tensor] | None = None,
    ) -> _Seq:
        """``token_ids`` with the longest prefix the cache holds (at least one token left to
        compute: the model's logits come from the last one)."""
        assert self.prefix_cache is not None
        block = self.prefix_cache.block_tokens
        blocks = self.prefix_cache.lookup(keys, extra)
        cached = min(len(blocks) * block, len(token_ids) - 1)
        return _Seq(token_ids, adapter, blocks[: -(-cached // block)], cached)

    def _prefill_shared(
        self, rows: list[_Row], keys: dict[int, list[bytes]]
    ) -> dict[bytes, torch.Tensor]:
        """Compute once the prefixes that two or more rows share and the cache lacks; their
        blocks by key (also kept in the cache, as far as its bound allows)."""
        assert self.prefix_cache is not None
        count: dict[bytes, int] = {}
        for row in rows:
            for key in keys[id(row.pending)]:
                count[key] = count.get(key, 0) + 1
        candidates: dict[bytes, tuple[_Pending, int]] = {}
        for row in rows:
            own = keys[id(row.pending)]
            shared = 0
            while shared < len(own) and count[own[shared]] >= 2:
                shared += 1
            if shared and self.prefix_cache.held_run(own[:shared]) < shared:
                candidates[own[shared - 1]] = (row.pending, shared)
        # A prefix of another candidate comes with it.
        inner = {k for p, n in candidates.values() for k in keys[id(p)][: n - 1]}
        chosen = [(p, n) for last, (p, n) in candidates.items() if last not in inner]
        if not chosen:
            return {}
        block = self.prefix_cache.block_tokens
        seqs = [
            self._cached_seq(p.request.prompt_token_ids[: n * block], p.adapter, keys[id(p)][:n])
            for p, n in chosen
        ]
        kv, attention, _, _ = self._forward(seqs)
        computed: dict[bytes, torch.Tensor] = {}
        for i, (p, n) in enumerate(chosen):
            own = keys[id(p)][:n]
            held = len(seqs[i].blocks)  # cached ones (the last may be partial: recomputed)
            held -= bool(seqs[i].cached % block)
            new = self._blocks_of(kv, attention, i, held, n)
            computed.update(zip(own[held:], new, strict=True))
            self.prefix_cache.insert(self._namespace(p.adapter), own[held:], new)
        return computed

    def _keep(
        self,
        kv: Any,
        attention: torch.Tensor,
        index: int,
        adapter: AdapterInfo | None,
        keys: list[bytes],
    ) -> None:
        """Put the blocks of row ``index`` of a batch that the cache lacks into it."""
        assert self.prefix_cache is not None
        held = self.prefix_cache.held_run(keys)
        if held < len(keys):
            blocks = self._blocks_of(kv, attention, index, held, len(keys))
            self.prefix_cache.insert(self._namespace(adapter), keys[held:], blocks)

    def _remember(self, state: _BatchState, index: int) -> None:
        """A row ended: keep what it computed (its prompt and the tokens it was fed) for the
        next turn, which starts with them."""
        assert self.prefix_cache is not None
        row = state.rows[index]
        fed = row.pending.request.prompt_token_ids + row.tokens[:-1]
        if int(state.attention[index].sum()) != len(fed):
            logger.debug("row KV does not line up with its tokens; not cached")
            return
        keys = self.prefix_cache.keys(self._namespace(row.pending.adapter), fed)
        self._keep(state.cache, state.attention, index, row.pending.adapter, keys)

    def _blocks_of(
        self, kv: Any, attention: torch.Tensor, index: int, first: int, end: int
    ) -> list[torch.Tensor]:
        """Blocks ``first`` to ``end - 1`` of row ``index``'s sequence, each its own tensor
        ``[layers, 2, kv heads, block, head dim]`` (so evicting one frees it)."""
        assert self.prefix_cache is not None
        block = self.prefix_cache.block_tokens
        columns = attention[index].nonzero().squeeze(-1)[first * block : end * block]
        keys = torch.stack([layer.keys[index].index_select(1, columns) for layer in kv.layers])
        values = torch.stack([layer.values[index].index_select(1, columns) for layer in kv.layers])
        both = torch.stack([keys, values], dim=1)
        return [chunk.clone() for chunk in both.split(block, dim=3)]

    def _forward(self, seqs: list[_Seq]) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One forward over the part of each sequence that is not cached, after its cached KV.

        Each row's columns: [padding][its cached prefix][padding][its new tokens], so every
        row ends at the last column (its next-token logits) and attends to its own tokens
        alone; positions are per row, so the numbers do not depend on the padding.
        Returns the KV cache, attention mask, each row's last position and its logits.
        """
        from transformers import DynamicCache

        self._use_adapters([seq.adapter for seq in seqs])
        news = [seq.token_ids[seq.cached :] for seq in seqs]
        width = max(len(new) for new in news)
        past = max(seq.cached for seq in seqs)
        input_ids = torch.full((len(seqs), width), self._pad_id, dtype=torch.long)
        attention = torch.zeros((len(seqs), past + width), dtype=torch.long)
        positions = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, (seq, new) in enumerate(zip(seqs, news, strict=True)):
            input_ids[i, width - len(new) :] = torch.tensor(new)
            attention[i, past - seq.cached : past] = 1
            attention[i, past + width - len(new) :] = 1
            positions[i, width - len(new) :] = torch.arange(seq.cached, seq.cached + len(new))
        input_ids, attention, positions = (
            input_ids.to(self.device),
            attention.to(self.device),
            positions.to(self.device),
        )
        cache = DynamicCache(config=self._base_model.config)
        if past:
            self._fill_past(cache, seqs, past)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_keyword: cache},
        )
        self.prefill_tokens_computed += sum(len(new) for new in news)
        return cache, attention, positions[:, -1], out.logits[:, -1, :].float()

    def _fill_past(self, cache: Any, seqs: list[_Seq], past: int) -> None:
        """Lay each row's cached blocks right-aligned into ``past`` columns of ``cache``."""
        assert self.prefix_cache is not None
        block = self.prefix_cache.block_tokens
        first = next(seq.blocks[0] for seq in seqs if seq.blocks)
        layers, _, heads, _, dim = first.shape
        kv = first.new_zeros((layers, 2, len(seqs), heads, past, dim))
        for i, seq in enumerate(seqs):
            at = past - seq.cached
            for b, blk in enumerate(seq.blocks):
                take = min(block, seq.cached - b * block)
                start = at + b * block
                kv[:, :, i, :, start : start + take] = blk[:, :, :, :take]
        for layer in range(layers):
            cache.update(kv[layer, 0], kv[layer, 1], layer)

    @torch.inference_mode()
    def _decode(self, batch: list[_Pending], joined: list[_Pending]) -> None:
        rows = self._rows(batch)
        if not rows:
            return
        times = self.step_times
        clock = self._step_clock()
        started = clock()
        state = self._prefill(rows)
        if times is not None:
            times.add("prefill", clock() - started)
        key = batch[0].adapter.name if batch[0].adapter else "base"
        on_cpu = self.device == "cpu"
        while True:
            if self._lora is not None:
                self._run_ops()  # e.g. a new adapter, between two steps
            if on_cpu:
                follow_free_cores()  # fewer threads while other processes run
            started = clock()
            next_ids = self._sample(state.logits, state.rows)
            sampled = next_ids.tolist()
            recorded = clock()
            keep = [
                j
                for j, row in enumerate(state.rows)
                if not row.pending.failed and not self._advance(row, sampled[j])
            ]
            if self.prefix_cache is not None and len(keep) < len(state.rows):
                kept = set(keep)
                for j, row in enumerate(state.rows):
                    if j not in kept and not row.pending.failed:
                        self._remember(state, j)
            self._answer_finished()  # before this step's forward, not after it
            state.select(keep)
            stepped = clock()
            if keep:
                self._step(state, next_ids[keep])
            joining = clock()
            new_rows: list[_Row] = []
            while not new_rows and not self._paused:
                newcomers = self._take_batch(key, self.max_batch_size - len(keep))
                if not newcomers:
                    break
                joined.extend(newcomers)
                new_rows = self._rows(newcomers)  # empty when each failed on its own
            if new_rows:
                fresh = self._prefill(new_rows)
                state = state.merge(fresh) if keep else fresh
            if times is not None:
                times.add("sample", recorded - started)  # less logprobs and grammar (below)
                times.add("record", stepped - recorded)
                times.add("forward", joining - stepped)
                if new_rows:
                    times.add("join", clock() - joining)
            if not new_rows and not keep:
                return

    def _step(self, state: _BatchState, next_ids: torch.Tensor) -> None:
        """Feed the batch's rows their tokens: compiled where it serves the batch."""
        self._use_rows(state.rows)
        compiled = self._compiled_for(state.rows)
        if compiled is not None:
            state.step_compiled(compiled, next_ids)
            self.compiled_steps += 1
        else:
            state.step(self.model, next_ids, self._cache_keyword)

    def _step_clock(self) -> Callable[[], float]:
        """The clock of ``step_times``: on a GPU it waits for the device first (only while
        a benchmark measures), so each part is charged its own kernels rather than the next
        part that reads a result."""
        if self.step_times is not None and self.device.startswith("cuda"):

            def synchronized() -> float:
                torch.cuda.synchronize()
                return time.perf_counter()

            return synchronized
        return time.perf_counter

    def _sample(self, logits: torch.Tensor, rows: list[_Row]) -> torch.Tensor:
        """One token per row, honouring each row's own sampling parameters and grammar."""
        times = self.step_times
        clock = self._step_clock()
        started = clock()
        settings = []
        for row in rows:
            allowed = None
            if row.matcher is not None and not row.pending.failed:
                try:
                    allowed = self._allowed(row.matcher, logits.shape[-1])
                except Exception as exc:  # this row's grammar broke: it fails alone
                    self._fail(row.pending, exc)
            settings.append(
                RowSampling(
                    temperature=row.params.temperature,
                    top_k=row.params.top_k,
                    top_p=row.params.top_p,
                    generator=row.generator,
                    allowed=allowed,
                )
            )
        masked = clock()
        tokens, logprobs = sample_next_tokens(logits, settings)
        scoring = clock()
        chosen = logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).tolist()
        for j, row in enumerate(rows):
            row.logprobs.append(chosen[j])
            if row.params.top_logprobs > 0:
                top = torch.topk(logprobs[j], row.params.top_logprobs)
                row.top.append(list(zip(top.indices.tolist(), top.values.tolist(), strict=True)))
        if times is not None:
            # Counted inside "sample" by the loop: taken out of it again there.
            times.add("grammar", masked - started)
            times.add("logprobs", clock() - scoring)
        return tokens

    @staticmethod
    def _allowed(matcher: Any, vocab: int) -> torch.Tensor:
        import llguidance.torch

        bitmask = llguidance.torch.allocate_token_bitmask(1, vocab)
        llguidance.torch.fill_next_token_bitmask(matcher, bitmask, 0)
        bits = (bitmask[0].unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
        return bits.flatten()[:vocab].bool()

    def _advance(self, row: _Row, token: int) -> bool:
        """Record a sampled token; True when the row is finished (and then report it)."""
        try:
            done = self._record(row, token)
        except Exception as exc:  # e.g. its streaming callback: this request fails alone
            self._fail(row.pending, exc)
            return True
        if done:
            self._finish(row)
        return done

    def _record(self, row: _Row, token: int) -> bool:
        row.tokens.append(token)
        callback = row.pending.request.on_tokens
        if callback is not None:
            callback(row.choice_index, [token])
        params = row.params
        if token in self._eos_ids:
            row.finish_reason = "stop"
            return True
        if row.matcher is not None and not row.matcher.consume_token(token):
            row.finish_reason = "stop"  # cannot happen under the mask; stop rather than loop
            return True
        if params.stop:
            tail = decode_ids(self.tokenizer, row.tokens[-64:])
            for stop in params.stop:
                if stop in tail:
                    row.finish_reason, row.stop_string = "stop", stop
                    return True
        prompt_len = len(row.pending.request.prompt_token_ids)
        if (
            len(row.tokens) >= params.max_tokens
            or prompt_len + len(row.tokens) >= self.context_length
        ):
            row.finish_reason = "length"
            return True
        return False


class _BatchState:
    """The running batch: its rows, KV cache, attention mask, positions and next logits.

    Stepped eagerly, its cache is a growing buffer per layer (``_GrowingLayer``). Stepped by
    the compiled step (``step_compiled``), the step's fixed-width buffers hold it instead
    (copied in once, the growing layers emptied) and ``cache``, ``attention`` and
    ``positions`` are views of them. Rows leaving, and rows joining (with the batch's own,
    in one copy), are laid into new buffers of the step; an eager step takes the cache back
    into the growing layers first (``release``).
    """

    def __init__(
        self,
        rows: list[_Row],
        cache: Any,
        attention: torch.Tensor,
        positions: torch.Tensor,
        logits: torch.Tensor,
    ) -> None:
        self.rows, self.cache, self.attention, self.positions, self.logits = (
            rows,
            cache,
            attention,
            positions,
            logits,
        )
        for index, layer in enumerate(cache.layers):  # decode steps write in place from now on
            if type(layer) is DynamicLayer:  # not sliding-window or other special layers
                assert layer.keys is not None and layer.values is not None
                cache.layers[index] = _GrowingLayer(layer.keys, layer.values)
        # The compiled step holding this batch's cache now, and the cache it took it from.
        self.compiled: CompiledDecodeStep | None = None
        self._eager_cache = cache

    def step_compiled(self, step: CompiledDecodeStep, next_ids: torch.Tensor) -> None:
        """``step`` through the compiled step, which holds the batch's cache from the first
        such step on (see the class)."""
        if self.compiled is not step:
            self.release()
            step.adopt(self._eager_batch())
            for layer in self.cache.layers:
                layer.drop()
            self.compiled = step
        self.logits = step.decode(next_ids.to(self.attention.device))
        self._follow(step)

    def _eager_batch(self) -> BatchKV:
        """This batch's rows from its growing layers, as the compiled step adopts them."""
        layers = self.cache.layers
        if not all(isinstance(layer, _GrowingLayer) for layer in layers):
            raise EngineError("the compiled decode step needs a plain per-token cache")
        return BatchKV([layer.kv() for layer in layers], self.attention, self.positions)

    def _follow(self, step: CompiledDecodeStep) -> None:
        self.cache, self.attention, self.positions = (
            step.cache,
            step.attention,
            step.last_positions(),
        )

    def release(self) -> None:
        """Take the cache back from the compiled step into the growing layers."""
        step = self.compiled
        if step is None:
            return
        for layer, (keys, values) in zip(self._eager_cache.layers, step.kv(), strict=True):
            layer.adopt(keys, values)
        self.cache, self.attention = self._eager_cache, step.attention.long()
        self.positions = step.last_positions()
        self.compiled = None

    def select(self, keep: list[int]) -> None:
        """Drop finished rows from the batch and from its cache."""
        if len(keep) == len(self.rows):
            return
        index = torch.tensor(keep, dtype=torch.long, device=self.attention.device)
        step = self.compiled
        if step is not None:  # the rows kept, into the step's buffers again
            self.rows = [self.rows[j] for j in keep]
            if not keep:  # the batch ends here, or new rows replace it
                self.compiled = None
                self.attention, self.positions = self.attention[:0], self.positions[:0]
                return
            kv = [(k.index_select(0, index), v.index_select(0, index)) for k, v in step.kv()]
            step.adopt(BatchKV(kv, step.attention.index_select(0, index), self.positions[index]))
            self._follow(step)
            return
        if keep:
            self.cache.batch_select_indices(index)
        self.rows = [self.rows[j] for j in keep]
        self.attention, self.positions = self.attention[index], self.positions[index]
        if keep:
            self._trim()

    def _trim(self) -> None:
        """Drop the leading columns no row attends to any more (the padding left by rows
        that finished). A batch that lives on while rows come and go, as under a queue of
        rollouts, would otherwise attend over (and copy) a cache that only ever widens: one
        column per decode step since the batch began. Positions are per row, so they hold."""
        first = int(self.attention.any(dim=0).int().argmax())  # first column in use
        if first == 0:
            return
        self.attention = self.attention[:, first:]
        for layer in self.cache.layers:
            if isinstance(layer, _GrowingLayer):
                keys, values = layer.kv()
                layer.adopt(keys[:, :, first:, :], values[:, :, first:, :])
            else:
                layer.keys = layer.keys[:, :, first:, :]
                layer.values = layer.values[:, :, first:, :]

    def step(self, model: Any, next_ids: torch.Tensor, cache_keyword: str) -> None:
        """Feed each row its sampled token; compute the next logits."""
        self.release()
        self.attention = torch.cat(
            [self.attention, self.attention.new_ones((len(self.rows), 1))], dim=1
        )
        self.positions = self.positions + 1
        out = model(
            input_ids=next_ids.unsqueeze(1).to(self.attention.device),
            attention_mask=self.attention,
            position_ids=self.positions.unsqueeze(1),
            use_cache=True,
            **{cache_keyword: self.cache},
        )
        self.logits = out.logits[:, -1, :].float()

    def merge(self, other: _BatchState) -> _BatchState:
        """Join newly prefilled rows: left-pad the shorter cache so both end at one column."""
        other.release()
        step = self.compiled
        if step is not None:  # both batches' rows laid into the step's new buffers at once
            step.adopt(step.batch(), other._eager_batch())
            self._follow(step)
            self.rows = self.rows + other.rows
            self.logits = torch.cat([self.logits, other.logits], dim=0)
            return self
        width = max(self.attention.shape[1], other.attention.shape[1])
        for state in (self, other):
            pad = width - state.attention.shape[1]
            if pad:
                state.attention = torch.nn.functional.pad(state.attention, (pad, 0))
                for layer in state.cache.layers:
                    if not isinstance(layer, _GrowingLayer):
                        layer.keys = torch.nn.functional.pad(layer.keys, (0, 0, pad, 0))
                        layer.values = torch.nn.functional.pad(layer.values, (0, 0, pad, 0))
        for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True):
            if isinstance(mine, _GrowingLayer):  # so is theirs: the same model's layer
                (my_keys, my_values), (their_keys, their_values) = mine.kv(), theirs.kv()
                mine.adopt(
                    _joined(my_keys, their_keys, width), _joined(my_values, their_values, width)
                )
            else:
                mine.keys = torch.cat([mine.keys, theirs.keys], dim=0)
                mine.values = torch.cat([mine.values, theirs.values], dim=0)
        self.rows = self.rows + other.rows
        self.attention = torch.cat([self.attention, other.attention], dim=0)
        self.positions = torch.cat([self.positions, other.positions], dim=0)
        self.logits = torch.cat([self.logits, other.logits], dim=0)
        return self


def _joined(mine: torch.Tensor, theirs: torch.Tensor, width: int) -> torch.Tensor:
    """Two batches' keys (or values) as one, each left-padded to ``width`` columns."""
    out = mine.new_zeros((mine.shape[0] + theirs.shape[0], mine.shape[1], width, mine.shape[3]))
    out[: mine.shape[0], :, width - mine.shape[2] :] = mine
    out[mine.shape[0] :, :, width - theirs.shape[2] :] = theirs
    return out


class _GrowingLayer(DynamicLayer):
    """A layer's keys and values in buffers with room to grow: a decode step writes its
    column in place. ``DynamicLayer`` concatenates, which copies (and allocates) the whole
    cache at every step: with 16 rows of 3k-token agent prompts on CPU, that copy and the
    batch's row selections were two thirds of a decode step, the model a fifth."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.adopt(keys, values)

    def adopt(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Hold ``keys`` and ``values`` (copied) with a quarter more room, at least 64."""
        length = keys.shape[-2]
        room = length + max(64, length // 4)
        self._keys = keys.new_empty((*keys.shape[:-2], room, keys.shape[-1]))
        self._values = values.new_empty((*values.shape[:-2], room, values.shape[-1]))
        self._keys[..., :length, :] = keys
        self._values[..., :length, :] = values
        self.length = length
        self.device = keys.device
        self.is_initialized = True
        self._view()

    def kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values held (views of the buffers)."""
        return self._view()

    def drop(self) -> None:
        """Hold nothing (another holder took the keys and values: ``adopt`` them back)."""
        self._keys = self._keys.new_empty((0, 0, 0, 0))
        self._values = self._values.new_empty((0, 0, 0, 0))
        self.length = 0
        self._view()

    def _view(self) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self._keys[..., : self.length, :], self._values[..., : self.length, :]
        self.keys, self.values = keys, values
        return keys, values

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        new = key_states.shape[-2]
        if self.length + new > self._keys.shape[-2]:
            # Grows by a quarter: amortised O(1) a step.
            self.adopt(self._keys[..., : self.length, :], self._values[..., : self.length, :])
        self._keys[..., self.length : self.length + new, :] = key_states
        self._values[..., self.length : self.length + new, :] = value_states
        self.length += new
        return self._view()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._keys, self._values = self._keys[indices], self._values[indices]
        self._view()


def cache_keyword(model: Any) -> str:
    """The keyword a model's ``forward`` takes its KV cache by: ``cache`` since transformers
    5.2x (``past_key_values`` still works there, deprecated, and goes in 5.40), else
    ``past_key_values``.

    Example:
        >>> from transformers import AutoModelForCausalLM
        >>> from art_core.embedded import resolve_base_model
        >>> cache_keyword(AutoModelForCausalLM.from_pretrained(resolve_base_model("tiny-random")))
        'cache'
    """
    parameters = inspect.signature(type(model).forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def _resolve_all(finished: list[tuple[_Pending, _Outcome]]) -> None:
    """Hand several requests their outcomes, one wake-up per event loop for all of them.

    Each ``call_soon_threadsafe`` writes to the loop's self-pipe, a system call that lets go
    of the interpreter lock: the loop's thread takes it and answers that request over HTTP
    while the engine's thread waits to take it back for the next row. With 32 rows ending
    at one step that was 32 hand-overs; the gateway's share of the step is the same either
    way, the waits are not.

    Example:
        >>> loop = asyncio.new_event_loop()
        >>> futures = [loop.create_future() for _ in range(2)]
        >>> request = GenerationRequest([1], SamplingParams())
        >>> _resolve_all([(_Pending(request, f, loop), []) for f in futures])
        >>> loop.run_until_complete(asyncio.gather(*futures))
        [[], []]
        >>> loop.close()
    """
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Pending, _Outcome]]] = {}
    for pending, outcome in finished:
        by_loop.setdefault(pending.loop, []).append((pending, outcome))
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    for loop, outcomes in by_loop.items():
        if loop is running:
            _deliver(outcomes)
        else:
            loop.call_soon_threadsafe(_deliver, outcomes)


def _deliver(outcomes: list[tuple[_Pending, _Outcome]]) -> None:
    """Set each request's future to its outcome (on its loop), unless it is done already."""
    for pending, outcome in outcomes:
        if pending.future.done():
            continue
        if isinstance(outcome, BaseException):
            pending.future.set_exception(outcome)
        else:
            pending.future.set_result(outcome)


def _resolve(pending: _Pending, outcome: _Outcome) -> None:
    """Hand a result to the request's event loop from the worker thread (or the loop itself)."""
    _resolve_all([(pending, outcome)])


def _settle(
    future: Future[Any], *, result: Any = None, exception: BaseException | None = None
) -> None:
    """Set an op's outcome unless its caller cancelled it meanwhile (a cancelled future
    refuses a result: that must never fail the batch the op ran in)."""
    try:
        if exception is not None:
            future.set_exception(exception)
        else:
            future.set_result(result)
    except InvalidStateError:
        pass
