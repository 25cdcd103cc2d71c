"""``export_checkpoint``: one checkpoint of a trained model, as a folder to take anywhere."""

from __future__ import annotations

import fnmatch
import functools
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from art_core.export.manifest import write_manifest
from art_core.export.merged import write_merged
from art_core.export.peft_export import NOT_COPIED, WEIGHT_SUFFIXES, write_peft
from art_core.export.select import Choice, choose_checkpoint, history_at, metrics_of
from art_core.export.source import SourceModel, default_art_path, open_source, resolve_source
from art_core.export.staging import build_atomically, check_out, final_path, scratch_dir
from art_core.model_folder import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, ModelFolder

ExportFormat = Literal["peft", "merged", "gguf"]
FORMATS: tuple[str, ...] = get_args(ExportFormat)


@dataclass(frozen=True)
class ExportResult:
    """What ``export_checkpoint`` wrote: the folder, its format, the checkpoint's step, the
    base model (its hub id, else the name it was trained from) and the history metrics
    recorded at that step."""

    path: Path
    format: str
    step: int
    base_model: str
    metrics: dict[str, Any] = field(default_factory=dict)


# What an export holds besides the adapter and the base's files (manifest, tokenizer
# re-saved, tar headers and padding), per file and in all: a generous allowance.
_TAR_BYTES_PER_FILE = 2048
_EXTRA_BYTES = 1 << 20


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _relative(path: Path, folder: Path) -> str | None:
    """``path`` relative to ``folder`` (POSIX), None when it is not inside it."""
    return path.relative_to(folder).as_posix() if _inside(path, folder) else None


def _check_format(format: str, gguf_type: str) -> None:
    if format not in FORMATS:
        raise ValueError(f"unknown export format {format!r}: use one of {', '.join(FORMATS)}")
    if format == "gguf":
        from art_core.export.gguf import SUPPORTED_TYPES  # numpy and gguf: only for a GGUF

        if gguf_type not in SUPPORTED_TYPES:
            raise ValueError(
                f"unknown gguf_type {gguf_type!r}: use one of {', '.join(SUPPORTED_TYPES)}"
            )


def _files(folder: Path) -> list[Path]:
    """The regular files under ``folder`` an export would copy (no cache bookkeeping)."""
    return [
        p
        for p in folder.rglob("*")
        if p.is_file()
        and not p.is_symlink()
        and not any(fnmatch.fnmatch(p.name, x) for x in NOT_COPIED)
    ]


def estimate_export_bytes(
    model_dir: str | Path | ModelFolder,
    *,
    format: ExportFormat = "peft",
    step: int | None = None,
    best: str | None = None,
    higher_is_better: bool | None = None,
    art_path: str | Path | None = None,
    gguf_type: str = "f16",
) -> int:
    """The most disk an export of these arguments takes while it is built and packed as one
    tar (``art-core serve``'s scratch), from file sizes only: nothing is loaded or written.

    One copy of the export is the checkpoint's adapter files plus the base model's files
    (a PEFT export copies them into ``base/``; a merged model or a GGUF holds the base's
    weights, in the base's own dtype or smaller) plus an allowance for the manifest, the
    tokenizer and the tar's headers; a PEFT export whose base has a hub id ships only the
    base's non-weight files (tokenizer, config); an f32 GGUF counts the base twice (a 16-bit
    base doubles). The peak is two copies: the folder and its tar exist together while
    packing (for a GGUF, the merged model and the GGUF file).
    Raises what ``export_checkpoint`` raises for a bad format, step or metric.

    Example:
        >>> estimate_export_bytes(".art/demo/models/agent-001", format="merged")  # needs files: a trained model folder  # doctest: +SKIP
        30150656
    """
    _check_format(format, gguf_type)
    folder, meta = open_source(model_dir)
    choice = choose_checkpoint(folder, step=step, best=best, higher_is_better=higher_is_better)
    source = resolve_source(
        folder, meta, Path(art_path) if art_path is not None else default_art_path(folder)
    )
    checkpoint = folder.checkpoint(choice.step)
    adapter = [checkpoint / ADAPTER_WEIGHTS_FILE, checkpoint / ADAPTER_CONFIG_FILE]
    base = _files(source.base_path)
    if format == "peft" and source.hub_id is not None:
        base = [p for p in base if p.suffix not in WEIGHT_SUFFIXES]
    base_bytes = sum(p.stat().st_size + _TAR_BYTES_PER_FILE for p in base)
    if format == "gguf" and gguf_type == "f32":
        base_bytes *= 2  # a 16-bit base written as f32 doubles
    one_copy = _EXTRA_BYTES + base_bytes
    one_copy += sum(p.stat().st_size + _TAR_BYTES_PER_FILE for p in adapter if p.is_file())
    return 2 * one_copy


