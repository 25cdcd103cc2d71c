"""A decode step compiled over a fixed-width KV cache, with the same step run eagerly as the
fallback and the reference.

A CPU decode step of a small model is bound by reading its weights (SmolLM2-135M, bf16, 1
row: the 211 pre-packed linears are ~70% of an eager step) plus a long tail of small
operators (norms, rotary embeddings, cache writes, masks). ``torch.compile`` (inductor) fuses
that tail into a few generated C++ loops; the linears stay oneDNN calls. What it needs is a
step whose shapes do not change as the sequence grows:

- **The cache.** ``FixedWidthLayer`` keeps each layer's keys and values in buffers
  ``[rows, kv_heads, width, head_dim]`` allocated once, and one 0-dim ``length`` tensor shared
  by every layer: the column the next token is written to (all rows at once; rows are
  left-padded, as in ``TransformersEngine``'s running batch, and each row keeps its own
  position ids). Attention reads the whole width under a ``[rows, width]`` boolean mask of the
  columns each row attends to, so growing the length changes no shape and never recompiles.
- **Buckets.** ``width`` is ``min_width`` (128) times a power of two, and ``rows`` a power
  of two (padding rows are fed a pad token and thrown away): one compilation per (rows,
  width) bucket, a few per context length, and attention over at most twice the columns in
  use. A sequence that reaches the width moves to the next bucket (its cache copied once, a
  compilation if that bucket is new). Attention over unused columns is not free: SmolLM2-135M
  at 8 rows decoded 17 ms a step in 128 columns and 19 ms in 256 (prompts of ~15 tokens).
  Dynamo keeps at most ``recompile_limit`` graphs of one function per process; the step's
  calls run with it set to ``max_compiles`` (32). With ``dynamic=True`` one graph serves
  every batch of two rows or more, its rows taken as they are, not padded, and its width
  the next multiple of ``min_width`` rather than of a power of two (rows and width
  symbolic, duck sizing off so that no number of rows is tied to a model size it happened to
  equal when traced; a row of one is a graph of its own: dynamo specializes sizes of 1):
  SmolLM2-135M on 2 cores, ~58 s to compile it once
  against ~26 s for each static bucket, and each step ~5% slower (2 / 4 / 8 / 16 rows at 128
  columns: 10.6 / 11.0 / 13.3 / 17.7 ms, static 9.9 / 10.4 / 12.7 / 17.0).
- **The linears.** ``packed.base_linear`` routes a pre-packed bf16 weight through the custom
  op ``art_core::packed_linear`` while dynamo traces (inductor cannot lower
  ``mkldnn._linear_pointwise`` on a packed weight that is a graph input), so the compiled
  graph calls oneDNN on the packed weight as an extern kernel; eager calls stay direct. An
  attention's q/k/v and an MLP's gate/up are one packed matrix each
  (``packed.MergedLinears``): 121 oneDNN calls a step instead of 211.
- **No guards per call.** Dynamo checks a compiled function's guards before every call:
  every parameter, packed weight and cache buffer (~0.7-1.6 ms a step here). After a
  bucket's first call the step runs dynamo's code for it directly (``_guarded_code``, as
  vLLM's ``TorchCompileWrapperWithCustomDispatcher`` does), keyed on the bucket and on the
  model's linears (their forwards and packed weights, by identity) and training flag:
  when any of those change, the next call goes through dynamo again.
- **Attention.** ``decode_attention``, registered with transformers' ``AttentionInterface``
  and set on the model's config for the span of each decode call only: transformers' eager
  formula with the query heads of a grouped key/value head packed together. Under dynamo,
  transformers' SDPA path repeats the keys and values for every head instead, which made the
  first compiled step 3x slower than eager at 8 rows (see ``decode_attention``).
- **Prefill is eager** (the model's own forward over a ``DynamicCache``, left-padded), then
  copied into the fixed-width buffers; only the one-token decode step is compiled.

Measured (``bash run.sh bench compiled_decode``, AMD EPYC with AVX-512 BF16, 2 cores, bf16):
9.3-9.9 ms a step at 1 row against 13.3 for the engine's eager step and 23.3-23.7 for
``model.generate`` (2.4-2.5x); 11.9-12.9 at 8 rows against 16.2-16.5 and 24.8-29.3
(1.9-2.5x). Before the merged siblings and the unguarded calls: 12.9 and 16.6-17.4 ms.

``eager=True`` runs the very same step function uncompiled: the fallback and the reference
the tests hold the compiled step to (fp32 on tiny-random: the same greedy tokens, logits
within 1e-4 of ``model.generate``'s, ``tests/test_compiled_step.py``). A compiled step that
dynamo or inductor cannot compile (a graph break, a backend failure, more graphs than
``max_compiles``) logs a warning, says why in ``fallback`` and runs eagerly from
then on.

**The compile cache.** Inductor's generated code and its FX/AOT graph caches go to
``compile_cache_dir()``: ``$ART_CORE_CACHE_DIR/inductor``, else
``$XDG_CACHE_HOME/art_core/inductor`` (default ``~/.cache/art_core/inductor``), or the
``cache_dir`` given. Inductor reads one location per process, ``$TORCHINDUCTOR_CACHE_DIR``,
which building a compiled step sets. It is bounded: when a step is built, the oldest files
(by modification time) go until the folder holds at most ``max_cache_mib`` (default 1024 MiB,
``$ART_CORE_INDUCTOR_CACHE_MIB``). A bucket's first call pays the compilation (SmolLM2-135M
on 2 cores: ~28 s with an empty cache); a later process finds the graph in the cache and
pays dynamo's trace and the cache's load (~5 s; ``benchmarks/compiled_decode.py`` measures
both). The test suite compiles: ``tests/test_compiled_step.py`` (marked ``slow``) compiles
tiny-random, into a cache folder its run's tests share (``shared_cache_home``).

**LoRA adapters.** Nothing is frozen into the graph (no ``inductor.config.freezing``): base
weights, packed weights and adapter factors are graph inputs, read at every call. A new forward
on a linear fails dynamo's guards and is traced again (inductor's graph cache may still hit);
past ``max_compiles`` graphs a step runs eagerly. So adapters are served through factor
buffers that outlive them (``lora.AdapterSlot``, what ``lora.LoraServer`` applies and
``use_adapter`` installs here): the next adapter of the same targets and ranks (the next
checkpoint of a training run) is copied into them and served by the graph already compiled,
called directly; the base model and back cost one guarded call each, the first adapter (new
forwards) a compile. Rows of several adapters in one batch (the engine's running batch while
a new checkpoint arrives) would need a stack of factors per layer and a row-to-adapter index:
not built; the engine decodes those steps eagerly.

**In the engine.** ``TransformersEngine(compile_decode=True)`` builds one step with
``dynamic=True`` at load, compiles its two graphs (a row of one, several rows) and holds them
to the eager step on a probe (``warm_up``). Its running batch is prefilled eagerly as before;
the first compiled step copies the batch's cache in (``adopt``), later steps write their
column in place, rows that finish are dropped by laying the others into new buffers
(``adopt``; the leading columns no row attends to go with them), rows joining are laid into
new buffers together with the batch's (``adopt`` of both, one copy, as the eager engine's
join), and an eager step takes the cache back into the engine's growing layers first. The
engine's prefix cache reads the batch's KV from the step's views (``cache``, ``attention``).
"""

