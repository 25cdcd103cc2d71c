"""``art_core.export``: a trained tiny-random checkpoint exported as a PEFT adapter and as a
merged model, loaded back with plain transformers/peft and checked token for token against
what the gateway served; checkpoint choice, ``export.json``, refusals, atomicity, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

import art_core as art
from art_core.export import ExportResult, export_checkpoint
from art_core.model_folder import ModelFolder
from art_core.testing.tools import WEATHER_TOOL
from art_core.training import TrainConfig

CONFIG = TrainConfig(learning_rate=1e-2, precision="fp32", seed=3)
PROMPTS = ["Is it sunny in Lima?", "Say yes or no."]
MESSAGES = [
    {"role": "system", "content": "Answer with the weather tool when you need it."},
    {"role": "user", "content": "What is the weather in Paris?"},
]


async def _rollout(model: art.TrainableModel, prompt: str, seed: int, reward: float) -> Any:
    async with art.capture(model) as run:
        await run.openai_client().chat.completions.create(
            model=run.model_name,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=8,
            temperature=1.0,
            seed=seed,
        )
    return run.trajectory(reward=reward)


async def _train_step(model: art.TrainableModel) -> None:
    step = await model.get_step()
    groups = await art.gather_trajectory_groups(
        (
            art.TrajectoryGroup(
                _rollout(model, prompt, 100 * step + 10 * p + i, float(i % 2)) for i in range(4)
            )
            for p, prompt in enumerate(PROMPTS)
        ),
        pbar_desc=None,
    )
    await model.train(groups, config=CONFIG)


class Trained:
    """The trained model, its folder and one greedy call the gateway served (with tools)."""

    def __init__(self, model: art.TrainableModel, folder: ModelFolder, call: Any) -> None:
        self.model, self.folder, self.call = model, folder, call


@pytest.fixture(scope="module")
async def backend(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[art.LocalBackend]:
    """A backend whose engine serves in fp32 on every CPU: on one with native bf16 the
    session's would serve bf16, and the fp32 reloads here could not match it token for
    token."""
    path = tmp_path_factory.mktemp("export-art")
    async with art.LocalBackend(path=path, dtype="float32") as local:
        yield local


@pytest.fixture(scope="module")
async def trained(backend: art.LocalBackend) -> Trained:
    torch.manual_seed(0)
    model = art.TrainableModel(name="export-agent", project="export", base_model="tiny-random")
    await model.register(backend)
    await _train_step(model)
    await _train_step(model)
    assert await model.get_step() == 2
    # Metrics by checkpoint: a step-0 record (the base: no checkpoint) is the best of all
    # and must never be picked; of the checkpoints, 1 has the best score and 2 the lowest loss.
    for step, score, loss in ((0, 5.0, 0.1), (1, 0.9, 0.7), (2, 0.3, 0.2), (2, 0.4, 0.2)):
        await model.log(metrics={"val/score": score, "val/loss": loss}, step=step)
    async with art.capture(model) as run:
        await run.openai_client().chat.completions.create(
            model=run.model_name,
            messages=MESSAGES,  # type: ignore[arg-type]
            tools=[WEATHER_TOOL],  # type: ignore[list-item]
            max_tokens=12,
            temperature=0,
        )
    (call,) = run.calls
    assert call.adapter_step == 2
    return Trained(model, backend.model_folder(model), call)


def _greedy(model: Any, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            max_new_tokens=n,
        )
    return [int(t) for t in out[0, len(prompt) :]][:n]


def _logprobs(model: Any, prompt: list[int], completion: list[int]) -> list[float]:
    """Each completion token's logprob (temperature 1), as the sampler records it."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = model(ids).logits[0, :-1].float().log_softmax(-1)
    picked = logp.gather(-1, ids[0, 1:, None])[:, 0]
    return [float(x) for x in picked[len(prompt) - 1 :]]


