"""Choosing a model's chat format by name, and the template's own switches per request."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio

import art_core as art


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def backend(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[art.LocalBackend]:
    """This module's own backend, closed after it: the models it loads do not stay loaded
    for the rest of the session."""
    async with art.LocalBackend(path=tmp_path_factory.mktemp("formats")) as local:
        yield local


async def test_a_named_tool_call_parser_is_the_one_served(backend: art.LocalBackend) -> None:
    model = art.TrainableModel(
        name="named-parser",
        project="formats",
        base_model="tiny-random",
        _internal_config={"tool_call_parser": "llama3_json", "reasoning_parser": "qwen3"},
    )
    await model.register(backend)
    chat_format = backend.gateway.models[model.name].chat.format
    assert chat_format.describe() == {
        "tool_call_parser": "llama3_json",
        "reasoning_parser": "qwen3",
    }


async def test_an_unknown_parser_is_refused_before_anything_is_written(
    backend: art.LocalBackend,
) -> None:
    model = art.TrainableModel(
        name="bad-parser",
        project="formats",
        base_model="tiny-random",
        _internal_config={"tool_call_parser": "nonesuch"},
    )
    with pytest.raises(ValueError, match="unknown tool_call_parser 'nonesuch'"):
        await model.register(backend)
    assert not backend.model_folder(model).root.exists()
    assert model.name not in backend.gateway.models


async def test_chat_template_kwargs_reach_the_template_and_cannot_set_its_arguments(
    backend: art.LocalBackend,
) -> None:
    model = art.TrainableModel(name="thinking", project="formats", base_model="tiny-qwen3")
    await model.register(backend)
    tokenizer = backend.gateway.models[model.name].chat.tokenizer
    async with art.capture(model) as run:
        client = run.openai_client()
        question = [{"role": "user", "content": "hi"}]
        await client.chat.completions.create(
            model=run.model_name,
            messages=question,
            max_tokens=2,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        )
        headers = {"Authorization": f"Bearer {model.inference_api_key or 'art'}"}
        async with httpx.AsyncClient(base_url=run.base_url, headers=headers) as raw:
            refused = await raw.post(
                "/chat/completions",
                json={
                    "model": run.model_name,
                    "messages": question,
                    "chat_template_kwargs": {"tokenize": True},
                },
            )
    assert refused.status_code == 400
    assert "chat_template_kwargs cannot set 'tokenize'" in refused.json()["error"]["message"]
    [call] = run.trajectory().calls
    prompt = tokenizer.decode(call.prompt_token_ids)
    assert prompt.endswith("<think>\n\n</think>\n\n")  # thinking switched off by the template
    assert call.request_params["chat_template_kwargs"] == {"enable_thinking": False}
