"""``art_core.evals``: pass@k and bootstrap intervals that mean what they say, ``evaluate``
serving the step asked for (0 = the base model) to an unchanged rollout function, ``best``
chosen on another split than the one it is reported on, the history records the viewer reads,
and ``art-core eval`` with its input errors."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio

import art_core as art
from art_core.cli import main
from art_core.engines.transformers_engine import TransformersEngine
from art_core.evals import (
    bootstrap_interval,
    evaluate,
    parse_steps,
    pass_at_k,
    summarize,
)
from art_core.metrics.plot import metric_series
from art_core.testing.pytest_plugin import register_tiny_model
from art_core.training import TrainConfig
from art_core.ui.curves import metric_curve, recorded_metrics, run_curves

# ------------------------------------------------------------------------------ statistics


def test_pass_at_k_matches_hand_computed_values() -> None:
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)  # 1 - C(7,5)/C(10,5)
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)  # pass@1 is the solve share
    assert pass_at_k(4, 0, 3) == 0.0 and pass_at_k(4, 2, 3) == 1.0  # n - c < k: always
    # Large n: the product form stays exact where binomials would overflow floats.
    assert pass_at_k(2000, 1, 1000) == pytest.approx(0.5)


def test_pass_at_k_is_not_the_naive_estimator() -> None:
    # 5 runs, 2 solved, k=2: drawing 2 of the 5 without replacement (the unbiased estimator)
    # vs 1 - (1 - 2/5)**2 with replacement (naive, biased low).
    naive = 1 - (1 - 2 / 5) ** 2
    assert naive == pytest.approx(0.64)
    assert pass_at_k(5, 2, 2) == pytest.approx(0.70)
    # Unbiased: averaged over every way the runs could have come out, it is the true pass@k.
    p, n, k = 0.3, 5, 2
    expected = sum(
        math.comb(n, c) * p**c * (1 - p) ** (n - c) * pass_at_k(n, c, k) for c in range(n + 1)
    )
    assert expected == pytest.approx(1 - (1 - p) ** k)


def test_pass_at_k_refuses_impossible_counts() -> None:
    for n, c, k in [(0, 0, 1), (4, 5, 1), (4, -1, 1), (4, 1, 5), (4, 1, 0)]:
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def test_summary_weighs_tasks_equally_and_resamples_by_task() -> None:
    summary = summarize([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0]], k=(1, 2), seed=3)
    assert summary.tasks == 2 and summary.runs == 6
    assert summary.mean_reward.value == 0.5  # per task, not 4/6 per run
    assert summary.pass_at[2].value == 0.5
    # Two tasks, each all-or-nothing: a resample holds 0, 1 or 2 solved tasks.
    assert (summary.solve_rate.low, summary.solve_rate.high) == (0.0, 1.0)
    # Seeded: the same numbers every time; another seed may differ.
    again = summarize([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0]], k=(1, 2), seed=3)
    assert again == summary
    assert bootstrap_interval([0.1, 0.9, 0.4, 0.7], seed=1) == bootstrap_interval(
        [0.1, 0.9, 0.4, 0.7], seed=1
    )
    with pytest.raises(ValueError, match="pass@3"):
        summarize([[1.0, 0.0]], k=(3,))
    with pytest.raises(ValueError, match="no tasks"):
        summarize([])


def test_a_95_percent_interval_covers_the_true_solve_rate_about_95_percent_of_the_time() -> None:
    """200 seeded evals of 40 tasks x 4 runs, tasks drawn from a population whose per-task
    success probabilities are known: the solve rate's interval covers the population's
    rate (the mean of those probabilities) in 90-99% of them."""
    rng = np.random.default_rng(2021)
    probabilities = np.array([0.0, 0.05, 0.2, 0.5, 0.8, 0.95, 1.0])
    true_rate = float(probabilities.mean())
    covered = 0
    for trial in range(200):
        task_p = rng.choice(probabilities, size=40)
        solved = rng.random((40, 4)) < task_p[:, None]
        rewards = solved.astype(float).tolist()
        rate = summarize(rewards, seed=trial).solve_rate
        assert rate.low <= rate.value <= rate.high
        covered += rate.low <= true_rate <= rate.high
    assert 0.90 * 200 <= covered <= 0.99 * 200, f"covered {covered} of 200"


# ------------------------------------------------------------------------------ evaluate
VAL_REWARD = {0: 0.0, 1: 1.0, 2: 0.5}  # the best step on val is 1 ...
TEST_REWARD = {0: 0.2, 1: 0.3, 2: 0.9}  # ... while on test it would be 2


async def step_rollout(model: art.TrainableModel, task: dict[str, Any]) -> art.Trajectory:
    """A rollout as a user writes it; its reward depends on the step that served it (read
    from the recorded call) and on the task's split, so the eval's choices are checkable."""
    async with art.capture(model) as run:
        await run.openai_client().chat.completions.create(
            model=run.model_name,
            messages=[{"role": "user", "content": f"task {task['id']}"}],
            max_tokens=3,
        )
    step = run.calls[0].adapter_step
    table = VAL_REWARD if task["split"] == "val" else TEST_REWARD
    return run.trajectory(reward=table[step], metrics={"tool_errors": 1})


async def sloppy_rollout(model: art.TrainableModel, task: dict[str, Any]) -> art.Trajectory:
    """Names the model itself instead of ``run.model_name``: served the default step."""
    async with art.capture(model) as run:
        await run.openai_client().chat.completions.create(
            model=model.name, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    return run.trajectory(reward=1.0)


async def failing_rollout(model: art.TrainableModel, task: dict[str, Any]) -> art.Trajectory:
    if task["id"] == 0:
        raise RuntimeError("the agent crashed")
    return await step_rollout(model, task)


async def train_rollout(model: art.TrainableModel, i: int) -> art.Trajectory:
    async with art.capture(model) as run:
        await run.openai_client().chat.completions.create(
            model=run.model_name, messages=[{"role": "user", "content": f"q{i}"}], max_tokens=3
        )
    return run.trajectory(reward=float(i % 2))  # rewards that differ: the step trains


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def trained(backend: art.LocalBackend) -> art.TrainableModel:
    """A tiny-random model with checkpoints 1 and 2."""
    model = await register_tiny_model(backend, "eval-two-steps", "evals")
    for _ in range(2):
        groups = [art.TrajectoryGroup([await train_rollout(model, i) for i in range(4)])]
        result = await model.train(groups, config=TrainConfig(learning_rate=1e-3))
        assert result.nothing_trained is None
    assert backend.model_folder(model).checkpoint_steps() == [1, 2]
    return model


VAL = [{"split": "val", "id": i} for i in range(3)]
TEST = [{"split": "test", "id": i} for i in range(4)]


async def test_best_is_chosen_on_the_selection_split_and_reported_on_the_other(
    trained: art.TrainableModel, backend: art.LocalBackend
) -> None:
    folder = backend.model_folder(trained)
    before = len(folder.read_history())
    # Step 1's adapter leaves the engine: the eval must load it from its checkpoint.
    engine = backend.engine(trained)
    assert isinstance(engine, TransformersEngine)
    await backend.server.call(engine.unload_adapter("step-1"))
    assert engine.adapter(1) is None
    assert engine.current_adapter is not None and engine.current_adapter.step == 2
    report = await evaluate(
        trained,
        step_rollout,
        TEST,
        steps=["0", "latest", "best"],
        runs_per_task=2,
        k=(1, 2),
        select_tasks=VAL,
    )
    # Chosen on val (step 1 scores 1.0 there), not on test (where step 2 would win).
    assert report.best_step == 1
    assert [(s.step, s.split) for s in report.selection] == [(0, "val"), (1, "val"), (2, "val")]
    assert [s.summary.mean_reward.value for s in report.selection] == [0.0, 1.0, 0.5]
    best = report.score("best")
    assert (best.step, best.split, best.summary.mean_reward.value) == (1, "test", 0.3)
    assert (
        report.score("latest").step == 2 and report.score("latest").summary.mean_reward.value == 0.9
    )
    assert report.score("0").summary.mean_reward.value == 0.2
    # The engine serves what it served before the eval.
    assert engine.current_adapter is not None and engine.current_adapter.step == 2

    # One history record per reported (step, split); none for the selection split.
    records = folder.read_history()[before:]
    assert [(r["step"], r["eval_label"], r["eval_split"]) for r in records] == [
        (0, "0", "test"),
        (2, "latest", "test"),
        (1, "best", "test"),
    ]
    assert records == report.records
    record = records[2]
    triples = ["mean_reward", "solve_rate", "pass@1", "pass@2"]
    assert set(record) == {
        "split",
        "step",
        "time",
        "eval_split",
        "eval_label",
        "tasks",
        "runs",
        *(f"eval/{name}{end}" for name in triples for end in ("", "_low", "_high")),
        "eval/tokens_per_run",
        "eval/tool_errors_per_run",
        "eval/failed_runs",
    }
    assert record["split"] == "eval" and isinstance(record["time"], float)
    assert (record["tasks"], record["runs"], record["eval/failed_runs"]) == (4, 8, 0)
    assert record["eval/mean_reward"] == record["eval/mean_reward_low"] == 0.3
    assert record["eval/solve_rate"] == 0.0 and record["eval/pass@2_high"] == 0.0
    assert 1 <= record["eval/tokens_per_run"] <= 3 and record["eval/tool_errors_per_run"] == 1.0
    # The table states every number with its interval.
    table = report.table()
    assert "0.300 [0.300, 0.300]" in table and "best = step 1" in table and "on val" in table

    # The viewer's curves and the plot read the records; the train/val curves ignore them.
    history = folder.read_history()
    assert "eval/mean_reward" in recorded_metrics(history)
    curve = metric_curve("eval/solve_rate", history)
    assert curve is not None and {p[0] for p in curve["series"][0]["points"]} >= {0, 1, 2}
    run_curves(history)
    assert metric_series(history)["eval/failed_runs"]


async def test_a_run_served_by_another_step_stops_the_eval(trained: art.TrainableModel) -> None:
    with pytest.raises(RuntimeError, match=r"served by step\(s\) \[2\].*run.model_name"):
        await evaluate(trained, sloppy_rollout, TEST, steps=["0"], runs_per_task=1, record=False)


async def test_failed_runs_count_as_unsolved(trained: art.TrainableModel) -> None:
    report = await evaluate(
        trained, failing_rollout, TEST, steps=["latest"], runs_per_task=2, record=False
    )
    score = report.score("latest")
    assert score.failed_runs == 2
    assert score.summary.mean_reward.value == pytest.approx(0.9 * 3 / 4)
    assert report.records == []


async def test_evaluate_refuses_what_it_cannot_do_honestly(trained: art.TrainableModel) -> None:
    with pytest.raises(ValueError, match="needs selection tasks"):
        await evaluate(trained, step_rollout, TEST, steps=["best"])
    with pytest.raises(ValueError, match="split other than the one it is reported on"):
        await evaluate(
            trained, step_rollout, TEST, steps=["best"], select_tasks=VAL, select_split="test"
        )
    with pytest.raises(ValueError, match=r"step 7 .* no checkpoint.*\[0, 1, 2\]"):
        await evaluate(trained, step_rollout, TEST, steps=["7"])
    with pytest.raises(ValueError, match="pass@k"):
        await evaluate(trained, step_rollout, TEST, runs_per_task=2, k=(4,))
    with pytest.raises(ValueError, match="a step is 0, latest, best"):
        parse_steps(["newest"])


# ------------------------------------------------------------------------------ CLI
async def cli_rollout(model: art.TrainableModel, task: dict[str, Any]) -> art.Trajectory:
    async with art.capture(model) as run:
        response = await run.openai_client().chat.completions.create(
            model=run.model_name, messages=[{"role": "user", "content": task["q"]}], max_tokens=2
        )
    return run.trajectory(reward=float(bool(response.choices[0].message.content)))


def model_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "art" / "evals" / "models" / "cli"
    folder.mkdir(parents=True)
    (folder / "model.json").write_text(
        json.dumps({"name": "cli", "project": "evals", "base_model": "tiny-random"})
    )
    return folder


def test_the_cli_evaluates_and_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = model_folder(tmp_path)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"q": "hello"}\n\n{"q": "two plus two"}\n')
    code = main(
        [
            "eval",
            "evals",
            "cli",
            "--rollout",
            "test_evals:cli_rollout",
            "--tasks",
            str(tasks),
            "--steps",
            "0,latest",
            "--runs-per-task",
            "2",
            "--k",
            "1,2",
            "--path",
            str(tmp_path / "art"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "eval of cli on test: 2 tasks x 2 runs" in out and "pass@2" in out
    records = [json.loads(line) for line in (folder / "history.jsonl").read_text().splitlines()]
    # No checkpoint: "0" and "latest" are one step, evaluated and recorded once.
    assert [(r["step"], r["eval_label"], r["runs"]) for r in records] == [(0, "latest", 4)]


@pytest.mark.parametrize(
    ("lines", "extra", "message"),
    [
        (None, [], "tasks.jsonl does not exist"),
        ('{"q": "a"}\n{"q": \n', [], "tasks.jsonl:2 is not valid JSON"),
        ('["a"]\n', [], "tasks.jsonl:1 is a JSON list, not an object"),
        ('{"q": "caf\xe9"}\n'.encode("latin-1"), [], "tasks.jsonl is not UTF-8 text"),
        ('{"q": "a"}\n', ["--steps", "0,3"], "step 3 has no checkpoint; steps there: [0]"),
        ('{"q": "a"}\n', ["--steps", "best"], "--steps best needs --select-tasks"),
        ('{"q": "a"}\n', ["--steps", "soon"], "a step is 0, latest, best or a step number"),
        ('{"q": "a"}\n', ["--k", "5"], "--k: each k must be in 1..--runs-per-task (4)"),
        (
            '{"q": "a"}\n',
            ["--rollout", "no_such_rollouts:run"],
            "module 'no_such_rollouts' not found",
        ),
        ('{"q": "a"}\n', ["--rollout", "test_evals:nothing"], "has no 'nothing'"),
        ('{"q": "a"}\n', ["--project", "other"], "no model 'cli' in project 'other'"),
    ],
)
def test_the_cli_names_what_is_wrong(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    lines: str | bytes | None,
    extra: list[str],
    message: str,
) -> None:
    model_folder(tmp_path)
    tasks = tmp_path / "tasks.jsonl"
    if isinstance(lines, bytes):
        tasks.write_bytes(lines)
    elif lines is not None:
        tasks.write_text(lines)
    options = {"--rollout": "test_evals:cli_rollout", "--project": "evals"}
    for flag, value in zip(extra[::2], extra[1::2], strict=True):
        options[flag] = value
    project = options.pop("--project")
    argv = ["eval", project, "cli", "--tasks", str(tasks), "--path", str(tmp_path / "art")]
    for flag, value in options.items():
        argv += [flag, value]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