def _gap(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def base_gap(trained: Trained) -> float:
    """How far the base model's logprobs of the served call are from the served ones: the
    trained adapter must be what makes an export match."""
    from art_core.embedded import resolve_base_model

    base = AutoModelForCausalLM.from_pretrained(resolve_base_model("tiny-random")).eval()
    call = trained.call
    return _gap(_logprobs(base, call.prompt_token_ids, call.completion_token_ids), call.logprobs)


def _ids(encoded: Any) -> list[int]:
    ids = encoded["input_ids"] if not isinstance(encoded, list) else encoded
    return [int(t) for t in ids]


def _leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


async def test_peft_export_loads_with_peft_and_generates_what_the_gateway_served(
    trained: Trained, base_gap: float, tmp_path: Path
) -> None:
    out = tmp_path / "adapter"
    result = await trained.model.export(out, format="peft")
    assert isinstance(result, ExportResult)
    assert (result.path, result.format, result.step) == (out.resolve(), "peft", 2)
    names = sorted(p.name for p in out.iterdir())
    assert {"adapter_model.safetensors", "adapter_config.json", "export.json", "base"} <= set(names)
    assert not {"optimizer.safetensors", "trainer_state.json"} & set(names)
    config = json.loads((out / "adapter_config.json").read_text())
    # tiny-random has no hub id: the base is shipped, named by its final absolute path.
    assert config["base_model_name_or_path"] == str(out.resolve() / "base")
    assert not (out / "base" / ".art-complete").exists()

    base = AutoModelForCausalLM.from_pretrained(config["base_model_name_or_path"])
    model = PeftModel.from_pretrained(base, out).eval()
    call = trained.call
    n = len(call.completion_token_ids)
    assert _greedy(model, call.prompt_token_ids, n) == call.completion_token_ids
    served = _logprobs(model, call.prompt_token_ids, call.completion_token_ids)
    assert _gap(served, call.logprobs) < 1e-3 < base_gap / 10
    # The adapter's tokenizer renders the gateway's prompt too.
    tokenizer = AutoTokenizer.from_pretrained(out)
    rendered = tokenizer.apply_chat_template(
        call.messages, tools=call.tools, add_generation_prompt=True
    )
    assert _ids(rendered) == call.prompt_token_ids
    assert _leftovers(out) == []


async def test_merged_export_generates_the_same_tokens_and_renders_the_same_prompt(
    trained: Trained, base_gap: float, tmp_path: Path
) -> None:
    out = tmp_path / "merged"
    result = export_checkpoint(trained.folder, out, format="merged")
    assert result.step == 2 and result.base_model == "tiny-random"
    assert (out / "model.safetensors").is_file() and not (out / "adapter_config.json").exists()
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    assert model.dtype == torch.float32  # tiny-random's own dtype
    call = trained.call
    n = len(call.completion_token_ids)
    assert _greedy(model, call.prompt_token_ids, n) == call.completion_token_ids
    served = _logprobs(model, call.prompt_token_ids, call.completion_token_ids)
    assert _gap(served, call.logprobs) < 1e-3 < base_gap / 10
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert call.tools == [WEATHER_TOOL]
    rendered = tokenizer.apply_chat_template(
        call.messages, tools=call.tools, add_generation_prompt=True
    )
    assert _ids(rendered) == call.prompt_token_ids
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["format"] == "merged" and manifest["dtype"] == "float32"


def test_export_json_says_what_was_exported_and_from_where(
    trained: Trained, tmp_path: Path
) -> None:
    out = tmp_path / "one"
    result = export_checkpoint(trained.folder, out, step=1)
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["format"] == "peft" and "gguf_type" not in manifest
    assert manifest["step"] == 1 and manifest["selected_by"] == {"how": "step"}
    assert manifest["source"] == {
        "project": "export",
        "name": "export-agent",
        "folder": str(trained.folder.root.resolve()),
        "checkpoint": str(trained.folder.root.resolve() / "checkpoints" / "0001"),
    }
    base = manifest["base_model"]
    assert base["name"] == "tiny-random" and base["hub_id"] is None
    assert (Path(base["path"]) / "config.json").is_file()
    assert base["referenced_as"] == str(out.resolve() / "base")
    # Step 1's records: the training step that sampled from checkpoint 1, and the val log.
    splits = sorted(r["split"] for r in manifest["history"])
    assert "train" in splits and "val" in splits
    assert all(r["step"] == 1 for r in manifest["history"])
    assert manifest["metrics"]["val/score"] == 0.9 and "train/reward" in manifest["metrics"]
    assert result.metrics == manifest["metrics"]
    assert manifest["art_core_version"] and manifest["exported_at"].endswith("+00:00")
    assert "export.json" in manifest["files"] and "adapter_model.safetensors" in manifest["files"]


@pytest.mark.parametrize(
    ("best", "higher", "expected"),
    [("val/score", None, 1), ("val/loss", None, 2), ("val/score", False, 2)],
)
def test_best_picks_the_checkpoint_the_metric_measured(
    trained: Trained, tmp_path: Path, best: str, higher: bool | None, expected: int
) -> None:
    # val/score: 5.0 at step 0 (the base, no checkpoint), 0.9 at 1, 0.4 last at 2.
    out = tmp_path / "best"
    result = export_checkpoint(trained.folder, out, best=best, higher_is_better=higher)
    assert result.step == expected
    selected = json.loads((out / "export.json").read_text())["selected_by"]
    assert selected["how"] == "best" and selected["metric"] == best


def test_refusals_name_the_problem_and_write_nothing(trained: Trained, tmp_path: Path) -> None:
    folder = trained.folder
    out = tmp_path / "x"
    with pytest.raises(FileNotFoundError, match=r"step 7.*checkpointed steps: 1, 2"):
        export_checkpoint(folder, out, step=7)
    with pytest.raises(ValueError, match=r"step must be >= 1"):
        export_checkpoint(folder, out, step=0)
    with pytest.raises(ValueError, match=r"'val/nope' is not in .*val/score"):
        export_checkpoint(folder, out, best="val/nope")
    with pytest.raises(ValueError, match="not both"):
        export_checkpoint(folder, out, step=1, best="val/score")
    with pytest.raises(ValueError, match="unknown export format 'onnx'"):
        export_checkpoint(folder, out, format="onnx")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="checkpoints folder"):
        export_checkpoint(folder, folder.checkpoints / "export")
    with pytest.raises(ValueError, match="holds the model folder"):
        export_checkpoint(folder, folder.root.parent)
    assert not out.exists() and _leftovers(out) == []
    out.mkdir()
    with pytest.raises(FileExistsError, match="overwrite"):
        export_checkpoint(folder, out)
    assert list(out.iterdir()) == []
    empty = tmp_path / "empty-model"
    empty.mkdir()
    (empty / "model.json").write_text(json.dumps({"base_model": "tiny-random"}))
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        export_checkpoint(empty, tmp_path / "y")
    with pytest.raises(FileNotFoundError, match=r"no model\.json"):
        export_checkpoint(tmp_path, tmp_path / "y")


