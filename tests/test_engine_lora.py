"""Our LoRA serving layers compute what peft computes, and unusual adapters fall back to peft."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from lora_support import make_adapter
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

from art_core.embedded import resolve_base_model
from art_core.engines.base import GenerationRequest, SamplingParams
from art_core.engines.lora import LoraServer, UnsupportedAdapter, read_adapter
from art_core.engines.transformers_engine import TransformersEngine


@pytest.fixture(scope="module")
def base_path() -> Path:
    return resolve_base_model("tiny-random")


def save_adapter(base_path: Path, folder: Path, seed: int, **config: object) -> Path:
    torch.manual_seed(seed)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base_path), LoraConfig(**config))
    for name, parameter in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.3)
    model.save_pretrained(folder)
    return folder


def peft_logits(base_path: Path, adapter: Path, ids: torch.Tensor) -> torch.Tensor:
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_path), adapter)
    with torch.no_grad():
        return model.eval()(ids).logits


def peft_greedy(base_path: Path, adapter: Path, prompt: list[int], tokens: int) -> list[int]:
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_path), adapter)
    ids = torch.tensor([prompt])
    out = model.eval().generate(ids, max_new_tokens=tokens, do_sample=False)
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize(
    "config",
    [
        dict(r=8, lora_alpha=64, target_modules=["q_proj", "v_proj", "down_proj"]),
        dict(r=4, lora_alpha=8, use_rslora=True, target_modules=["k_proj", "o_proj", "lm_head"]),
    ],
    ids=["attention+mlp", "rslora+lm_head"],
)
def test_lora_layers_match_peft(base_path: Path, tmp_path: Path, config: dict) -> None:
    adapter = save_adapter(base_path, tmp_path / "adapter", seed=3, **config)
    ids = torch.randint(0, 600, (2, 12))
    expected = peft_logits(base_path, adapter, ids)

    model = AutoModelForCausalLM.from_pretrained(base_path).eval()
    with torch.no_grad():
        base = model(ids).logits
    server = LoraServer(model)
    server.load("a", adapter)
    with torch.no_grad():
        inactive = model(ids).logits
        server.activate("a")
        served = model(ids).logits
        server.activate(None)
        off_again = model(ids).logits
    assert (expected - base).abs().max() > 1e-2  # the adapter really changes the outputs
    torch.testing.assert_close(served, expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(inactive, base, rtol=0, atol=0)
    torch.testing.assert_close(off_again, base, rtol=0, atol=0)


def test_two_adapters_switch_per_forward_and_remove(base_path: Path, tmp_path: Path) -> None:
    first = save_adapter(base_path, tmp_path / "a", seed=1, r=8, target_modules=["q_proj"])
    second = save_adapter(base_path, tmp_path / "b", seed=2, r=8, target_modules=["up_proj"])
    ids = torch.randint(0, 600, (1, 9))
    model = AutoModelForCausalLM.from_pretrained(base_path).eval()
    server = LoraServer(model)
    server.load("a", first)
    server.load("b", second)
    assert server.names == ["a", "b"]
    with torch.no_grad():
        server.activate("b")
        torch.testing.assert_close(model(ids).logits, peft_logits(base_path, second, ids))
        server.activate("a")
        torch.testing.assert_close(model(ids).logits, peft_logits(base_path, first, ids))
    server.remove("a")
    assert server.names == ["b"]
    with pytest.raises(KeyError, match="'a' is not loaded"):
        server.activate("a")
    server.uninstall()
    assert isinstance(model.get_submodule("model.layers.0.mlp.up_proj"), torch.nn.Linear)


def test_checkpoints_of_one_rank_are_served_by_the_same_forward(
    base_path: Path, tmp_path: Path
) -> None:
    """Each adapted linear keeps one forward over its factor buffers (``AdapterSlot``): the
    next checkpoint of the same targets and rank is copied in (what a compiled decode step
    needs to reuse its graph), in or out of inference mode, and computes its own logits."""
    targets = dict(r=8, target_modules=["q_proj", "down_proj"])
    first = save_adapter(base_path, tmp_path / "a", seed=1, **targets)
    second = save_adapter(base_path, tmp_path / "b", seed=2, **targets)
    ids = torch.randint(0, 600, (1, 9))
    model = AutoModelForCausalLM.from_pretrained(base_path).eval()
    server = LoraServer(model)
    server.load("a", first)
    server.load("b", second)
    q_proj = model.get_submodule("model.layers.0.self_attn.q_proj")
    with torch.inference_mode():
        server.activate("a")
        forward = q_proj.__dict__["forward"]
        torch.testing.assert_close(model(ids).logits, peft_logits(base_path, first, ids))
    server.activate("b")  # outside inference mode: the buffers are plain tensors
    assert q_proj.__dict__["forward"] is forward
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, peft_logits(base_path, second, ids))
    server.activate(None)
    assert "forward" not in q_proj.__dict__
    server.activate("a")
    assert q_proj.__dict__["forward"] is forward


def test_unsupported_adapters_are_refused_before_anything_changes(
    base_path: Path, tmp_path: Path
) -> None:
    dora = save_adapter(
        base_path, tmp_path / "dora", seed=1, r=4, use_dora=True, target_modules=["q_proj"]
    )
    with pytest.raises(UnsupportedAdapter, match="use_dora"):
        read_adapter(dora)
    embedding = save_adapter(
        base_path, tmp_path / "emb", seed=1, r=4, target_modules=["embed_tokens"]
    )
    model = AutoModelForCausalLM.from_pretrained(base_path).eval()
    server = LoraServer(model)
    with pytest.raises(UnsupportedAdapter, match="embed"):
        server.load("e", embedding)
    assert server.names == []
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text("{not json")
    with pytest.raises(UnsupportedAdapter, match=r"adapter_config\.json"):
        read_adapter(broken)
    config = json.loads((dora / "adapter_config.json").read_text())
    assert config["use_dora"] is True


async def test_engine_falls_back_to_peft_and_keeps_serving_every_adapter(
    base_path: Path, tmp_path: Path
) -> None:
    make_adapter(base_path, tmp_path / "plain", seed=1)
    dora = save_adapter(
        base_path,
        tmp_path / "dora",
        seed=2,
        r=8,
        lora_alpha=64,
        use_dora=True,
        target_modules=["q_proj", "v_proj", "up_proj", "down_proj"],
    )
    engine = TransformersEngine(base_path, dtype="float32")
    await engine.start()
    try:
        prompt = engine.tokenizer.apply_chat_template(
            [{"role": "user", "content": "hello there"}], add_generation_prompt=True
        )["input_ids"]

        async def answer(adapter: str | None) -> list[int]:
            params = SamplingParams(temperature=0.0, max_tokens=12)
            [result] = await engine.generate(
                GenerationRequest(list(prompt), params, adapter=adapter)
            )
            return result.token_ids

        base = await answer(None)
        await engine.load_adapter(tmp_path / "plain", 1)
        plain_fast = await answer("step-1")
        await engine.load_adapter(dora, 2)  # needs peft: every adapter moves to peft
        plain_peft = await answer("step-1")
        dora_answer = await answer("step-2")
        base_again = await answer("base-not-loaded")  # unknown name: the base model
        assert plain_fast != base
        assert plain_fast == peft_greedy(base_path, tmp_path / "plain", prompt, 12)
        assert plain_peft == plain_fast
        assert dora_answer == peft_greedy(base_path, dora, prompt, 12)
        assert base_again == base
        assert [a.step for a in engine.adapters()] == [1, 2]
    finally:
        await engine.close()


async def test_engine_runs_all_torch_work_on_the_worker_it_is_given(base_path: Path) -> None:
    """LocalBackend gives engine and trainer one thread (OpenMP thread teams are per thread)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    worker = ThreadPoolExecutor(max_workers=1)
    worker_thread = worker.submit(threading.get_ident).result()
    engine = TransformersEngine(base_path, dtype="float32", worker=worker)
    await engine.start()
    seen: set[int] = set()
    try:
        for _ in range(3):
            request = GenerationRequest(
                [1, 2, 3],
                SamplingParams(max_tokens=4),
                on_tokens=lambda _choice, _ids: seen.add(threading.get_ident()),
            )
            await engine.generate(request)
    finally:
        await engine.close()
    assert seen == {worker_thread}
    assert worker.submit(lambda: "still open").result() == "still open"  # not the engine's to close
    worker.shutdown()


