"""OpenAI (legacy) Completions at the gateway, driven by the real ``openai`` SDK over loopback.

Each prompt is recorded as one call (``api == "completions"``, no chat messages) holding the
exact prompt ids (the encoded text, or the ids sent) and the sampled ids the answer returns;
streamed answers add up to the non-streamed ones; bad requests are refused before any work,
in OpenAI's error shape; and a group of completions rollouts trains.
"""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from safetensors.torch import load_file

import art_core as art
from art_core.gateway.apis import completions as completions_api
from art_core.testing.checks import assert_token_exact
from art_core.testing.pytest_plugin import register_tiny_model

PROMPT = "Once upon a time"


def _engine(model: art.TrainableModel) -> Any:
    backend: Any = model.backend()
    return backend.engine(model)


def _tokenizer(model: art.TrainableModel) -> Any:
    return _engine(model).tokenizer


def _extra(choice: Any) -> dict[str, Any]:
    return choice.model_extra or {}


async def _text_of(client: Any, **kwargs: Any) -> tuple[str, str]:
    response = await client.completions.create(**kwargs)
    return response.choices[0].text, response.choices[0].finish_reason


async def test_text_prompt_is_recorded_token_exact(tiny_model: art.TrainableModel) -> None:
    tokenizer = _tokenizer(tiny_model)
    async with art.capture(tiny_model) as run:
        response = await run.openai_client().completions.create(
            model=run.model_name,
            prompt=PROMPT,
            seed=5,
            extra_headers={"x-art-metadata": '{"task": "story"}'},
            # Accepted and left out of sampling (named in the record).
            presence_penalty=0.5,
            frequency_penalty=0.1,
            logit_bias={"5": 1},
            user="someone",
        )
    assert response.object == "text_completion" and response.id.startswith("cmpl")
    assert response.model == run.model_name
    [choice] = response.choices
    assert choice.index == 0 and choice.logprobs is None
    assert choice.finish_reason in ("stop", "length")
    [call] = run.calls
    assert call.api == "completions" and call.messages == [] and call.tools is None
    assert call.prompt_token_ids == tokenizer(PROMPT)["input_ids"]
    assert (
        response.model_extra and response.model_extra["prompt_token_ids"] == call.prompt_token_ids
    )
    assert _extra(choice)["token_ids"] == call.completion_token_ids
    assert _extra(choice)["call_id"] == call.id
    assert choice.text == call.response_message["content"]
    assert choice.text == tokenizer.decode(call.completion_token_ids, skip_special_tokens=True)
    assert len(call.completion_token_ids) <= 16  # OpenAI's default max_tokens
    assert response.usage is not None
    assert response.usage.prompt_tokens == len(call.prompt_token_ids)
    assert response.usage.completion_tokens == len(call.completion_token_ids)
    assert response.usage.total_tokens == response.usage.prompt_tokens + len(
        call.completion_token_ids
    )
    assert call.request_params["prompt"] == PROMPT
    assert call.request_params["max_tokens"] == 16 and call.request_params["seed"] == 5
    assert call.request_params["ignored_fields"] == [
        "frequency_penalty",
        "logit_bias",
        "presence_penalty",
        "user",
    ]
    assert call.metadata["task"] == "story"
    assert_token_exact(run.trajectory(), tokenizer)
    assert run.trajectory().messages() == [call.response_message]