def export_checkpoint(
    model_dir: str | Path | ModelFolder,
    out: str | Path,
    *,
    format: ExportFormat = "peft",
    step: int | None = None,
    best: str | None = None,
    higher_is_better: bool | None = None,
    overwrite: bool = False,
    art_path: str | Path | None = None,
    gguf_type: str = "f16",
    portable: bool = False,
) -> ExportResult:
    """Export one checkpoint of the model in ``model_dir`` to the folder ``out``.

    ``format``: ``"peft"`` (the LoRA adapter, loadable with ``PeftModel.from_pretrained``;
    the base is named by its hub id, else copied into ``out/base``), ``"merged"`` (the base
    with the adapter merged in, a plain Hugging Face model with the gateway's tokenizer and
    chat template) or ``"gguf"`` (that merged model as ``{name}.gguf`` plus a ``Modelfile``,
    in ``gguf_type``). The checkpoint: ``step``, else the best by the history metric
    ``best`` (higher is better unless its name contains "loss", or as ``higher_is_better``
    says), else the latest. ``art_path`` (default: the art folder ``model_dir`` lives in)
    is where embedded base models are cached. Every export holds an ``export.json``.
    ``portable`` (what ``art-core serve`` sends): the export names no path of this machine;
    the manifest's paths are relative (see ``art_core.export.manifest``) and a PEFT adapter
    names its copied base as ``base``, for the receiver to relocate.

    The folder is built beside ``out`` and renamed into place: a failure leaves nothing at
    ``out``; an existing ``out`` is refused unless ``overwrite``. Blocking (torch work):
    from async code use ``asyncio.to_thread`` (``await model.export(...)`` does).

    Raises ``ValueError`` (a bad format, step or metric, ``out`` inside the model folder,
    both ``step`` and ``best``), ``FileNotFoundError`` (no model folder, no such checkpoint)
    and ``FileExistsError`` (``out`` exists), each naming the problem.

    Example:
        >>> result = export_checkpoint(".art/demo/models/agent-001", "exports/agent",
        ...                            format="merged", best="val/reward")  # needs files: a trained model folder  # doctest: +SKIP
        >>> result.step, result.path  # needs files  # doctest: +SKIP
        (3, PosixPath('/home/me/exports/agent'))
    """
    _check_format(format, gguf_type)
    folder, meta = open_source(model_dir)
    target = final_path(out)
    _check_target(target, folder)
    choice = choose_checkpoint(folder, step=step, best=best, higher_is_better=higher_is_better)
    check_out(target, overwrite)
    art_path = Path(art_path) if art_path is not None else default_art_path(folder)
    source = resolve_source(folder, meta, art_path)
    checkpoint = folder.checkpoint(choice.step)
    manifest = _manifest(
        source, folder, checkpoint, choice, art_path.expanduser().resolve(), portable=portable
    )
    build = functools.partial(
        _write_export,
        format,
        checkpoint,
        source,
        target=target,
        manifest=manifest,
        gguf_type=gguf_type,
        gguf_name=f"{source.name}-step{choice.step}",
        portable=portable,
    )
    build_atomically(target, build, overwrite=overwrite)
    return ExportResult(
        path=target,
        format=format,
        step=choice.step,
        base_model=source.hub_id or source.base_model,
        metrics=manifest["metrics"],
    )


def _check_target(target: Path, folder: ModelFolder) -> None:
    """``out`` may neither lie inside the model's checkpoints nor hold the model folder."""
    if _inside(target, folder.checkpoints):
        raise ValueError(f"out ({target}) must not be inside the model's checkpoints folder")
    if _inside(folder.root, target):
        raise ValueError(f"out ({target}) is or holds the model folder {folder.root}")


def _manifest(
    source: SourceModel,
    folder: ModelFolder,
    checkpoint: Path,
    choice: Choice,
    art_root: Path,
    *,
    portable: bool,
) -> dict[str, Any]:
    """The manifest's entries after the format's: the source (relative paths when
    ``portable``), the checkpoint chosen, the base model and the history up to the step."""
    base_json = source.base_json()
    source_json: dict[str, Any] = {**source.as_json(), "checkpoint": str(checkpoint)}
    if portable:
        # Relative names only: the art folder, the model folder and the scratch folder of
        # the machine that built the export are nobody else's business.
        source_json["folder"] = _relative(folder.root, art_root)
        source_json["checkpoint"] = _relative(checkpoint, folder.root)
        base_json["path"] = _relative(source.base_path.resolve(), art_root)
    records = history_at(folder, choice.step)
    return {
        "source": source_json,
        "step": choice.step,
        "selected_by": choice.as_json(),
        "base_model": base_json,
        "metrics": metrics_of(records),
        "history": records,
    }


def _write_export(
    format: ExportFormat,
    checkpoint: Path,
    source: SourceModel,
    staging: Path,
    *,
    target: Path,
    manifest: dict[str, Any],
    gguf_type: str,
    gguf_name: str,
    portable: bool,
) -> None:
    """Write the export's files in ``format`` into ``staging``, then its ``export.json``:
    ``manifest`` after the format-specific entries (a PEFT export records in its
    ``base_model`` entry how it names its base)."""
    extra: dict[str, Any] = {}
    if format == "peft":
        manifest["base_model"]["referenced_as"] = write_peft(
            checkpoint, source, staging, target, portable=portable
        )
    elif format == "merged":
        extra["dtype"] = write_merged(checkpoint, source.base_path, staging)
    else:
        extra["gguf_type"] = gguf_type
        extra["gguf_file"] = _write_gguf(
            checkpoint, source.base_path, staging, target, gguf_type, gguf_name
        )
    write_manifest(staging, {"format": format, **extra, **manifest})


def _write_gguf(
    checkpoint: Path, base_path: Path, staging: Path, target: Path, gguf_type: str, name: str
) -> str:
    """The merged model, built in a scratch folder beside ``target``, written as GGUF into
    ``staging``; returns the GGUF file's name."""
    # Written alongside this module; imported only when a GGUF is asked for.
    from art_core.export.gguf import write_gguf

    scratch = scratch_dir(target, "merged")
    try:
        write_merged(checkpoint, base_path, scratch)
        written = write_gguf(scratch, staging, gguf_type=gguf_type, model_name=name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return Path(written).name