def test_prepacked_bf16_linears_compute_what_plain_ones_do(base_path: Path, tmp_path: Path) -> None:
    from art_core.engines.packed import pack_linears, packing_supported

    if not packing_supported("cpu", torch.bfloat16):
        pytest.skip("this CPU or torch build has no oneDNN bf16 linears")
    adapter = save_adapter(
        base_path,
        tmp_path / "adapter",
        seed=4,
        r=8,
        lora_alpha=32,
        target_modules=["q_proj", "up_proj", "down_proj"],
    )
    ids = torch.randint(0, 600, (3, 10))
    plain = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.bfloat16).eval()
    packed = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.bfloat16).eval()
    assert pack_linears(packed) == sum(type(m) is torch.nn.Linear for m in plain.modules())
    servers = [LoraServer(plain), LoraServer(packed)]
    for server in servers:
        server.load("a", adapter)
    outputs = []
    with torch.inference_mode():
        for name in (None, "a", None):
            for server in servers:
                server.activate(name)
            outputs.append((plain(ids).logits, packed(ids).logits))
    for plain_logits, packed_logits in outputs:
        torch.testing.assert_close(packed_logits, plain_logits, rtol=0.02, atol=0.02)
    assert (outputs[1][1] - outputs[0][1]).abs().max() > 0.05  # the adapter is applied
    torch.testing.assert_close(outputs[2][1], outputs[0][1], rtol=0, atol=0)  # and removed