def test_a_failure_mid_export_leaves_nothing_and_overwrite_replaces(
    trained: Trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import art_core.export.merged as merged

    def broken(*_: Any) -> Any:
        raise RuntimeError("merge failed")

    out = tmp_path / "merged"
    with monkeypatch.context() as patch:
        patch.setattr(merged, "merge_adapter", broken)
        with pytest.raises(RuntimeError, match="merge failed"):
            export_checkpoint(trained.folder, out, format="merged")
        assert not out.exists() and _leftovers(out) == []
        # An existing export survives a failed overwrite.
        export_checkpoint(trained.folder, out, step=1)
        with pytest.raises(RuntimeError, match="merge failed"):
            export_checkpoint(trained.folder, out, format="merged", overwrite=True)
    assert json.loads((out / "export.json").read_text())["step"] == 1
    assert _leftovers(out) == []
    export_checkpoint(trained.folder, out, step=2, overwrite=True)
    assert json.loads((out / "export.json").read_text())["step"] == 2
    assert _leftovers(out) == []


def test_cli_exports_and_exits_2_on_a_user_error(trained: Trained, tmp_path: Path) -> None:
    env = {**os.environ}
    command = [sys.executable, "-m", "art_core.cli", "export", str(trained.folder.root)]
    out = tmp_path / "cli"
    done = subprocess.run(
        [*command, "--best", "val/loss", "--lower-is-better", "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    # Lower val/loss is better: 0.2 at step 2 (0.1 at step 0 has no checkpoint).
    assert f"exported step 2 as peft to {out.resolve()}" in done.stdout
    assert json.loads((out / "export.json").read_text())["selected_by"]["higher_is_better"] is False
    again = subprocess.run(
        [*command, "--step", "9", "--out", str(tmp_path / "nine")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert again.returncode == 2
    assert "no complete checkpoint for step 9" in again.stderr
    assert not (tmp_path / "nine").exists()


def test_a_base_with_a_hub_id_is_named_not_shipped(trained: Trained, tmp_path: Path) -> None:
    from art_core.embedded import resolve_base_model
    from art_core.export.peft_export import write_peft
    from art_core.export.source import HUB_IDS, SourceModel

    source = SourceModel(
        folder=trained.folder,
        project="export",
        name="export-agent",
        base_model="smollm2-135m",
        base_path=resolve_base_model("tiny-random"),  # stands in: only its tokenizer is read
        hub_id=HUB_IDS["smollm2-135m"],
    )
    staging = tmp_path / "staging"
    staging.mkdir()
    ref = write_peft(trained.folder.checkpoint(1), source, staging, tmp_path / "final")
    assert ref == "HuggingFaceTB/SmolLM2-135M-Instruct"
    config = json.loads((staging / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == ref
    assert not (staging / "base").exists()


def test_gguf_merges_in_a_scratch_folder_and_hands_it_to_the_writer(
    trained: Trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import types

    seen: dict[str, Any] = {}

    def write_gguf(merged_folder: Path, out_dir: Path, *, gguf_type: str, model_name: str) -> Path:
        seen.update(files=sorted(p.name for p in merged_folder.iterdir()), type=gguf_type)
        (out_dir / "Modelfile").write_text(f"FROM ./{model_name}.gguf\n")
        path = out_dir / f"{model_name}.gguf"
        path.write_bytes(b"GGUF")
        return path

    fake = types.ModuleType("art_core.export.gguf")
    fake.write_gguf = write_gguf  # type: ignore[attr-defined]
    fake.SUPPORTED_TYPES = ("f16", "q8_0")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "art_core.export.gguf", fake)
    out = tmp_path / "gguf"
    result = export_checkpoint(trained.folder, out, format="gguf", step=2, gguf_type="q8_0")
    assert result.format == "gguf" and seen["type"] == "q8_0"
    assert "model.safetensors" in seen["files"] and "chat_template.jinja" in seen["files"]
    assert sorted(p.name for p in out.iterdir()) == [
        "Modelfile",
        "export-agent-step2.gguf",
        "export.json",
    ]
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["gguf_type"] == "q8_0" and manifest["gguf_file"] == "export-agent-step2.gguf"
    assert _leftovers(out) == []


def test_gguf_export_with_the_real_writer(trained: Trained, tmp_path: Path) -> None:
    out = tmp_path / "gguf-real"
    result = export_checkpoint(trained.folder, out, format="gguf")
    names = sorted(p.name for p in out.iterdir())
    assert names == ["Modelfile", "export-agent-step2.gguf", "export.json"]
    assert (out / "export-agent-step2.gguf").read_bytes()[:4] == b"GGUF"
    assert result.step == 2
    assert json.loads((out / "export.json").read_text())["gguf_type"] == "f16"
    assert _leftovers(out) == []
    with pytest.raises(ValueError, match="unknown gguf_type 'q3'"):
        export_checkpoint(trained.folder, tmp_path / "q3", format="gguf", gguf_type="q3")
