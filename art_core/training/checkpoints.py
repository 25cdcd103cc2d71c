"""Checkpoint folders: ``checkpoints/{step:04d}/`` with adapter, optimizer and trainer state.

A checkpoint folder holds:

- ``adapter_config.json`` + ``adapter_model.safetensors``: a standard PEFT adapter folder, so
  an engine loads it with ``PeftModel.from_pretrained`` / ``load_adapter`` directly;
- ``optimizer.safetensors``: the optimizer's state tensors, flattened to ``state.{i}.{name}``;
- ``trainer_state.json``: the step, the optimizer's hyperparameters and the names of the
  parameters it optimizes (so a resume can check it matches the adapter).

No pickle: ``torch.save`` of an optimizer would be one, and loading a pickle runs code. The
folder is written under a temporary name and renamed into place, so a listed checkpoint is
always complete.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from art_core.files import atomic_write_text
from art_core.model_folder import OPTIMIZER_STATE_FILE, TRAINER_STATE_FILE, ModelFolder

FORMAT_VERSION = 1


def optimizer_state_to_safetensors(
    optimizer: torch.optim.Optimizer | dict[str, Any],
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split an optimizer's ``state_dict`` (or the state dict itself) into tensors (for
    safetensors) and JSON.

    Example:
        >>> p = torch.nn.Parameter(torch.ones(2))
        >>> opt = torch.optim.AdamW([p]); p.sum().backward(); opt.step()
        >>> tensors, meta = optimizer_state_to_safetensors(opt)
        >>> sorted(tensors)
        ['state.0.exp_avg', 'state.0.exp_avg_sq', 'state.0.step']
    """
    state_dict = optimizer if isinstance(optimizer, dict) else optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for index, param_state in state_dict["state"].items():
        for name, value in param_state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{index}.{name}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(index), {})[name] = value
    meta = {"param_groups": state_dict["param_groups"], "scalar_state": scalars}
    return tensors, json.loads(json.dumps(meta))  # tuples (betas) become lists: plain JSON


def optimizer_state_from_safetensors(
    tensors: dict[str, torch.Tensor], meta: dict[str, Any]
) -> dict[str, Any]:
    """Rebuild the ``state_dict`` that ``optimizer_state_to_safetensors`` split."""
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        prefix, index, name = key.split(".", 2)
        if prefix != "state":
            raise ValueError(f"unexpected tensor {key!r} in the optimizer state")
        state.setdefault(int(index), {})[name] = value
    for index, values in meta.get("scalar_state", {}).items():
        state.setdefault(int(index), {}).update(values)
    groups = []
    for group in meta["param_groups"]:
        group = dict(group)
        if isinstance(group.get("betas"), list):
            group["betas"] = tuple(group["betas"])
        groups.append(group)
    return {"state": state, "param_groups": groups}


def save_checkpoint(
    folder: ModelFolder,
    step: int,
    *,
    save_adapter: Callable[[Path], None],
    optimizer: torch.optim.Optimizer | dict[str, Any],
    param_names: list[str],
    extra_state: dict[str, Any],
) -> Path:
    """Write checkpoint ``step`` atomically and return its folder.

    ``save_adapter(folder)`` writes the PEFT adapter (``model.save_pretrained``).

    An existing checkpoint is never overwritten (``FileExistsError``); an incomplete folder
    with this step's name is set aside first (``ModelFolder.set_aside_incomplete``).

    Example:
        >>> save_checkpoint(ModelFolder(Path("m")), 1, save_adapter=model.save_pretrained,
        ...                 optimizer=opt, param_names=names, extra_state={})  # fragment: a loaded `model`, its `opt`imizer and parameter `names`  # doctest: +SKIP
        PosixPath('m/checkpoints/0001')
    """
    staging = stage_checkpoint(
        folder,
        step,
        save_adapter=save_adapter,
        optimizer=optimizer,
        param_names=param_names,
        extra_state=extra_state,
    )
    return commit_checkpoint(folder, step, staging)


