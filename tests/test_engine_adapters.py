"""LoRA adapters load and swap between requests; each call records the step that served it."""

from __future__ import annotations

from pathlib import Path

from lora_support import make_adapter

import art_core as art


async def test_adapter_swap_changes_outputs_and_records_step(
    backend: art.LocalBackend, tiny_model: art.TrainableModel, tmp_path: Path
) -> None:
    engine = backend.engine(tiny_model)
    make_adapter(engine.model_path, tmp_path / "a7", seed=1)
    request = dict(
        model=tiny_model.name,
        messages=[{"role": "user", "content": "same prompt"}],
        max_tokens=16,
        temperature=0.0,
    )

    async def served(model_name: str) -> tuple[list[int], int]:
        async with art.capture(tiny_model) as run:
            await run.openai_client().chat.completions.create(**{**request, "model": model_name})
        [call] = run.trajectory().calls
        return call.completion_token_ids, call.adapter_step

    before_ids, before_step = await served(tiny_model.name)
    await backend.server.call(engine.load_adapter(tmp_path / "a7", 7))
    try:
        after_ids, after_step = await served(tiny_model.name)
        pinned_base_ids, pinned_base_step = await served(f"{tiny_model.name}@0")
        pinned_ids, pinned_step = await served(f"{tiny_model.name}@7")
    finally:
        # leave the shared model as the other tests expect it: serving the base weights
        engine._adapters.current = None  # type: ignore[attr-defined]
    assert before_step == 0 and after_step == 7 and pinned_step == 7 and pinned_base_step == 0
    assert after_ids != before_ids
    assert pinned_ids == after_ids and pinned_base_ids == before_ids


def test_adapter_registry_keeps_the_newest_and_a_default() -> None:
    from art_core.engines.base import AdapterInfo, AdapterRegistry

    registry = AdapterRegistry(capacity=2)
    assert registry.current is None and registry.by_step(0).name == "base"
    assert registry.add(AdapterInfo("step-1", 1, None)) == []
    assert registry.add(AdapterInfo("step-2", 2, None)) == []
    assert [a.name for a in registry.add(AdapterInfo("step-3", 3, None))] == ["step-1"]
    assert [a.step for a in registry.all()] == [2, 3] and registry.current.step == 3
    assert registry.by_step(1) is None and registry.get("step-2").step == 2
    # re-adding a name makes it the newest again, so the other one is evicted next
    registry.add(AdapterInfo("step-2", 2, None))
    assert [a.name for a in registry.add(AdapterInfo("step-4", 4, None))] == ["step-3"]
    registry.remove("step-4")
    assert registry.current is None and "step-4" not in registry and len(registry) == 1


async def test_sampling_and_training_of_a_model_run_on_one_thread(
    backend: art.LocalBackend,
) -> None:
    """OpenMP keeps a thread team per calling thread: torch work hopping between threads made
    decoding ~1.7x slower, so a model's engine batches and training steps share one thread."""
    import threading

    from art_core.engines.base import GenerationRequest, SamplingParams
    from art_core.training import TrainConfig

    model = art.TrainableModel(name="one-thread", project="tests", base_model="tiny-random")
    await model.register(backend)
    engine = backend.engine(model)
    sampled_on: set[int] = set()
    trained_on: set[int] = set()

    async def rollout(reward: float) -> art.Trajectory:
        async with art.capture(model) as run:
            await run.openai_client().chat.completions.create(
                model=model.name, messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
        return run.trajectory(reward=reward)

    group = art.TrajectoryGroup([await rollout(1.0), await rollout(0.0)])
    request = GenerationRequest(
        [1, 2, 3],
        SamplingParams(max_tokens=3),
        on_tokens=lambda _choice, _ids: sampled_on.add(threading.get_ident()),
    )
    await backend.server.call(engine.generate(request))
    await backend._train(
        model,
        [group],
        TrainConfig(learning_rate=1e-3),
        on_progress=lambda _record: trained_on.add(threading.get_ident()),
    )
    await backend.server.call(engine.generate(request))
    assert len(sampled_on) == 1 and sampled_on == trained_on
    assert threading.get_ident() not in sampled_on  # and it is not the event loop's thread
