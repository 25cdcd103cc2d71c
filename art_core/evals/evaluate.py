"""``evaluate``: score a model at chosen checkpoint steps on a task set, with intervals.

Each chosen step is served in turn, the user's rollout function runs unchanged on every
task ``runs_per_task`` times, and the rewards are summarized per task (``stats``): mean
reward, solve rate and pass@k, each with a 95% bootstrap interval resampled by task, plus
completion tokens and tool errors per run. One record per evaluated step goes to the model's
``history.jsonl`` (``split: "eval"``), where the viewer reads it.

Serving a step: the checkpoint's adapter is loaded (when the engine does not hold it) and
every rollout opened meanwhile calls it by name, ``NAME@STEP`` (``capture.pin_step``), step
0 being the base model; what the engine served by default before is served again after.
Every recorded call says which adapter step served it: a run served by another step (a
rollout function that names the model itself instead of using ``run.model_name``) stops the
eval with an error rather than scoring the wrong model.

``best`` is the step with the highest mean reward on a selection task set (another split):
choosing it on the tasks it is reported on would report the luck of the choice as skill.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from art_core.capture import pin_step
from art_core.evals.stats import DEFAULT_RESAMPLES, Estimate, TaskSummary, summarize
from art_core.metrics import hooks as metric_hooks
from art_core.names import check_name
from art_core.trajectories import Trajectory

if TYPE_CHECKING:
    from art_core.engines.base import Engine
    from art_core.model import TrainableModel
    from art_core.model_folder import ModelFolder

Task = Mapping[str, Any]
RolloutFn = Callable[[Any, Any], Awaitable[Trajectory]]

LATEST = "latest"
BEST = "best"
# When one step answers several labels (latest is also best), its one record carries the
# most telling: "best" says more than "latest", which says more than its number.
_LABEL_ORDER = (BEST, LATEST)


def parse_steps(steps: Iterable[str | int]) -> list[str]:
    """The step labels asked for, checked: ``"0"``, ``"latest"``, ``"best"`` or a step number.

    Example:
        >>> parse_steps(["0", "latest", 3, " best "])
        ['0', 'latest', '3', 'best']
    """
    labels: list[str] = []
    for step in steps:
        label = str(step).strip().lower()
        if label not in (LATEST, BEST) and not (label.isascii() and label.isdigit()):
            raise ValueError(f"a step is 0, latest, best or a step number, got {step!r}")
        label = label if label in (LATEST, BEST) else str(int(label))
        if label not in labels:
            labels.append(label)
    if not labels:
        raise ValueError("no step to evaluate")
    return labels


@dataclass(frozen=True)
class StepScore:
    """The eval of one step on one split."""

    step: int
    split: str
    labels: tuple[str, ...]
    summary: TaskSummary
    tokens_per_run: float
    tool_errors_per_run: float
    failed_runs: int

    @property
    def label(self) -> str:
        """The label of this step's history record (``best`` > ``latest`` > its number)."""
        for label in _LABEL_ORDER:
            if label in self.labels:
                return label
        return self.labels[0] if self.labels else str(self.step)

    def record(self, *, now: float | None = None) -> dict[str, Any]:
        """This score as a ``history.jsonl`` record (``split: "eval"``).

        Example:
            >>> from art_core.evals.stats import summarize
            >>> score = StepScore(2, "test", ("latest",), summarize([[1.0], [0.0]]), 3.0, 0.0, 0)
            >>> record = score.record(now=0.0)
            >>> record["eval_label"], record["eval/mean_reward"], record["eval/pass@1_high"]
            ('latest', 0.5, 1.0)
        """
        summary = self.summary
        record: dict[str, Any] = {
            "split": "eval",
            "step": self.step,
            "time": time.time() if now is None else now,
            "eval_split": self.split,
            "eval_label": self.label,
            "tasks": summary.tasks,
            "runs": summary.runs,
        }
        named = [("mean_reward", summary.mean_reward), ("solve_rate", summary.solve_rate)]
        named += [(f"pass@{k}", value) for k, value in summary.pass_at.items()]
        for name, value in named:
            record[f"eval/{name}"] = value.value
            record[f"eval/{name}_low"] = value.low
            record[f"eval/{name}_high"] = value.high
        record["eval/tokens_per_run"] = self.tokens_per_run
        record["eval/tool_errors_per_run"] = self.tool_errors_per_run
        record["eval/failed_runs"] = self.failed_runs
        return record