def stage_checkpoint(
    folder: ModelFolder,
    step: int,
    *,
    save_adapter: Callable[[Path], None],
    optimizer: torch.optim.Optimizer | dict[str, Any],
    param_names: list[str],
    extra_state: dict[str, Any],
) -> Path:
    """Write checkpoint ``step``'s files into a new hidden folder beside the checkpoints and
    return it; nothing is a checkpoint until ``commit_checkpoint`` renames it into place.

    ``optimizer`` is the optimizer or its (full, unsharded) ``state_dict``. Data-parallel
    training stages on rank 0 and commits only once every rank has finished the step.
    """
    target = folder.checkpoint(step)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{step:04d}-", dir=target.parent))
    try:
        save_adapter(staging)
        tensors, meta = optimizer_state_to_safetensors(optimizer)
        save_file(tensors, str(staging / OPTIMIZER_STATE_FILE), metadata={"format": "pt"})
        state = {
            "format_version": FORMAT_VERSION,
            "step": step,
            "param_names": param_names,
            "optimizer": meta,
            **extra_state,
        }
        atomic_write_text(
            staging / TRAINER_STATE_FILE, json.dumps(state, indent=2, allow_nan=False)
        )
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging


def commit_checkpoint(folder: ModelFolder, step: int, staging: Path) -> Path:
    """Rename a staged checkpoint (``stage_checkpoint``) into place as checkpoint ``step``.

    The staging folder is removed whatever happens; a complete checkpoint ``step`` is never
    overwritten (``FileExistsError``).
    """
    target = folder.checkpoint(step)
    try:
        if not folder.is_complete(staging):
            raise FileNotFoundError(f"{staging} is not a complete staged checkpoint")
        if target.exists() and not folder.is_complete(target):
            folder.set_aside_incomplete()
        if target.exists():
            raise FileExistsError(f"{target} exists already; checkpoints are never overwritten")
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def read_trainer_state(folder: Path) -> dict[str, Any]:
    """The ``trainer_state.json`` of a checkpoint folder."""
    state: dict[str, Any] = json.loads((folder / TRAINER_STATE_FILE).read_text(encoding="utf-8"))
    if state.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{folder} has checkpoint format {state.get('format_version')!r}; this version of "
            f"art_core reads format {FORMAT_VERSION}"
        )
    return state


def load_optimizer_state(
    folder: Path, optimizer: torch.optim.Optimizer, param_names: list[str]
) -> dict[str, Any]:
    """Load a checkpoint's optimizer state into ``optimizer``; return its trainer state.

    ``param_names`` are the names of the parameters ``optimizer`` was built with, in order;
    they must match the checkpoint's, otherwise state would land on the wrong tensors.
    """
    state = read_trainer_state(folder)
    if state["param_names"] != param_names:
        raise ValueError(
            f"the optimizer state in {folder} is for different parameters than this adapter "
            f"({len(state['param_names'])} saved, {len(param_names)} now); was the LoRA "
            "configuration changed?"
        )
    tensors = load_file(str(folder / OPTIMIZER_STATE_FILE))
    optimizer.load_state_dict(optimizer_state_from_safetensors(tensors, state["optimizer"]))
    return state


def steps_to_delete(
    steps: list[int],
    history: list[dict[str, Any]],
    metric: str,
    *,
    higher_is_better: bool,
) -> list[int]:
    """Checkpoints to delete so that only the latest and the best (by ``metric``) remain.

    The best is looked up in the history records of the checkpointed steps (the last record
    of a step with the metric wins); when no checkpointed step has the metric, only the
    latest is kept.

    Example:
        >>> hist = [{"step": 0, "r": 0.1}, {"step": 1, "r": 0.9}, {"step": 2, "r": 0.5}]
        >>> steps_to_delete([0, 1, 2, 3], hist, "r", higher_is_better=True)
        [0, 2]
    """
    if not steps:
        return []
    values: dict[int, float] = {}
    for record in history:
        step, value = record.get("step"), record.get(metric)
        if isinstance(step, int) and step in steps and isinstance(value, int | float):
            values[step] = float(value)
    keep = {max(steps)}
    if values:
        sign = 1.0 if higher_is_better else -1.0
        # Ties go to the later step: it has trained on more data.
        keep.add(max(values, key=lambda s: (sign * values[s], s)))
    return [step for step in steps if step not in keep]
