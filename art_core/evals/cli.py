"""``art-core eval PROJECT NAME --rollout MODULE:FUNCTION --tasks FILE.jsonl``: score a
trained model at chosen steps (``evaluate``), print the table and record it in the history."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from art_core.backends.local import LocalBackend
from art_core.evals.evaluate import BEST, LATEST, EvalReport, evaluate, parse_steps
from art_core.files import jsonl_lines
from art_core.model import TrainableModel
from art_core.model_folder import ModelFolder

# A task file is read whole: past this size it is refused rather than filling memory.
MAX_TASK_FILE_BYTES = 64 * 1024 * 1024


class InputError(ValueError):
    """An input of the command that is wrong (reported with exit status 2)."""


def read_tasks(path: str | Path) -> list[dict[str, Any]]:
    """The tasks of a JSONL file, one JSON object per line (blank lines skipped).

    Example:
        >>> read_tasks("/nonexistent.jsonl")
        Traceback (most recent call last):
        ...
        art_core.evals.cli.InputError: task file /nonexistent.jsonl does not exist
    """
    file = Path(path)
    if not file.is_file():
        raise InputError(f"task file {file} does not exist")
    size = file.stat().st_size
    if size > MAX_TASK_FILE_BYTES:
        raise InputError(
            f"task file {file} is {size} bytes, over the {MAX_TASK_FILE_BYTES} this command reads"
        )
    tasks = []
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"task file {file} is not UTF-8 text ({exc.reason})") from None
    for number, line in enumerate(jsonl_lines(text), start=1):
        if not line.strip():
            continue
        try:
            task = json.loads(line)
        except ValueError as exc:
            raise InputError(f"{file}:{number} is not valid JSON ({exc})") from None
        if not isinstance(task, dict):
            raise InputError(f"{file}:{number} is a JSON {type(task).__name__}, not an object")
        tasks.append(task)
    if not tasks:
        raise InputError(f"task file {file} holds no task")
    return tasks


def load_rollout(spec: str) -> Callable[..., Any]:
    """The function ``MODULE:FUNCTION`` names (the current folder importable, as for
    ``python -m``): ``async def rollout(model, task: dict) -> art.Trajectory``.

    Example:
        >>> load_rollout("no_such_module_here:rollout")
        Traceback (most recent call last):
        ...
        art_core.evals.cli.InputError: --rollout no_such_module_here:rollout: module 'no_such_module_here' not found
    """
    module_name, _, function_name = spec.partition(":")
    if not module_name or not function_name:
        raise InputError(f"--rollout takes MODULE:FUNCTION, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise InputError(f"--rollout {spec}: module {module_name!r} not found") from None
        raise
    function = getattr(module, function_name, None)
    if function is None:
        raise InputError(f"--rollout {spec}: module {module_name!r} has no {function_name!r}")
    if not inspect.iscoroutinefunction(function):
        raise InputError(
            f"--rollout {spec} is not an async function: "
            "`async def rollout(model, task: dict) -> art.Trajectory`"
        )
    return function


def _base_model(folder: ModelFolder, given: str | None, project: str, name: str) -> str:
    if not folder.model_json.is_file():
        raise InputError(
            f"no model {name!r} in project {project!r} under {folder.root.parents[2]} "
            f"({folder.model_json} does not exist)"
        )
    try:
        saved = json.loads(folder.model_json.read_text(encoding="utf-8")).get("base_model")
    except (ValueError, AttributeError):
        saved = None
    if given is not None:
        if saved is not None and saved != given:
            raise InputError(f"{name!r} was trained from {saved!r}, not --base-model {given!r}")
        return given
    if not isinstance(saved, str):
        raise InputError(f"{folder.model_json} names no base_model: give --base-model")
    return saved


def _check_steps(labels: list[str], folder: ModelFolder, select_tasks: object) -> None:
    steps = [0, *folder.checkpoint_steps()]
    for label in labels:
        if label not in (LATEST, BEST) and int(label) not in steps:
            raise InputError(f"--steps: step {label} has no checkpoint; steps there: {steps}")
    if BEST in labels and select_tasks is None:
        raise InputError(
            "--steps best needs --select-tasks FILE.jsonl (the best step is chosen on them)"
        )


async def _run(
    args: argparse.Namespace,
    tasks: list[dict[str, Any]],
    select: list[dict[str, Any]] | None,
    rollout: Callable[..., Any],
    base_model: str,
) -> EvalReport:
    backend = LocalBackend(path=args.path)
    try:
        model = TrainableModel(name=args.name, project=args.project, base_model=base_model)
        await model.register(backend)
        return await evaluate(
            model,
            rollout,
            tasks,
            steps=parse_steps(args.steps.split(",")),
            runs_per_task=args.runs_per_task,
            k=args.k,
            solve_threshold=args.solve_threshold,
            select_tasks=select,
            split=args.split,
            select_split=args.select_split,
            seed=args.seed,
        )
    finally:
        await backend.close()


def run(args: argparse.Namespace) -> int:
    """Evaluate as ``args`` say; a wrong input prints what was wrong and returns 2."""
    try:
        labels = parse_steps(args.steps.split(","))
        folder = ModelFolder.of(args.path, args.project, args.name)
        base_model = _base_model(folder, args.base_model, args.project, args.name)
        tasks = read_tasks(args.tasks)
        select = read_tasks(args.select_tasks) if args.select_tasks else None
        _check_steps(labels, folder, select)
        if any(not 1 <= k <= args.runs_per_task for k in args.k):
            raise InputError(f"--k: each k must be in 1..--runs-per-task ({args.runs_per_task})")
        rollout = load_rollout(args.rollout)
        report = asyncio.run(_run(args, tasks, select, rollout, base_model))
    except ValueError as exc:  # InputError, and evaluate's own checks
        print(f"art-core eval: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # e.g. runs served by another step than the one evaluated
        print(f"art-core eval: {exc}", file=sys.stderr)
        return 1
    print(report.table())
    if report.records:
        print(f"recorded in {folder.history}")
    return 0


def _ints(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``eval`` with the ``art-core`` command line."""
    parser = subparsers.add_parser(
        "eval",
        help="score a trained model at chosen steps, with 95%% bootstrap intervals",
        description="Run a rollout function on a task set against chosen checkpoint steps "
        "and report mean reward, solve rate and pass@k, each with a 95% bootstrap interval "
        "resampled by task, plus tokens and tool errors per run; the results are appended to "
        "the model's history.jsonl (split 'eval').",
    )
    parser.add_argument("project")
    parser.add_argument("name", help="the model's name")
    parser.add_argument(
        "--rollout",
        required=True,
        metavar="MODULE:FUNCTION",
        help="async def rollout(model, task: dict) -> art.Trajectory (reward set)",
    )
    parser.add_argument("--tasks", required=True, help="JSONL: one task (JSON object) per line")
    parser.add_argument(
        "--select-tasks", default=None, help="JSONL tasks on which 'best' is chosen (another split)"
    )
    parser.add_argument(
        "--steps", default="0,latest", help="comma-separated: 0, latest, best, step numbers"
    )
    parser.add_argument("--runs-per-task", type=int, default=4)
    parser.add_argument("--k", type=_ints, default=[1], help="pass@k for these k (e.g. 1,4)")
    parser.add_argument(
        "--solve-threshold", type=float, default=1.0, help="a run solved its task at this reward"
    )
    parser.add_argument("--split", default="test", help="the name of --tasks' split")
    parser.add_argument("--select-split", default="val", help="the name of --select-tasks' split")
    parser.add_argument("--seed", type=int, default=0, help="the bootstrap's seed")
    parser.add_argument("--path", default=".art", help="the art folder (default .art)")
    parser.add_argument(
        "--base-model", default=None, help="default: the one the model's model.json names"
    )
    parser.set_defaults(func=run)