@dataclass
class EvalReport:
    """What ``evaluate`` measured: the reported steps (in the order asked) and, when ``best``
    was asked, every checkpoint's score on the selection split it was chosen on."""

    model: str
    split: str
    scores: list[StepScore]
    select_split: str | None = None
    selection: list[StepScore] = field(default_factory=list)
    best_step: int | None = None
    records: list[dict[str, Any]] = field(default_factory=list)

    def score(self, label: str | int) -> StepScore:
        """The reported score of a label (``"latest"``, ``"best"``, ``"0"``, ``3``).

        Example:
            >>> from art_core.evals.stats import summarize
            >>> score = StepScore(3, "test", ("latest", "best"), summarize([[1.0, 1.0], [1.0, 0.0]]), 5.0, 0.5, 0)
            >>> report = EvalReport("agent", "test", [score])
            >>> report.score("best").summary.mean_reward  # with its 95% interval
            Estimate(value=0.75, low=0.5, high=1.0)
        """
        wanted = parse_steps([label])[0]
        for score in self.scores:
            if wanted in score.labels:
                return score
        raise KeyError(f"step {label!r} was not evaluated; evaluated: {self.labels()}")

    def labels(self) -> list[str]:
        return [label for score in self.scores for label in score.labels]

    def table(self) -> str:
        """Every number with its 95% interval, one line per step.

        Example:
            >>> from art_core.evals.stats import summarize
            >>> score = StepScore(0, "test", ("0",), summarize([[1.0, 0.0], [0.0, 0.0]]), 5.0, 0.5, 1)
            >>> print(EvalReport("agent", "test", [score]).table())  # doctest: +NORMALIZE_WHITESPACE
            eval of agent on test: 2 tasks x 2 runs (95% bootstrap intervals, resampled by task)
            step  label  mean reward           solve rate            pass@1                tokens/run  tool errors/run  failed runs
            0     0      0.250 [0.000, 0.500]  0.250 [0.000, 0.500]  0.250 [0.000, 0.500]  5.0         0.50             1
        """
        lines = []
        if self.scores:
            first = self.scores[0].summary
            runs = first.runs // first.tasks
            lines.append(
                f"eval of {self.model} on {self.split}: {first.tasks} tasks x {runs} runs "
                "(95% bootstrap intervals, resampled by task)"
            )
            lines += _score_lines(self.scores)
        if self.selection:
            lines.append(
                f"best = step {self.best_step}, chosen by mean reward on {self.select_split} "
                f"(not on {self.split}):"
            )
            lines += _score_lines(self.selection)
        return "\n".join(lines)


def _score_lines(scores: Sequence[StepScore]) -> list[str]:
    ks = sorted({k for score in scores for k in score.summary.pass_at})
    header = ["step", "label", "mean reward", "solve rate", *(f"pass@{k}" for k in ks)]
    header += ["tokens/run", "tool errors/run", "failed runs"]
    rows = []
    for score in scores:
        summary = score.summary
        passes = [str(summary.pass_at[k]) if k in summary.pass_at else "-" for k in ks]
        rows.append(
            [
                str(score.step),
                ",".join(score.labels) or "-",
                str(summary.mean_reward),
                str(summary.solve_rate),
                *passes,
                f"{score.tokens_per_run:.1f}",
                f"{score.tool_errors_per_run:.2f}",
                str(score.failed_runs),
            ]
        )
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]