from __future__ import annotations

import logging
import os
import time
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from art_core.engines.lora import AdapterSlot
from art_core.engines.packed import register_packed_linear_op, restore_forward
from art_core.files import cache_dir as art_core_cache_dir

logger = logging.getLogger(__name__)

MIN_WIDTH = 128
MAX_COMPILES = 32
DEFAULT_CACHE_MIB = 1024


def compile_cache_dir() -> Path:
    """Where compiled steps are cached: ``$ART_CORE_CACHE_DIR/inductor``, else
    ``$XDG_CACHE_HOME/art_core/inductor`` (``~/.cache/art_core/inductor``).

    Example:
        >>> compile_cache_dir().name
        'inductor'
    """
    return art_core_cache_dir() / "inductor"


def prune_cache(folder: Path, max_mib: float) -> int:
    """Delete the oldest files of ``folder`` (by modification time) until it holds at most
    ``max_mib`` MiB; returns how many bytes went. Files that vanish meanwhile are skipped.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     _ = (Path(d) / "a").write_bytes(b"x" * 2048)
        ...     prune_cache(Path(d), 1 / 1024)
        2048
    """
    files = []
    for path in folder.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink():
                stat = path.stat()
                files.append((stat.st_mtime, stat.st_size, path))
        except OSError:
            continue
    total = sum(size for _, size, _ in files)
    budget = int(max_mib * 2**20)
    freed = 0
    for _, size, path in sorted(files):
        if total - freed <= budget:
            break
        try:
            path.unlink()
            freed += size
        except OSError:
            continue
    return freed


