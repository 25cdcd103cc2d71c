"""vLLM's ``prompt_logprobs`` at the gateway's ``/v1/completions`` and through an engine
worker: each prompt token's logprob, rank and top alternatives equal a direct fp32
``log_softmax`` of the same model's forward (with the adapter that serves the call), in
vLLM's wire format; bad values are refused before any work.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from lora_support import make_adapter
from prompt_logprobs_support import assert_scores, reference, tolerance

import art_core as art
from art_core.engines.base import GenerationRequest, PromptLogprob, SamplingParams
from art_core.engines.http_engine import HTTPEngine
from art_core.engines.prompt_logprobs import from_wire
from art_core.engines.transformers_engine import TransformersEngine
from art_core.engines.worker import ThreadedWorker
from art_core.testing.pytest_plugin import register_tiny_model

PROMPT_IDS = [5, 17, 250, 3, 99, 42, 42, 7, 600, 12, 31, 8]


def _engine(model: art.TrainableModel) -> Any:
    backend: Any = model.backend()
    return backend.engine(model)


async def test_token_prompt_scores_match_the_model(tiny_model: art.TrainableModel) -> None:
    engine = _engine(tiny_model)
    k = 5
    async with art.capture(tiny_model) as run:
        async with httpx.AsyncClient(timeout=60) as http:
            answer = await http.post(
                f"{run.base_url}/completions",
                json={
                    "model": run.model_name,
                    "prompt": PROMPT_IDS,
                    "max_tokens": 1,
                    "prompt_logprobs": k,
                    "temperature": 1.0,
                },
            )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    [choice] = body["choices"]
    wire = choice["prompt_logprobs"]
    # vLLM's format: null first, then objects keyed by token id with logprob, rank, text.
    assert wire[0] is None and len(wire) == len(PROMPT_IDS)
    for position, entries in enumerate(wire[1:], start=1):
        assert str(PROMPT_IDS[position]) in entries
        assert next(iter(entries)) == str(PROMPT_IDS[position])  # the prompt token first
        for key, item in entries.items():
            assert set(item) == {"logprob", "rank", "decoded_token"}
            assert item["decoded_token"] == engine.tokenizer.decode(
                [int(key)], skip_special_tokens=False
            )
        assert sorted(i["rank"] for i in entries.values() if i["rank"] <= k) == [1, 2, 3, 4, 5]
    scored = from_wire(wire, PROMPT_IDS, k)
    ref = reference(engine.model_path, engine.dtype, PROMPT_IDS)
    assert_scores(scored, ref, PROMPT_IDS, k, tolerance(engine.dtype))
    # The call is recorded token-exactly as any other; the scores are not.
    [call] = run.calls
    assert call.prompt_token_ids == PROMPT_IDS and len(call.completion_token_ids) == 1
    assert choice["token_ids"] == call.completion_token_ids
    assert call.request_params["prompt_logprobs"] == k
    assert "ignored_fields" not in call.request_params
    assert "prompt_logprobs" not in call.metadata


async def test_text_prompt_and_choices_share_the_scores(tiny_model: art.TrainableModel) -> None:
    engine = _engine(tiny_model)
    async with art.capture(tiny_model) as run:
        response = await run.openai_client().completions.create(
            model=run.model_name,
            prompt="Once upon a time",
            max_tokens=3,
            n=2,
            echo=True,
            extra_body={"prompt_logprobs": 0},
        )
    ids = (response.model_extra or {})["prompt_token_ids"]
    assert ids == engine.tokenizer("Once upon a time")["input_ids"]
    first, second = (c.model_extra or {} for c in response.choices)
    assert first["prompt_logprobs"] == second["prompt_logprobs"]
    assert response.choices[0].text.startswith("Once upon a time")  # echo still works
    scored = from_wire(first["prompt_logprobs"], ids, k=0)
    ref = reference(engine.model_path, engine.dtype, ids)
    assert_scores(scored, ref, ids, 0, tolerance(engine.dtype))
    assert len(run.calls) == 2


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"prompt_logprobs": -1}, "prompt_logprobs"),
        ({"prompt_logprobs": 21}, "prompt_logprobs"),
        ({"prompt_logprobs": "x"}, "prompt_logprobs"),
        ({"prompt_logprobs": True}, "prompt_logprobs"),
        ({"prompt_logprobs": 1.5}, "prompt_logprobs"),
        ({"prompt_logprobs": 2, "stream": True}, "not available when streaming"),
    ],
)
async def test_bad_values_are_refused(
    tiny_model: art.TrainableModel, extra: dict[str, Any], needle: str
) -> None:
    async with art.capture(tiny_model) as run:
        async with httpx.AsyncClient(timeout=60) as http:
            answer = await http.post(
                f"{run.base_url}/completions",
                json={"model": run.model_name, "prompt": PROMPT_IDS, "max_tokens": 1, **extra},
            )
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == "prompt_logprobs" and needle in error["message"], error
    assert run.calls == []


async def test_an_adapter_scores_with_its_weights(
    backend: art.LocalBackend, tmp_path: Path
) -> None:
    model = await register_tiny_model(backend, "prompt-logprobs-adapter")
    engine = _engine(model)
    make_adapter(engine.model_path, tmp_path / "a3", seed=3)
    await backend.server.call(engine.load_adapter(tmp_path / "a3", 3))
    k = 3
    scored_by: dict[str, list[PromptLogprob | None]] = {}
    async with httpx.AsyncClient(timeout=60) as http:
        for name in (f"{model.name}@3", f"{model.name}@0"):
            answer = await http.post(
                f"{model.inference_base_url}/completions",
                json={"model": name, "prompt": PROMPT_IDS, "max_tokens": 1, "prompt_logprobs": k},
            )
            assert answer.status_code == 200, answer.text
            [choice] = answer.json()["choices"]
            assert choice["adapter_step"] == int(name.rpartition("@")[2])
            scored_by[name] = from_wire(choice["prompt_logprobs"], PROMPT_IDS, k)
    tol = tolerance(engine.dtype)
    adapted = reference(engine.model_path, engine.dtype, PROMPT_IDS, adapter=tmp_path / "a3")
    assert_scores(scored_by[f"{model.name}@3"], adapted, PROMPT_IDS, k, tol)
    base = reference(engine.model_path, engine.dtype, PROMPT_IDS)
    assert_scores(scored_by[f"{model.name}@0"], base, PROMPT_IDS, k, tol)
    assert (adapted - base).abs().max() > 10 * tol  # the adapter really changes the scores


async def test_an_engine_worker_scores_over_http(tmp_path: Path) -> None:
    """The worker writes vLLM's format and the HTTP engine client reads it back (the path of
    ``LocalBackend(replicas=N)`` and of a vLLM server); a long prompt is scored in chunks."""
    from art_core.embedded import resolve_base_model
    from art_core.engines import transformers_engine

    path = resolve_base_model("tiny-random")
    served = TransformersEngine(path, batch_window=0)
    worker = ThreadedWorker(served)
    client = HTTPEngine(name="test worker")
    client.url = f"http://127.0.0.1:{worker.port}"
    client.context_length = served.context_length
    await client.connect()
    chunked = transformers_engine.PROMPT_SCORE_BYTES
    try:
        k = 4
        [result] = await client.generate(
            GenerationRequest(PROMPT_IDS, SamplingParams(max_tokens=2, prompt_logprobs=k))
        )
        ref = reference(path, served.dtype, PROMPT_IDS)
        assert result.prompt_logprobs is not None and len(result.token_ids) >= 1
        assert_scores(result.prompt_logprobs, ref, PROMPT_IDS, k, tolerance(served.dtype))
        # The smallest chunks (16 tokens) over a prompt of several: the same scores.
        transformers_engine.PROMPT_SCORE_BYTES = 1
        long_ids = [(7 * i + 3) % 600 + 1 for i in range(70)]
        [result] = await client.generate(
            GenerationRequest(long_ids, SamplingParams(max_tokens=1, prompt_logprobs=k))
        )
        assert result.prompt_logprobs is not None
        ref = reference(path, served.dtype, long_ids)
        assert_scores(result.prompt_logprobs, ref, long_ids, k, tolerance(served.dtype))
        # A streamed call cannot carry prompt scores (vLLM neither): refused before sending.
        with pytest.raises(Exception, match="cannot be streamed"):
            await client.generate(
                GenerationRequest(
                    PROMPT_IDS,
                    SamplingParams(max_tokens=1, prompt_logprobs=k),
                    on_tokens=lambda choice, ids: None,
                )
            )
    finally:
        transformers_engine.PROMPT_SCORE_BYTES = chunked
        await client.disconnect()
        # The engine's scheduler runs on the worker's loop: closed there, then the server.
        asyncio.run_coroutine_threadsafe(served.close(), worker.loop).result(timeout=60)
        worker.stop()
