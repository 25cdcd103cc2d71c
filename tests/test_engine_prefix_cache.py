"""The prefix cache: the engine computes a shared prefix once and reads it back later, and what
it answers does not change (the same tokens, logprobs within float tolerance, as with the
cache off), for ``n`` choices, groups, multi-turn runs, grammars and adapter hot-swaps; the
byte bound holds; a failure leaves nothing half-written behind."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from lora_support import make_adapter

from art_core.embedded import resolve_base_model
from art_core.engines.base import GenerationRequest, GenerationResult, SamplingParams
from art_core.engines.prefix_cache import PrefixCache
from art_core.engines.transformers_engine import TransformersEngine

VOCAB = 690  # tiny-random's vocabulary is 695 ids
ON = 64 << 20
GREEDY = SamplingParams(temperature=0.0, max_tokens=10)
LONG = "start: /[a-z]{4000,}/\n"  # rules out ending early: each row runs to its max_tokens


@pytest.fixture(scope="module")
def base_path() -> Path:
    return resolve_base_model("tiny-random")


def prompt_of(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(5, VOCAB) for _ in range(length)]


@asynccontextmanager
async def engine_with(
    base_path: Path, cache_bytes: int, **options: Any
) -> AsyncIterator[TransformersEngine]:
    engine = TransformersEngine(
        base_path, dtype="float32", prefix_cache_bytes=cache_bytes, **options
    )
    await engine.start()
    try:
        yield engine
    finally:
        await engine.close()


def same_answers(on: list[list[GenerationResult]], off: list[list[GenerationResult]]) -> None:
    assert [[c.token_ids for c in r] for r in on] == [[c.token_ids for c in r] for r in off]
    for results_on, results_off in zip(on, off, strict=True):
        for a, b in zip(results_on, results_off, strict=True):
            assert a.finish_reason == b.finish_reason
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


Scenario = Callable[[TransformersEngine], Any]


async def on_and_off(base_path: Path, scenario: Scenario, **options: Any) -> tuple[Any, Any, Any]:
    """The scenario's answers with the cache on and off, and the cache-on engine's metrics."""
    async with engine_with(base_path, ON, **options) as engine:
        on = await scenario(engine)
        assert engine.prefix_cache is not None
        metrics = engine.prefix_cache.metrics()
        metrics["computed"] = engine.prefill_tokens_computed
        metrics["asked"] = engine.prefill_tokens_asked
    async with engine_with(base_path, 0, **options) as engine:
        assert engine.prefix_cache is None
        off = await scenario(engine)
    return on, off, metrics


# ----------------------------------------------------------------------------- the store
def test_keys_chain_whole_blocks_under_a_namespace() -> None:
    cache = PrefixCache(1 << 20, block_tokens=4)
    a = cache.keys("base", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert len(a) == 2  # the 9th token is no block
    assert cache.keys("base", [1, 2, 3, 4, 5, 6, 7, 8]) == a
    # A block's key names its whole prefix: the same tokens after another prefix differ.
    assert cache.keys("base", [0, 2, 3, 4, 5, 6, 7, 8])[1] != a[1]
    assert cache.keys("step-1#1", [1, 2, 3, 4, 5, 6, 7, 8]) != a  # another adapter's KV


def block(fill: float, nbytes: int = 1024) -> torch.Tensor:
    return torch.full((nbytes // 4,), fill, dtype=torch.float32)


def test_lookup_finds_the_longest_held_prefix() -> None:
    cache = PrefixCache(1 << 20, block_tokens=2)
    keys = cache.keys("base", list(range(8)))
    cache.insert("base", keys[:3], [block(i) for i in range(3)])
    found = cache.lookup(cache.keys("base", [*list(range(6)), 99, 98]))
    assert [float(t[0]) for t in found] == [0.0, 1.0, 2.0]
    assert cache.lookup(cache.keys("base", [5, 5, 5, 5])) == []


def test_the_byte_bound_holds_and_roots_outlive_their_leaves() -> None:
    cache = PrefixCache(10 * 1024, block_tokens=2)
    for seed in range(30):  # a stream of distinct prompts, 4 blocks each
        keys = cache.keys("base", [seed] * 8)
        cache.insert("base", keys, [block(seed)] * 4)
        assert cache.bytes_held <= cache.capacity_bytes
    assert cache.stats.evictions > 0 and len(cache) == 10
    # Touching a chain makes its root the last of it to go.
    shared = cache.keys("base", [7, 7, 7, 7, 1, 1, 1, 1])
    cache.insert("base", shared, [block(1)] * 4)
    cache.insert("base", cache.keys("base", [8] * 12)[:6], [block(2)] * 6)  # pushes 6 out
    assert cache.held_run(shared) == 4
    cache.insert("base", cache.keys("base", [9] * 6), [block(3)] * 3)
    held = cache.held_run(shared)
    assert held in (1, 2, 3)  # leaves went first: what is left is still found from the root
    assert cache.bytes_held == sum(1024 for _ in range(len(cache)))


def test_a_chain_larger_than_the_bound_keeps_its_root() -> None:
    cache = PrefixCache(3 * 1024, block_tokens=1)
    keys = cache.keys("base", list(range(10)))
    cache.insert("base", keys, [block(i) for i in range(10)])
    assert cache.held_run(keys) == 3 and cache.bytes_held == 3 * 1024


def test_dropping_a_namespace_frees_its_blocks() -> None:
    cache = PrefixCache(1 << 20, block_tokens=2)
    cache.insert("a#1", cache.keys("a#1", [1, 2, 3, 4]), [block(1), block(2)])
    cache.insert("base", cache.keys("base", [1, 2]), [block(3)])
    cache.drop("a#1")
    assert len(cache) == 1 and cache.bytes_held == 1024


# ----------------------------------------------------------------------------- the engine
async def test_n_choices_share_one_prefill_and_answer_as_without_the_cache(
    base_path: Path,
) -> None:
    prompt = prompt_of(0, 200)

    async def scenario(engine: TransformersEngine) -> list[list[GenerationResult]]:
        greedy = await engine.generate(
            GenerationRequest(prompt, SamplingParams(temperature=0.0, max_tokens=12, n=4))
        )
        seeded = await engine.generate(
            GenerationRequest(prompt, SamplingParams(temperature=1.0, seed=5, max_tokens=12, n=6))
        )
        return [greedy, seeded]

    on, off, metrics = await on_and_off(base_path, scenario)
    same_answers(on, off)
    # 4 + 6 rows of a 200-token prompt: computed about once (the rows' last partial block
    # each, and the second request finds the whole prompt cached).
    assert metrics["computed"] <= 1.2 * 200 + 10 * 16
    assert metrics["asked"] == 10 * 200
    assert metrics["prefix_cache/hit_rate"] > 0.8


async def test_a_group_arriving_together_and_while_its_batch_runs(base_path: Path) -> None:
    system = prompt_of(1, 150)
    tasks = [prompt_of(10 + i, 5) for i in range(3)]

    async def scenario(engine: TransformersEngine) -> list[list[GenerationResult]]:
        first = [
            engine.generate(GenerationRequest(system + task, GREEDY))
            for task in tasks
            for _ in range(2)
        ]
        # A long row keeps the batch running; later runs of the group join it mid-batch.
        long_row = asyncio.ensure_future(
            engine.generate(
                GenerationRequest(system, SamplingParams(max_tokens=40, grammar=LONG, seed=1))
            )
        )
        early = await asyncio.gather(*first)
        late = await asyncio.gather(
            *(engine.generate(GenerationRequest(system + task, GREEDY)) for task in tasks)
        )
        return [*early, *late, await long_row]

    on, off, metrics = await on_and_off(base_path, scenario, batch_window=0.02)
    same_answers(on, off)
    unique = 150 + 3 * 5
    assert metrics["computed"] < 0.5 * metrics["asked"]
    assert metrics["computed"] <= unique + 10 * 16 + 40  # partial blocks at each row's end


async def test_each_turn_of_a_multi_turn_run_prefills_only_what_is_new(base_path: Path) -> None:
    prompt = prompt_of(2, 120)
    new_per_turn: list[int] = []

    async def scenario(engine: TransformersEngine) -> list[list[GenerationResult]]:
        conversation = list(prompt)
        answers = []
        for turn in range(4):
            before = engine.prefill_tokens_computed
            params = SamplingParams(temperature=0.8, seed=turn, max_tokens=20)
            [answer] = await engine.generate(GenerationRequest(list(conversation), params))
            answers.append([answer])
            if engine.prefix_cache is not None:
                new_per_turn.append(engine.prefill_tokens_computed - before)
            # The next turn: all that was said, and a tool's result.
            conversation += answer.token_ids + prompt_of(100 + turn, 30)
        return answers

    on, off, _ = await on_and_off(base_path, scenario)
    same_answers(on, off)
    assert new_per_turn[0] == 120
    for computed in new_per_turn[1:]:
        assert computed <= 20 + 30 + 16  # the answer, the tool result, a partial block


async def test_grammar_constrained_rows_answer_as_without_the_cache(base_path: Path) -> None:
    prompt = prompt_of(3, 100)
    grammar = 'start: "yes" | "no" | /[0-9]{2,6}/\n'

    async def scenario(engine: TransformersEngine) -> list[list[GenerationResult]]:
        params = SamplingParams(temperature=1.0, seed=2, max_tokens=8, grammar=grammar, n=3)
        first = await engine.generate(GenerationRequest(prompt, params))
        again = await engine.generate(GenerationRequest(prompt, params))
        return [first, again]

    on, off, _ = await on_and_off(base_path, scenario)
    same_answers(on, off)
    assert on[0][0].token_ids == on[1][0].token_ids  # seeded: the cached run is the same


async def test_an_adapter_hot_swap_never_reads_the_previous_weights_kv(
    base_path: Path, tmp_path: Path
) -> None:
    for seed in (1, 2, 3):
        make_adapter(base_path, tmp_path / f"a{seed}", seed=seed)
    prompt = prompt_of(4, 100)
    hits_after_reload: list[float] = []

    async def scenario(engine: TransformersEngine) -> list[list[GenerationResult]]:
        params = SamplingParams(temperature=0.0, max_tokens=10)
        answers = [await engine.generate(GenerationRequest(prompt, params))]
        await engine.load_adapter(tmp_path / "a1", 1)
        answers.append(await engine.generate(GenerationRequest(prompt, params)))
        await engine.load_adapter(tmp_path / "a2", 2)  # the next step
        answers.append(await engine.generate(GenerationRequest(prompt, params)))
        # The same name and step again, other weights (a step trained again).
        cache = engine.prefix_cache
        hit_before = cache.stats.tokens_hit if cache else 0
        await engine.load_adapter(tmp_path / "a3", 2)
        answers.append(await engine.generate(GenerationRequest(prompt, params)))
        if cache is not None:
            hits_after_reload.append(cache.stats.tokens_hit - hit_before)
        # The base model's own entries are still good.
        answers.append(await engine.generate(GenerationRequest(prompt, params, adapter="base")))
        return answers

    on, off, _ = await on_and_off(base_path, scenario)
    same_answers(on, off)
    assert hits_after_reload == [0]
    # The adapters change the answers (else this test could not see a stale entry).
    assert len({tuple(r[0].token_ids) for r in off[:4]}) >= 3


async def test_a_failed_prefill_leaves_no_entry_and_the_next_call_is_right(
    base_path: Path,
) -> None:
    system = prompt_of(5, 160)
    params = SamplingParams(temperature=0.0, max_tokens=8)

    async with engine_with(base_path, 0) as engine:
        [expected] = await engine.generate(GenerationRequest([*system, 7], params))

    async with engine_with(base_path, ON) as engine:
        assert engine.prefix_cache is not None
        model = engine.model
        forward = model.forward
        calls = 0

        def failing(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == 2:  # the shared prefix went through; the rows' own prefill breaks
                raise RuntimeError("out of memory (simulated)")
            return forward(*args, **kwargs)

        model.forward = failing
        try:
            with pytest.raises(RuntimeError, match="simulated"):
                await asyncio.gather(
                    *(engine.generate(GenerationRequest([*system, 7], params)) for _ in range(2))
                )
        finally:
            model.forward = forward
        cache = engine.prefix_cache
        # Only whole blocks of the shared prefix were kept (nothing of the failed rows).
        assert len(cache) == 160 // cache.block_tokens
        assert cache.bytes_held == sum(b.nbytes for b in cache._blocks.values())
        [answer] = await engine.generate(GenerationRequest([*system, 7], params))
    assert answer.token_ids == expected.token_ids
    assert answer.logprobs == pytest.approx(expected.logprobs, abs=1e-4)


async def test_the_bound_holds_under_a_stream_of_distinct_long_prompts(base_path: Path) -> None:
    bound = 256 * 1024
    async with engine_with(base_path, bound) as engine:
        cache = engine.prefix_cache
        assert cache is not None
        for seed in range(12):
            await engine.generate(
                GenerationRequest(prompt_of(50 + seed, 300), SamplingParams(max_tokens=4))
            )
            assert cache.bytes_held <= bound
        assert cache.stats.evictions > 0
        assert cache.metrics()["prefix_cache/bytes"] <= bound


async def test_a_training_step_reports_the_prefix_cache_in_its_result(
    tmp_path: Path,
) -> None:
    import json

    import art_core as art

    system = "You are a careful agent. " * 40  # a long shared system prompt
    async with art.LocalBackend(path=tmp_path, prefix_cache_bytes=32 << 20) as backend:
        model = art.TrainableModel(name="cached", project="tests", base_model="tiny-random")
        await model.register(backend)
        trajectories = []
        for i in range(4):
            async with art.capture(model) as run:
                await run.openai_client().chat.completions.create(
                    model=run.model_name,
                    messages=[
                        {"role": "system", "content": system},
                        {"role": "user", "content": f"task {i}"},
                    ],
                    max_tokens=4,
                    temperature=1.0,
                )
            trajectories.append(run.trajectory(reward=float(i % 2)))
        result = await model.train(
            [art.TrajectoryGroup(trajectories)], config=art.TrainConfig(learning_rate=1e-3)
        )
        history = backend.model_folder(model).history
    assert result.metrics["serving/prefix_cache/hit_rate"] > 0.5
    assert result.metrics["serving/prefix_cache/bytes"] <= 32 << 20
    asked = result.metrics["serving/prefill/tokens_asked"]
    assert result.metrics["serving/prefill/tokens_computed"] < 0.6 * asked
    # history.jsonl keeps its records as they were (no serving record for one engine).
    records = [json.loads(line) for line in history.read_text().splitlines()]
    # (the step's diagnoses may add a record of their own: calls cut at 4 tokens)
    assert [r["split"] for r in records if r["split"] != "diagnoses"] == ["train"]