async def evaluate(
    model: TrainableModel,
    rollout_fn: RolloutFn,
    tasks: Sequence[Task],
    *,
    steps: Iterable[str | int] = ("0", LATEST),
    runs_per_task: int = 4,
    k: Iterable[int] = (1,),
    solve_threshold: float = 1.0,
    select_tasks: Sequence[Task] | None = None,
    split: str = "test",
    select_split: str = "val",
    seed: int = 0,
    resamples: int = DEFAULT_RESAMPLES,
    max_concurrent: int = 32,
    record: bool = True,
) -> EvalReport:
    """Score ``model`` at ``steps`` (``"0"``: the base model, ``"latest"``, ``"best"``, or step
    numbers with a checkpoint) on ``tasks``: ``rollout_fn(model, task)`` runs
    ``runs_per_task`` times per task against each step, unchanged (it opens
    ``art.capture(model)`` and calls ``run.model_name``).

    A run solved its task when its reward is at least ``solve_threshold``; a run that raised
    counts as reward 0 and unsolved (dropping it would flatter a model whose answers break
    the agent) and is counted in ``failed_runs``. ``best`` is chosen by mean reward on
    ``select_tasks`` (split ``select_split``, which must differ from ``split``) among step 0
    and every checkpoint, ties to the earlier step. With ``record``, one record per evaluated
    step goes to ``history.jsonl``. The model must be registered with a ``LocalBackend`` and
    not train meanwhile (the engine serves the evaluated step by default while it runs).

    Example:
        >>> report = await evaluate(model, rollout, tasks, steps=["0", "latest"], k=(1, 4))  # needs a registered model: `model`, `rollout`, `tasks`  # doctest: +SKIP
        >>> print(report.table())  # needs a registered model  # doctest: +SKIP
    """
    labels = parse_steps(steps)
    ks = sorted(set(k))
    split, select_split = _check_options(
        labels, ks, tasks, select_tasks, runs_per_task, max_concurrent, split, select_split
    )
    backend = model.backend()
    folder = _model_folder(backend, model)
    checkpoints = await asyncio.to_thread(folder.checkpoint_steps)
    latest = checkpoints[-1] if checkpoints else 0
    _check_steps_exist(labels, checkpoints, model.name)

    score = functools.partial(
        _score_step,
        model,
        backend,
        folder,
        rollout_fn,
        runs_per_task=runs_per_task,
        ks=ks,
        solve_threshold=solve_threshold,
        seed=seed,
        resamples=resamples,
        max_concurrent=max_concurrent,
    )
    # ``best``: every step is scored on the selection tasks (``_check_options`` saw them).
    selection = [
        await score(step, select_tasks or (), split=select_split, labels=())
        for step in ([0, *checkpoints] if BEST in labels else [])
    ]
    best = _best_step(selection)
    by_step = _labels_by_step(labels, latest=latest, best=best)
    scores = [
        await score(step, tasks, split=split, labels=tuple(names))
        for step, names in by_step.items()
    ]
    report = EvalReport(
        model=model.name,
        split=split,
        scores=scores,
        select_split=select_split if selection else None,
        selection=selection,
        best_step=best,
    )
    if record:
        await _record_scores(model, folder, report)
    return report


def _check_options(
    labels: list[str],
    ks: list[int],
    tasks: Sequence[Task],
    select_tasks: Sequence[Task] | None,
    runs_per_task: int,
    max_concurrent: int,
    split: str,
    select_split: str,
) -> tuple[str, str]:
    """``evaluate``'s argument checks; returns ``split`` and ``select_split`` checked."""
    if runs_per_task < 1:
        raise ValueError(f"runs_per_task must be >= 1, got {runs_per_task}")
    if not ks or any(not 1 <= each <= runs_per_task for each in ks):
        raise ValueError(
            f"every k of pass@k must be in 1..runs_per_task ({runs_per_task}), got {ks}"
        )
    if max_concurrent < 1:
        raise ValueError(f"max_concurrent must be >= 1, got {max_concurrent}")
    split = check_name(split, "split")
    _check_tasks(tasks, "tasks")
    if BEST in labels:
        if not select_tasks:
            raise ValueError(
                "step 'best' needs selection tasks (select_tasks / --select-tasks) on a split "
                f"other than {split!r}: the best step is chosen on them"
            )
        select_split = check_name(select_split, "split")
        if select_split == split:
            raise ValueError(
                f"the best step must be chosen on a split other than the one it is reported "
                f"on: select_split and split are both {split!r}"
            )
        _check_tasks(select_tasks, "select_tasks")
    return split, select_split


def _check_steps_exist(labels: list[str], checkpoints: list[int], model_name: str) -> None:
    for label in labels:
        if label not in (LATEST, BEST) and int(label) != 0 and int(label) not in checkpoints:
            raise ValueError(
                f"step {label} of {model_name!r} has no checkpoint; steps that can be "
                f"evaluated: {[0, *checkpoints]}"
            )


def _labels_by_step(labels: list[str], *, latest: int, best: int | None) -> dict[int, list[str]]:
    """The step each label names (``latest`` and ``best`` resolved), with its labels."""
    by_step: dict[int, list[str]] = {}
    for label in labels:
        chosen = latest if label == LATEST else best if label == BEST else int(label)
        assert chosen is not None
        by_step.setdefault(chosen, []).append(label)
    return by_step


def _best_step(selection: list[StepScore]) -> int | None:
    """The step with the highest mean reward on the selection tasks (None without them)."""
    if not selection:
        return None
    # max() keeps the first of equal means: ties go to the earlier step.
    return max(selection, key=lambda s: s.summary.mean_reward.value).step