def use_compile_cache(cache_dir: Path | None = None, max_mib: float | None = None) -> Path:
    """Point inductor's caches at ``cache_dir`` (default ``compile_cache_dir()``) for this
    process, pruned to ``max_mib`` (default ``$ART_CORE_INDUCTOR_CACHE_MIB`` or 1024)."""
    folder = Path(cache_dir) if cache_dir is not None else compile_cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    if max_mib is None:
        max_mib = float(os.environ.get("ART_CORE_INDUCTOR_CACHE_MIB", DEFAULT_CACHE_MIB))
    freed = prune_cache(folder, max_mib)
    if freed:
        logger.info("pruned %.0f MiB of compiled steps from %s", freed / 2**20, folder)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder.resolve())
    return folder


@dataclass(frozen=True)
class BatchKV:
    """Rows of a batch, as ``CompiledDecodeStep.adopt`` takes them: each layer's keys and
    values ``[rows, kv_heads, columns, head_dim]``, the columns each row attends to
    (``[rows, columns]``, nonzero: attended; every row's newest token in the last column)
    and each row's last position (``[rows]``: its next token is fed at the one after)."""

    layers: Sequence[tuple[torch.Tensor, torch.Tensor]]
    attention: torch.Tensor
    last_positions: torch.Tensor


def rows_bucket(rows: int) -> int:
    """The power of two a batch of ``rows`` is padded to.

    Example:
        >>> [rows_bucket(n) for n in (1, 2, 3, 8, 9)]
        [1, 2, 4, 8, 16]
    """
    return 1 << max(0, rows - 1).bit_length()


def width_bucket(columns: int, smallest: int = MIN_WIDTH) -> int:
    """The cache width that holds ``columns``: ``smallest`` times a power of two.

    Example:
        >>> width_bucket(1), width_bucket(128), width_bucket(129), width_bucket(600)
        (128, 128, 256, 1024)
    """
    width = smallest
    while width < columns:
        width *= 2
    return width


def _fixed_width_layer_class() -> type:
    """``FixedWidthLayer``, built on first use (transformers is imported lazily)."""
    from transformers.cache_utils import StaticLayer

    class FixedWidthLayer(StaticLayer):
        """One layer's keys and values in preallocated ``[rows, kv_heads, width, head_dim]``
        buffers; ``length`` (0-dim, shared by all layers) is the column the next token
        is written to. Attention reads every column, under the step's mask."""

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: torch.Tensor):
            super().__init__(max_cache_len=keys.shape[2])
            self.fixed_keys, self.fixed_values = keys, values
            self.keys, self.values, self.cumulative_length = keys, values, length
            self.device = keys.device
            self.batch_size, self.num_heads = keys.shape[:2]
            self.k_head_dim, self.v_head_dim = keys.shape[-1], values.shape[-1]
            self.is_initialized = True

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
        ) -> tuple[torch.Tensor, torch.Tensor]:
            column = self.cumulative_length.view(1)  # one new token per row, one column
            self.fixed_keys.index_copy_(2, column, key_states)
            self.fixed_values.index_copy_(2, column, value_states)
            return self.fixed_keys, self.fixed_values

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self.max_cache_len, 0

        def widen(self, width: int) -> None:
            """Copy the buffers into wider ones (the columns past the old width empty)."""
            wider = []
            for old in (self.fixed_keys, self.fixed_values):
                new = old.new_zeros((*old.shape[:2], width, old.shape[3]))
                new[:, :, : old.shape[2]] = old
                wider.append(new)
            self.fixed_keys, self.fixed_values = wider
            self.keys, self.values = wider
            self.max_cache_len = width

    return FixedWidthLayer