async def test_token_ids_batches_and_n_with_seed(tiny_model: art.TrainableModel) -> None:
    tokenizer = _tokenizer(tiny_model)
    ids = tokenizer("The weather in Paris")["input_ids"]
    async with art.capture(tiny_model) as run:
        client = run.openai_client()
        single = await client.completions.create(
            model=run.model_name, prompt=ids, max_tokens=6, n=3, seed=11
        )
        again = await client.completions.create(
            model=run.model_name, prompt=[ids], max_tokens=6, n=3, seed=11
        )
        batch = await client.completions.create(
            model=run.model_name, prompt=["a b", "c d"], max_tokens=4, n=2, seed=3
        )
    assert [c.index for c in single.choices] == [0, 1, 2]
    tokens = [_extra(c)["token_ids"] for c in single.choices]
    assert tokens == [_extra(c)["token_ids"] for c in again.choices]  # same seed, same ids
    assert len({tuple(t) for t in tokens}) > 1  # each choice its own seed
    calls = run.calls
    first = [c for c in calls if c.index == 0]
    assert sorted(c.choice_index for c in first) == [0, 1, 2]
    assert all(c.prompt_token_ids == ids for c in first)
    assert [c.completion_token_ids for c in sorted(first, key=lambda c: c.choice_index)] == tokens
    # Two prompts: two recorded calls, choices numbered prompt * n + choice.
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert batch.usage is not None
    by_index = {c.index: c for c in calls}
    assert set(by_index) == {0, 1, 2, 3}
    for k, choice in enumerate(batch.choices):
        recorded = next(c for c in calls if c.index == 2 + k // 2 and c.choice_index == k % 2)
        assert _extra(choice)["token_ids"] == recorded.completion_token_ids
        assert _extra(choice)["prompt_token_ids"] == recorded.prompt_token_ids
        assert recorded.prompt_token_ids == tokenizer(["a b", "c d"][k // 2])["input_ids"]
        assert recorded.request_params["prompt_index"] == k // 2
    prompts = sum(len(tokenizer(p)["input_ids"]) for p in ("a b", "c d"))
    assert batch.usage.prompt_tokens == prompts
    assert batch.usage.completion_tokens == sum(len(_extra(c)["token_ids"]) for c in batch.choices)


async def test_stop_echo_and_logprobs(tiny_model: art.TrainableModel) -> None:
    tokenizer = _tokenizer(tiny_model)
    client = tiny_model.openai_client()
    kwargs: dict[str, Any] = dict(model=tiny_model.name, prompt=PROMPT, max_tokens=16)
    seed, text = 0, ""
    for seed in range(40):  # a seed whose answer runs to the limit, long enough to cut
        text, finish = await _text_of(client, seed=seed, **kwargs)
        if finish == "length" and len(text) >= 8:
            break
    k = next(i for i in range(2, len(text) - 2) if "\ufffd" not in text[i : i + 2])
    stop = text[k : k + 2]
    cut, finish = await _text_of(client, seed=seed, stop=[stop, "never-in-it"], **kwargs)
    assert cut == text[: text.index(stop)] and finish == "stop"

    echoed = await client.completions.create(seed=seed, echo=True, **kwargs)
    assert echoed.choices[0].text == PROMPT + text
    ids = tokenizer(PROMPT)["input_ids"]
    by_ids = await client.completions.create(
        **{**kwargs, "prompt": ids, "max_tokens": 2}, seed=seed, echo=True
    )
    assert by_ids.choices[0].text.startswith(tokenizer.decode(ids, skip_special_tokens=True))

    scored = await client.completions.create(seed=seed, logprobs=2, **kwargs)
    choice = scored.choices[0]
    logprobs = choice.logprobs
    assert choice.text == text and logprobs is not None
    sampled = _extra(choice)["token_ids"]
    assert logprobs.tokens == [tokenizer.decode([t]) for t in sampled]
    assert logprobs.token_logprobs is not None and len(logprobs.token_logprobs) == len(sampled)
    assert logprobs.text_offset is not None and logprobs.text_offset[0] == 0
    assert logprobs.text_offset[1] == len(logprobs.tokens[0])
    assert logprobs.top_logprobs is not None
    for token, logprob, top in zip(
        logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True
    ):
        assert top[token] == pytest.approx(logprob) and 1 <= len(top) <= 3


async def test_stream_adds_up_to_the_non_streamed_answer(tiny_model: art.TrainableModel) -> None:
    async with art.capture(tiny_model) as run:
        client = run.openai_client()
        kwargs: dict[str, Any] = dict(
            model=run.model_name, prompt=PROMPT, max_tokens=12, n=2, seed=21, echo=True
        )
        plain = await client.completions.create(**kwargs)
        stream = await client.completions.create(
            stream=True, stream_options={"include_usage": True}, **kwargs
        )
        texts: dict[int, str] = {0: "", 1: ""}
        finals: dict[int, Any] = {}
        usage = None
        async for chunk in stream:
            assert chunk.object == "text_completion"
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                texts[choice.index] += choice.text
                if choice.finish_reason is not None:
                    finals[choice.index] = choice
    assert texts == {c.index: c.text for c in plain.choices}
    assert all(text.startswith(PROMPT) for text in texts.values())
    for choice in plain.choices:
        assert _extra(finals[choice.index])["token_ids"] == _extra(choice)["token_ids"]
        assert finals[choice.index].finish_reason == choice.finish_reason
    assert usage is not None and plain.usage is not None
    assert usage.completion_tokens == plain.usage.completion_tokens
    assert usage.prompt_tokens == plain.usage.prompt_tokens
    calls = run.calls
    assert len(calls) == 4 and {c.index for c in calls} == {0, 1}
    by_key = {(c.index, c.choice_index): c for c in calls}
    for choice in range(2):  # stream and not: the same record
        a, b = by_key[(0, choice)], by_key[(1, choice)]
        assert a.completion_token_ids == b.completion_token_ids
        assert a.response_message == b.response_message


async def test_stream_cuts_at_a_stop_string(tiny_model: art.TrainableModel) -> None:
    client = tiny_model.openai_client()
    kwargs: dict[str, Any] = dict(model=tiny_model.name, prompt="a b c", max_tokens=16, seed=2)
    text, _ = await _text_of(client, **kwargs)
    k = next((i for i in range(1, len(text) - 1) if "\ufffd" not in text[i : i + 2]), None)
    assert k is not None, f"the seeded text {text!r} is too short to cut"
    stop = text[k : k + 2]
    plain, _ = await _text_of(client, stop=stop, **kwargs)
    streamed = ""
    async for chunk in await client.completions.create(stream=True, stop=stop, **kwargs):
        streamed += "".join(c.text for c in chunk.choices)
    assert streamed == plain == text[: text.index(stop)]


def _bad_requests(context: int, max_chars: int) -> list[tuple[dict[str, Any], int, str, str]]:
    return [
        ({"prompt": [5, 99999]}, 400, "prompt", "not a token id of this model"),
        ({"prompt": [[5], [6, -1]]}, 400, "prompt", "prompt[1][1] = -1"),
        ({"prompt": ""}, 400, "prompt", "is empty"),
        ({"prompt": []}, 400, "prompt", "empty list"),
        ({"prompt": ["a", ""]}, 400, "prompt", "prompt[1] is empty"),
        ({"prompt": [1, "a"]}, 400, "prompt", "a list of token ids"),
        ({"prompt": [[1], [True]]}, 400, "prompt", "prompt[1][0] is not a token id"),
        ({"prompt": {"text": "hi"}}, 400, "prompt", "prompt must be"),
        ({}, 400, "prompt", "prompt is required"),
        ({"prompt": ["a"] * 17}, 400, "prompt", "at most 16"),
        ({"prompt": "hi", "temperature": "hot"}, 400, "temperature", "temperature"),
        ({"prompt": "hi", "n": "3"}, 400, "n", "n:"),
        ({"prompt": "hi", "max_tokens": True}, 400, "max_tokens", "max_tokens"),
        ({"prompt": "hi", "logprobs": True}, 400, "logprobs", "logprobs"),
        ({"prompt": "hi", "logprobs": 6}, 400, "logprobs", "logprobs"),
        ({"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", "up to 4"),
        ({"prompt": "hi", "suffix": "end"}, 400, "suffix", "suffix"),
        ({"prompt": "hi", "best_of": 3}, 400, "best_of", "best_of=3"),
        ({"prompt": "hi", "echo": True, "logprobs": 1}, 400, "echo", "echo with logprobs"),
        ({"prompt": ["a"] * 8, "n": 9}, 400, "n", "72 choices"),
        (
            {"prompt": "hi", "max_tokens": context},
            400,
            "max_tokens",
            f"max_tokens={context} plus the prompt's",
        ),
        ({"prompt": [5] * context}, 400, "prompt", f"has {context} tokens"),
        (
            {"prompt": "a" * (context * max_chars + 1)},
            400,
            "prompt",
            "characters, more than",
        ),
    ]


async def test_bad_requests_are_refused_before_any_work(tiny_model: art.TrainableModel) -> None:
    engine = _engine(tiny_model)
    context = engine.context_length
    max_chars = max(len(t) for t in engine.tokenizer.get_vocab())
    async with art.capture(tiny_model) as run:
        async with httpx.AsyncClient(timeout=60) as http:
            for body, status, param, needle in _bad_requests(context, max_chars):
                answer = await http.post(
                    f"{run.base_url}/completions", json={"model": run.model_name, **body}
                )
                assert answer.status_code == status, (body, answer.text)
                error = answer.json()["error"]
                assert error["type"] == "invalid_request_error", error
                assert error["param"] == param, (body, error)
                assert needle in error["message"], (needle, error["message"])
                if "context" in error["message"]:
                    assert error["code"] == "context_length_exceeded"
            bad_json = await http.post(f"{run.base_url}/completions", content=b"{nope")
            assert bad_json.status_code == 400 and "error" in bad_json.json()
        client = run.openai_client()
        with pytest.raises(openai.NotFoundError) as missing:
            await client.completions.create(model="no-such-model", prompt="hi")
        assert missing.value.body["code"] == "model_not_found"  # type: ignore[index]
        with pytest.raises(openai.BadRequestError):
            await client.completions.create(model=run.model_name, prompt="hi", suffix="x")
    assert run.calls == []


def test_prompt_shapes_and_encoding(tiny_model: art.TrainableModel) -> None:
    assert completions_api.prompts_of("hi") == ["hi"]
    assert completions_api.prompts_of(["a", "b"]) == ["a", "b"]
    assert completions_api.prompts_of([1, 2]) == [[1, 2]]
    assert completions_api.prompts_of([[1], [2, 3]]) == [[1], [2, 3]]
    tokenizer = _tokenizer(tiny_model)

    class Served:  # what encode_text reads of a served model
        def __init__(self) -> None:
            self.tokenizer = tokenizer
            self.prompts = type("P", (), {"encode": staticmethod(lambda t: [7])})()

    served: Any = Served()
    # vLLM's encoding: the tokenizer's own special tokens unless add_special_tokens is false.
    assert completions_api.encode_text(served, PROMPT) == tokenizer(PROMPT)["input_ids"]
    assert completions_api.encode_text(served, PROMPT, add_special_tokens=False) == [7]


async def _completion_rollout(model: art.TrainableModel, seed: int) -> art.Trajectory:
    """Two calls, the second continuing the first's prompt and sampled ids (one sequence)."""
    tokenizer = _tokenizer(model)
    async with art.capture(model) as run:
        client = run.openai_client()
        ids = tokenizer(f"Count: {seed}")["input_ids"]
        first = await client.completions.create(
            model=run.model_name, prompt=ids, max_tokens=8, seed=seed, temperature=1.0
        )
        sampled = _extra(first.choices[0])["token_ids"]
        more = ids + sampled + tokenizer(" and then")["input_ids"]
        await client.completions.create(
            model=run.model_name, prompt=more, max_tokens=8, seed=seed, temperature=1.0
        )
    return run.trajectory(reward=float(seed % 2)).finish()


async def test_a_group_of_completions_rollouts_trains(backend: art.LocalBackend) -> None:
    model = await register_tiny_model(backend, "completions-train")
    trajectories = [await _completion_rollout(model, seed) for seed in range(4)]
    for trajectory in trajectories:
        assert [c.api for c in trajectory.calls] == ["completions", "completions"]
        assert all(c.messages == [] for c in trajectory.calls)
        assert_token_exact(trajectory, _tokenizer(model))
    result = await model.train([art.TrajectoryGroup(trajectories)], config=art.TrainConfig())
    assert await model.get_step() == 1, result
    folder = backend.model_folder(model).checkpoint(1)
    weights = load_file(str(folder / "adapter_model.safetensors"))
    assert any(k.endswith("lora_B.weight") and v.abs().sum() > 0 for k, v in weights.items())
    # The new adapter serves completions too.
    client = model.openai_client()
    response = await client.completions.create(
        model=model.get_inference_name(1), prompt="hi", max_tokens=2
    )
    assert _extra(response.choices[0])["adapter_step"] == 1