async def _record_scores(model: TrainableModel, folder: ModelFolder, report: EvalReport) -> None:
    """One ``history.jsonl`` record per evaluated step (also kept in ``report.records``)."""
    for step_score in report.scores:
        entry = step_score.record()
        await asyncio.to_thread(folder.append_history, entry)
        metric_hooks.history_logged(model, entry)
        report.records.append(entry)


def _check_tasks(tasks: Sequence[Task] | None, name: str) -> None:
    if not tasks:
        raise ValueError(f"{name}: no tasks to evaluate on")
    for index, task in enumerate(tasks):
        if not isinstance(task, Mapping):
            raise ValueError(f"{name}[{index}] is a {type(task).__name__}, not a JSON object")


def _model_folder(backend: Any, model: TrainableModel) -> ModelFolder:
    """The model's folder, where a backend serves checkpoints from it on this machine."""
    for needed in ("model_folder", "engine", "server"):
        if not hasattr(backend, needed):
            raise ValueError(
                f"evaluate needs the model registered with a LocalBackend (it loads each "
                f"step's checkpoint into the engine); {type(backend).__name__} cannot"
            )
    folder: ModelFolder = backend.model_folder(model)
    return folder


@asynccontextmanager
async def _serving(
    backend: Any, model: TrainableModel, folder: ModelFolder, step: int
) -> AsyncIterator[None]:
    """Within the block, the engine holds adapter ``step`` (0: the base model, always
    there); after it, the adapter it served by default before is the default again."""
    engine: Engine = backend.engine(model)
    if step == 0 or engine.adapter(step) is not None:
        yield
        return
    previous = engine.current_adapter
    await backend.server.call(engine.load_adapter(folder.checkpoint(step), step))
    try:
        yield
    finally:
        if previous is not None and previous.path is not None:
            await backend.server.call(
                engine.load_adapter(previous.path, previous.step, name=previous.name)
            )
        elif previous is None and hasattr(engine, "unload_adapter"):
            # The base model was the default: the loaded adapter must not stay it.
            await backend.server.call(engine.unload_adapter(f"step-{step}"))


async def _score_step(
    model: TrainableModel,
    backend: Any,
    folder: ModelFolder,
    rollout_fn: RolloutFn,
    step: int,
    tasks: Sequence[Task],
    *,
    split: str,
    labels: tuple[str, ...],
    runs_per_task: int,
    ks: Sequence[int],
    solve_threshold: float,
    seed: int,
    resamples: int,
    max_concurrent: int,
) -> StepScore:
    limit = asyncio.Semaphore(max_concurrent)

    async def one(task: Task) -> Trajectory:
        async with limit:
            return await rollout_fn(model, task)

    async with _serving(backend, model, folder, step):
        # Tasks created inside the pin copy it: every rollout opened in them calls `step`.
        with pin_step(step):
            outcomes = await asyncio.gather(
                *(one(task) for task in tasks for _ in range(runs_per_task)),
                return_exceptions=True,
            )
    for outcome in outcomes:
        if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
            raise outcome  # cancelled, interrupted: not a failed run
    finished: list[Trajectory] = []
    rewards: list[list[float]] = [[] for _ in tasks]
    wrong_step: set[int] = set()
    for index, outcome in enumerate(outcomes):
        runs = rewards[index // runs_per_task]
        if isinstance(outcome, Exception):
            runs.append(0.0)
            continue
        if not isinstance(outcome, Trajectory):
            raise TypeError(
                f"the rollout function returned a {type(outcome).__name__}, not an art.Trajectory"
            )
        wrong_step |= {call.adapter_step for call in outcome.calls} - {step}
        finished.append(outcome)
        runs.append(outcome.reward)
    if wrong_step:
        raise RuntimeError(
            f"evaluating step {step}, some calls were served by step(s) {sorted(wrong_step)}: "
            "the rollout function must call the model as `run.model_name` (the name of the "
            "step being evaluated), not by a name of its own"
        )
    summary = summarize(
        rewards, k=ks, solve_threshold=solve_threshold, resamples=resamples, seed=seed
    )
    tokens = sum(len(call.completion_token_ids) for t in finished for call in t.calls)
    tool_errors = sum(float(t.metrics.get("tool_errors", 0)) for t in finished)
    return StepScore(
        step=step,
        split=split,
        labels=labels,
        summary=summary,
        tokens_per_run=tokens / len(finished) if finished else 0.0,
        tool_errors_per_run=tool_errors / len(finished) if finished else 0.0,
        failed_runs=len(outcomes) - len(finished),
    )


__all__ = ["Estimate", "EvalReport", "StepScore", "evaluate", "parse_steps"]