class CompiledDecodeStep:
    """The forward passes of decoding one batch: ``prefill`` (eager) into a fixed-width
    cache, then ``decode`` one token per row per call, compiled (or eager with
    ``eager=True``); both return each row's next-token logits in fp32.

    ``model`` is a loaded Hugging Face causal LM with a plain per-token KV cache (no sliding
    windows); its linears may be pre-packed (``packed.pack_linears``). A compiled step sets
    inductor's cache folder for the process (``use_compile_cache``) when built, and records
    each bucket's first call in ``compile_seconds`` (dynamo and inductor, or a cache hit).
    ``dynamic=True`` compiles one graph for every bucket of two rows or more (see Buckets
    above), at a few percent of each step.

    Example:
        >>> step = CompiledDecodeStep(model, pad_id=0)  # too slow for a docstring: inductor compiles the step (tens of seconds)  # doctest: +SKIP
        >>> logits = step.prefill([[5, 6, 7], [8, 9]])  # too slow for a docstring  # doctest: +SKIP
        >>> logits = step.decode(logits.argmax(-1))  # too slow for a docstring  # doctest: +SKIP
    """

    def __init__(
        self,
        model: Any,
        *,
        pad_id: int = 0,
        eager: bool = False,
        min_width: int = MIN_WIDTH,
        max_compiles: int = MAX_COMPILES,
        cache_dir: Path | None = None,
        max_cache_mib: float | None = None,
        dynamic: bool = False,
    ) -> None:
        from transformers import AttentionInterface

        self.model, self.pad_id, self.eager, self.dynamic = model, pad_id, eager, dynamic
        self.min_width, self.max_compiles = min_width, max_compiles
        self.compile_seconds: dict[tuple[int, int], float] = {}
        self.cache_dir: Path | None = None
        self.rows = 0  # rows of the batch (the cache holds rows_bucket(rows))
        self.length = 0  # columns in use: the next token's column
        register_packed_linear_op()
        AttentionInterface.register(ATTENTION, decode_attention)
        self._keyword = _cache_keyword(model)
        unsupported = fixed_width_unsupported(model)
        if unsupported is not None:
            raise ValueError(unsupported)
        self._layers = len(_model_cache_layers(model))
        self._layer_class = _fixed_width_layer_class()
        self._step: Callable[..., torch.Tensor] = _decode_step
        if not eager:
            self.cache_dir = use_compile_cache(cache_dir, max_cache_mib)
            self._step = torch.compile(_decode_step, fullgraph=True, dynamic=dynamic)
        self._cache: Any = None
        self._linear_attributes = [
            m.__dict__ for m in model.modules() if isinstance(m, torch.nn.Linear)
        ]
        # Per bucket, dynamo's code for the step, valid while the model is in ``_state``.
        self._state: tuple[Any, ...] = ()
        self._direct: dict[tuple[int, int], Callable[..., torch.Tensor] | None] = {}
        # Per adapted linear (module path): its LoRA factor buffers and the forward reading
        # them, kept across adapters (``use_adapter``); and the paths served now.
        self._adapter_slots: dict[str, AdapterSlot] = {}
        self._adapted: set[str] = set()
        # Why the compiled step gave way to the eager one (None while it has not).
        self.fallback: str | None = None

    @property
    def width(self) -> int:
        """Columns the cache holds (``min_width`` times a power of two)."""
        return int(self._mask.shape[1]) if self._cache is not None else 0

    @property
    def unguarded_buckets(self) -> set[tuple[int, int]]:
        """The (rows, width) buckets whose compiled code runs without evaluating dynamo's
        guards (see ``_guarded_code``), for the model's linears as they are now."""
        return {key for key, direct in self._direct.items() if direct is not None}

    def use_adapter(self, deltas: Mapping[str, tuple[torch.Tensor, torch.Tensor]] | None) -> None:
        """Serve a LoRA adapter from the next call on: ``deltas`` maps a linear's module path
        to ``(A.T, (scale * B).T)``, fp32, as ``lora.LoraServer`` holds them (``None``: the
        base model).

        The factors are copied into buffers the step keeps per adapted linear, and each
        adapted linear's forward (``lora.lora_forward`` over its buffers) is made once and
        kept: another adapter of the same targets and ranks, the next checkpoint of a run
        say, is served by the same compiled graph (read in place: no trace, no compile, no
        guard evaluated). New targets or ranks trace once more. Everything is checked before
        anything changes; while an adapter is in use the step owns those linears' forwards.
        """
        deltas = dict(deltas or {})
        linears: dict[str, torch.nn.Linear] = {}
        for path, (a_t, scaled_b_t) in deltas.items():
            try:
                linear = linears[path] = self.model.get_submodule(path)
            except AttributeError as exc:
                raise ValueError(f"the model has no module {path}") from exc
            if not isinstance(linear, torch.nn.Linear):
                raise ValueError(f"{path} is a {type(linear).__name__}, not nn.Linear")
            rank = a_t.shape[-1]
            expected = ((linear.in_features, rank), (rank, linear.out_features))
            if a_t.dim() != 2 or (tuple(a_t.shape), tuple(scaled_b_t.shape)) != expected:
                raise ValueError(
                    f"{path}: A.T {tuple(a_t.shape)} / (scale * B).T {tuple(scaled_b_t.shape)} "
                    f"do not fit its weight ({linear.out_features}, {linear.in_features})"
                )
        for path in self._adapted - deltas.keys():
            restore_forward(self.model.get_submodule(path))
        for path, (a_t, scaled_b_t) in deltas.items():
            slot = self._adapter_slots.get(path)
            if slot is None:
                slot = self._adapter_slots[path] = AdapterSlot(linears[path])
            linears[path].forward = slot.hold(a_t, scaled_b_t)  # type: ignore[method-assign]
        self._adapted = set(deltas)

    @torch.inference_mode()
    def prefill(self, prompts: Sequence[Sequence[int]]) -> torch.Tensor:
        """Run the prompts (left-padded, eagerly), keep their KV in a fixed-width cache;
        returns ``[len(prompts), vocab]`` next-token logits (fp32)."""
        from transformers import DynamicCache

        if not prompts or any(not p for p in prompts):
            raise ValueError("prefill needs at least one prompt, none of them empty")
        device = self.model.device
        rows, longest = len(prompts), max(len(p) for p in prompts)
        ids = torch.full((rows, longest), self.pad_id, dtype=torch.long)
        attention = torch.zeros((rows, longest), dtype=torch.long)
        positions = torch.zeros((rows, longest), dtype=torch.long)
        for i, prompt in enumerate(prompts):
            ids[i, longest - len(prompt) :] = torch.tensor(list(prompt))
            attention[i, longest - len(prompt) :] = 1
            positions[i, longest - len(prompt) :] = torch.arange(len(prompt))
        cache = DynamicCache(config=self.model.config)
        out = self.model(
            input_ids=ids.to(device),
            attention_mask=attention.to(device),
            position_ids=positions.to(device),
            use_cache=True,
            logits_to_keep=1,
            **{self._keyword: cache},
        )
        prefilled: list[Any] = cache.layers  # DynamicLayers: fixed_width_unsupported, at init
        last = torch.tensor([len(p) - 1 for p in prompts], dtype=torch.long)
        self.adopt(BatchKV([(layer.keys, layer.values) for layer in prefilled], attention, last))
        return out.logits[:, -1, :].float()

    @torch.inference_mode()
    def adopt(self, *parts: BatchKV) -> None:
        """Take over a batch computed elsewhere (the engine's prefill, its running batch
        after rows left, or that batch and rows joining it): the rows of ``parts``, in order,
        each part's newest tokens in its last column, are copied into new fixed-width buffers
        of their bucket, right-aligned so that every row's next token goes to one column (the
        columns no row attends to, on the left, dropped). The parts' tensors are not kept.
        """
        if not parts:
            raise ValueError("adopt needs the rows of at least one batch")
        # Per part: its rows, its columns attended, the first column it uses, the columns kept.
        shapes = []
        for part in parts:
            if part.attention.dim() != 2 or part.attention.shape[0] == 0:
                raise ValueError("adopt needs an attention mask [rows, columns] of 1+ rows")
            if len(part.layers) != self._layers:
                raise ValueError(
                    f"adopt got {len(part.layers)} layers; the model has {self._layers}"
                )
            rows, columns = part.attention.shape
            for keys, values in part.layers:
                if (keys.shape[0], keys.shape[2]) != (rows, columns) or (
                    values.shape[:3] != keys.shape[:3]
                ):
                    raise ValueError(
                        f"keys {tuple(keys.shape)} / values {tuple(values.shape)} do not "
                        f"match the attention's {rows} rows x {columns} columns"
                    )
            used = part.attention.bool()
            first = int(used.any(dim=0).int().argmax()) if columns else 0
            shapes.append((rows, used, first, columns - first))
        rows = sum(shape[0] for shape in shapes)
        kept = max(shape[3] for shape in shapes)
        # A dynamic graph takes any number of rows (two or more) as it is: no padding rows.
        bucket = rows if self.dynamic and rows >= 2 else rows_bucket(rows)
        width = self._width_for(kept + 1)
        device = parts[0].layers[0][0].device
        self._length = torch.tensor(kept, dtype=torch.long, device=device)
        fixed_layers = []
        for index, (keys, values) in enumerate(parts[0].layers):
            fixed_keys = keys.new_zeros((bucket, keys.shape[1], width, keys.shape[3]))
            fixed_values = values.new_zeros((bucket, values.shape[1], width, values.shape[3]))
            row = 0
            for part, (count, _, first, own) in zip(parts, shapes, strict=True):
                part_keys, part_values = part.layers[index]
                fixed_keys[row : row + count, :, kept - own : kept] = part_keys[:, :, first:]
                fixed_values[row : row + count, :, kept - own : kept] = part_values[:, :, first:]
                row += count
            fixed_layers.append(self._layer_class(fixed_keys, fixed_values, self._length))
        self._cache = _fixed_width_cache(fixed_layers)
        # Which columns each row attends to; padding rows get only the columns of new tokens.
        self._mask = torch.zeros((bucket, width), dtype=torch.bool, device=device)
        self._positions = torch.zeros((bucket, 1), dtype=torch.long, device=device)
        row = 0
        for part, (count, used, first, own) in zip(parts, shapes, strict=True):
            self._mask[row : row + count, kept - own : kept] = used[:, first:]
            self._positions[row : row + count, 0] = part.last_positions.to(device) + 1
            row += count
        self._ids = torch.full((bucket, 1), self.pad_id, dtype=torch.long, device=device)
        self.rows, self.length = rows, kept

    def batch(self) -> BatchKV:
        """The batch held now, as ``adopt`` takes it (views of the buffers: the next call
        writes into them)."""
        return BatchKV(self.kv(), self.attention, self.last_positions())

    @property
    def cache(self) -> Any:
        """The fixed-width cache (its layers' ``keys`` and ``values`` are whole buffers,
        ``[rows_bucket, kv_heads, width, head_dim]``: rows past ``rows`` and columns past
        ``length`` are padding)."""
        return self._cache

    @property
    def attention(self) -> torch.Tensor:
        """``[rows, length]``: the columns each row attends to (a view: the next call
        changes it)."""
        return self._mask[: self.rows, : self.length]

    def last_positions(self) -> torch.Tensor:
        """``[rows]``: each row's position of the last token it was fed."""
        return self._positions[: self.rows, 0] - 1

    def kv(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's keys and values in use, ``[rows, kv_heads, length, head_dim]``
        (views of the buffers: the next call writes into them)."""
        return [
            (
                layer.fixed_keys[: self.rows, :, : self.length],
                layer.fixed_values[: self.rows, :, : self.length],
            )
            for layer in self._cache.layers
        ]

    @torch.inference_mode()
    def decode(self, next_ids: torch.Tensor) -> torch.Tensor:
        """Feed each row its next token (``[rows]``); returns ``[rows, vocab]`` logits (fp32)."""
        if self._cache is None:
            raise RuntimeError("decode before prefill")
        if self.length >= self.width:
            self._widen()
        self._ids[: self.rows, 0] = next_ids
        config = self.model.config
        served = config._attn_implementation
        config._attn_implementation = ATTENTION  # this step's attention, for this call only
        key = (int(self._ids.shape[0]), self.width)
        started = time.perf_counter()
        try:
            logits = self._run()
        finally:
            config._attn_implementation = served
        if key not in self.compile_seconds:
            self.compile_seconds[key] = time.perf_counter() - started
        self.length += 1
        return logits[: self.rows]

    def _run(self) -> torch.Tensor:
        args = (
            self.model,
            self._keyword,
            self._cache,
            self._ids,
            self._positions,
            self._mask,
            self._length,
        )
        if self._step is _decode_step:
            return _decode_step(*args)
        # A bucket met before, the model's linears as they were: dynamo's code for it, called
        # without evaluating its guards again (see ``_guarded_code``).
        state = self._model_state()
        if not _same_objects(state, self._state):
            self._state, self._direct = state, {}
        key = (int(self._ids.shape[0]), self.width)
        direct = self._direct.get(key)
        if direct is not None:
            return direct(*args)
        try:
            # No duck sizing: a batch whose rows equal the model's key/value heads (2 and 2,
            # say) would otherwise tie the two sizes together in the graph, and the next
            # number of rows would need a graph of its own.
            with (
                torch._dynamo.config.patch(recompile_limit=self.max_compiles),
                torch.fx.experimental._config.patch(use_duck_shape=False),  # type: ignore[attr-defined]
            ):
                logits = self._step(*args)
        except _compile_errors() as exc:
            # Raised while tracing or compiling, before the graph ran: nothing was written.
            logger.warning("compiled decode step unavailable, running it eagerly: %s", exc)
            self.fallback = f"{type(exc).__name__}: {exc}"[:500]
            self._step = _decode_step
            return _decode_step(*args)
        if key not in self._direct:
            self._direct[key] = _guarded_code(args)
        return logits

    def _model_state(self) -> tuple[Any, ...]:
        """What dynamo's guards on the model can see change between two steps of one bucket:
        each linear's own forward (an adapter's, or the packed one) and packed weight, and
        whether the model is in training mode."""
        state: list[Any] = [self.model.training]
        for attributes in self._linear_attributes:
            state.append(attributes.get("forward"))
            state.append(attributes.get("_art_packed"))
        return tuple(state)

    def _width_for(self, columns: int) -> int:
        """The width of a cache that holds ``columns``: for a dynamic graph, which takes any
        width, the next multiple of ``min_width`` (attention reads every column, so fewer
        unused ones are faster; widening copies the cache once per ``min_width`` steps);
        else ``min_width`` times a power of two (each width is a graph)."""
        if self.dynamic:
            return -(-columns // self.min_width) * self.min_width
        return width_bucket(columns, self.min_width)

    def _widen(self) -> None:
        """Move the cache to the next width bucket (a compilation if that bucket is new)."""
        width = self._width_for(self.width + 1)
        for layer in self._cache.layers:
            layer.widen(width)
        mask = self._mask.new_zeros((self._mask.shape[0], width))
        mask[:, : self._mask.shape[1]] = self._mask
        self._mask = mask


def warm_up(step: CompiledDecodeStep, *, token_id: int = 1, steps: int = 2) -> str | None:
    """Compile ``step`` for a batch of one row and one of several (the graphs a running
    batch needs: with ``dynamic=True`` these two serve every bucket) and hold each to the
    same step run eagerly on the same probe prompts; returns why the compiled step must not
    serve (it failed to compile, or its logits differ from the eager step's by more than
    the model dtype's tolerance), None when it may.

    The tolerance is relative to the largest logit: 1e-3 in fp32, 5e-2 in bf16 and fp16
    (inductor fuses and orders the step's arithmetic differently; a wrong attention formula
    is off by far more).

    Example:
        >>> warm_up(CompiledDecodeStep(model))  # too slow for a docstring: compiles two graphs  # doctest: +SKIP
    """
    reference = CompiledDecodeStep(
        step.model, pad_id=step.pad_id, eager=True, min_width=step.min_width
    )
    low_precision = next(step.model.parameters()).dtype in (torch.bfloat16, torch.float16)
    tolerance = 5e-2 if low_precision else 1e-3
    for prompts in ([[token_id] * 3], [[token_id] * 3, [token_id] * 5]):
        ours, theirs = step.prefill(prompts), reference.prefill(prompts)
        for _ in range(steps):
            next_ids = theirs.argmax(-1)
            ours, theirs = step.decode(next_ids), reference.decode(next_ids)
            if step.fallback is not None:
                return f"the step did not compile: {step.fallback}"
            scale = float(theirs.abs().max().clamp_min(1e-6))
            error = float((ours - theirs).abs().max()) / scale
            if not error <= tolerance:  # a NaN fails too
                return (
                    f"the compiled step's logits differ from the eager step's by {error:.2g} "
                    f"of the largest (tolerance {tolerance:g})"
                )
    return None


def _decode_step(
    model: Any,
    keyword: str,
    cache: Any,
    ids: torch.Tensor,
    positions: torch.Tensor,
    mask: torch.Tensor,
    length: torch.Tensor,
) -> torch.Tensor:
    """One token per row at column ``length``: the function compiled (or run eagerly).
    Writes the cache, the mask, the positions and the length in place."""
    mask.index_fill_(1, length.view(1), True)  # every row attends to its new column
    out = model(
        input_ids=ids,
        attention_mask=mask[:, None, None, :],  # 4D: the model takes it as it is
        position_ids=positions,
        use_cache=True,
        **{keyword: cache},
    )
    positions.add_(1)
    length.add_(1)
    return out.logits[:, -1, :].float()


ATTENTION = "art_core_decode"


def decode_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention of one new token per row over the fixed-width cache, as transformers'
    eager attention computes it (scores in the model's dtype, softmax in fp32), with the
    query heads of a key/value head packed together (``[rows, kv_heads, group, dim]``)
    instead of the keys and values repeated for every head.

    transformers' SDPA attention packs them too, but not while dynamo traces: there it
    repeats the keys and values (a copy of the cache per layer), and the CPU flash kernel
    over the repeated heads costs ~9x more (SmolLM2-135M, 8 rows, 256 columns: 1.8 ms a
    layer against 0.2 ms): that made a compiled step 3x slower than the eager one at 8 rows.
    Packed, plain matmuls cost about half of the packed flash kernel here (0.11 ms).

    Example:
        >>> q, kv = torch.randn(2, 4, 1, 8), torch.randn(2, 2, 5, 8)
        >>> mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
        >>> out, _ = decode_attention(None, q, kv, kv, mask, scaling=8**-0.5)
        >>> ref = torch.nn.functional.scaled_dot_product_attention(
        ...     q, kv.repeat_interleave(2, 1), kv.repeat_interleave(2, 1))
        >>> torch.allclose(out, ref.transpose(1, 2), atol=1e-6)
        True
    """
    rows, heads, new, dim = query.shape
    kv_heads = key.shape[1]
    if scaling is None:
        scaling = dim**-0.5
    packed = query.reshape(rows, kv_heads, heads // kv_heads * new, dim)  # new == 1
    scores = torch.matmul(packed, key.transpose(-1, -2)).float() * scaling
    if attention_mask is not None:
        scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1).to(value.dtype)
    out = torch.matmul(weights, value)
    return out.reshape(rows, heads, new, value.shape[-1]).transpose(1, 2).contiguous(), None


def _guarded_code(args: tuple[Any, ...]) -> Callable[..., torch.Tensor] | None:
    """The code dynamo compiled for ``_decode_step`` whose guards pass for ``args``, as a
    function that runs it without evaluating them; None if there is none (or this torch
    does not show its cache entries).

    Evaluating a compiled function's guards costs ~0.7-1.6 ms a call for a model's step (every
    parameter, packed weight and cache buffer is checked; SmolLM2-135M: ~10% of a step on 2
    cores), and they can only fail here when a bucket's shapes or the model's linears change,
    which the caller keys the function on. vLLM dispatches to dynamo's code the same way
    (``TorchCompileWrapperWithCustomDispatcher``). Tensor values are not guarded, so checking
    after the call that compiled or chose the code is checking for the next one.
    """
    code = _decode_step.__code__
    names = code.co_varnames[: code.co_argcount]
    try:
        for entry in _cache_entries():
            if entry.guard_manager.check(dict(zip(names, args, strict=True))):
                return types.FunctionType(entry.code, _decode_step.__globals__, code.co_name)
    except (AttributeError, TypeError, RuntimeError) as exc:
        logger.info("compiled decode step: guards evaluated on every call (%s)", exc)
    return None


def _cache_entries() -> list[Any]:
    """Dynamo's cache entries for ``_decode_step`` (a private torch API: [] where it is gone)."""
    try:
        from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list
    except ImportError:
        return []
    return list(_debug_get_cache_entry_list(_decode_step.__code__))


def compiled_variants() -> int:
    """How many graphs of the decode step dynamo holds in this process (every bucket, model
    and set of linears' forwards it was traced for); 0 where this torch does not show them.

    Example:
        >>> compiled_variants() >= 0
        True
    """
    return len(_cache_entries())


def _same_objects(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def _compile_errors() -> tuple[type[BaseException], ...]:
    """What dynamo and inductor raise when a step cannot be compiled (a graph break under
    ``fullgraph``, a backend failure, more recompilations than ``recompile_limit``)."""
    from torch._dynamo import exc

    return (exc.TorchDynamoException, exc.FailOnRecompileLimitHit)


def fixed_width_unsupported(model: Any) -> str | None:
    """Why ``model`` cannot decode over a fixed-width cache (None: it can): its KV cache
    must be one plain per-token tensor pair per layer (no sliding windows, no recurrent
    state), and its attention must be the plain softmax ``decode_attention`` computes (no
    logit soft-capping, no attention sinks).

    Example:
        >>> from transformers import AutoModelForCausalLM
        >>> from art_core.embedded import resolve_base_model
        >>> fixed_width_unsupported(AutoModelForCausalLM.from_pretrained(resolve_base_model("tiny-random"))) is None
        True
    """
    from transformers.cache_utils import DynamicLayer

    name = type(model).__name__
    layers = _model_cache_layers(model)
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        return f"{name}'s KV cache is not one plain tensor pair per token and layer"
    config = model.config.get_text_config()
    for attribute in ("attn_logit_softcapping", "sliding_window", "use_sliding_window"):
        value = getattr(config, attribute, None)
        if value and not (attribute == "sliding_window" and not _uses_sliding_window(config)):
            return f"{name} sets {attribute}={value!r}, which the fixed-width attention omits"
    for module in model.modules():
        if hasattr(module, "sinks"):
            return f"{name} has attention sinks, which the fixed-width attention omits"
    return None


def _uses_sliding_window(config: Any) -> bool:
    """Whether a config that names a sliding window applies it (Qwen2 names one, off)."""
    if getattr(config, "use_sliding_window", None) is False:
        return False
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return any("sliding" in str(kind) for kind in layer_types)
    return True


def _model_cache_layers(model: Any) -> list[Any]:
    from transformers import DynamicCache

    return list(DynamicCache(config=model.config).layers)


def _fixed_width_cache(layers: list[Any]) -> Any:
    from transformers.cache_utils import Cache

    return Cache(layers=layers)


def _cache_keyword(model: Any) -> str:
    import inspect

    parameters = inspect.signature(type(model).forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"
