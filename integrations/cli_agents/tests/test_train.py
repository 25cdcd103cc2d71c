"""Tasks on disk and training on them: the loader refuses broken task folders by name, the
example tasks' checks can fail and can pass, and ``train`` trains when a step's runs differ
and says why (from the runs) when they do not."""

from __future__ import annotations

import asyncio
import importlib.util
import io
import sys
from pathlib import Path

import art_cli_agents as cli
import pytest
from art_cli_agents.train import tasks_for_step
from safetensors.torch import load_file

import art_core as art

HERE = Path(__file__).parent
EXAMPLE = HERE.parents[2] / "examples" / "cli_agents"
EXAMPLE_TASKS = EXAMPLE / "tasks"
TASK_AGENT = cli.CLIAgent("task-agent", [sys.executable, str(HERE / "task_agent.py")])
# A score that reads every character of the run's answer: different sampled replies score
# differently (all runs of a group alike only if their replies were), so groups have signal.
SCORE = """\
import zlib
print(zlib.crc32(open("answer.txt", "rb").read()) % 1000 / 1000)
"""
LIMITS = cli.Limits(timeout_s=120, check_timeout_s=30)


def write_task(root: Path, name: str, toml: str, files: dict[str, str] | None = None) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "task.toml").write_text(toml)
    for relative, text in (files or {}).items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return folder


# --- the task format -------------------------------------------------------------------------


def test_the_example_tasks_load() -> None:
    tasks = cli.load_tasks(EXAMPLE_TASKS)
    assert [t.metadata["task"] for t in tasks] == [
        "fix_add",
        "hello_file",
        "list_folder",
        "rename_function",
    ]
    for task in tasks:
        assert task.prompt and isinstance(task.check, str)
        assert "${task_dir}" not in task.check  # filled in, as an absolute path
    by_name = {t.metadata["task"]: t for t in tasks}
    assert by_name["hello_file"].folder is None  # no files/: an empty folder
    assert by_name["fix_add"].folder == EXAMPLE_TASKS / "fix_add" / "files"
    assert str(EXAMPLE_TASKS / "list_folder" / "check" / "expected.txt") in str(
        by_name["list_folder"].check
    )


def test_the_task_folder_is_substituted_shell_quoted(tmp_path: Path) -> None:
    folder = write_task(
        tmp_path / "odd 'name'", "t", "prompt = 'p'\ncheck = 'cat ${task_dir}/check/x'\n"
    )
    task = cli.load_task(folder)
    assert task.check == f"cat '{tmp_path}/odd '\"'\"'name'\"'\"'/t'/check/x"


BAD = "prompt = 'p'\ncheck = 'true'\n"


@pytest.mark.parametrize(
    ("toml", "files", "expected"),
    [
        (None, None, "task.toml: missing"),
        ("prompt = 'p'\ncheck = \n", None, "task.toml: not valid TOML"),
        ("check = 'true'\n", None, "task.toml: missing key 'prompt'"),
        ("prompt = 'p'\n", None, "task.toml: missing key 'check'"),
        ("prompt = 3\ncheck = 'true'\n", None, "task.toml: key 'prompt' must be a string, not int"),
        ("prompt = 'p'\ncheck = ['true']\n", None, "key 'check' must be a string, not list"),
        ("prompt = ' '\ncheck = 'true'\n", None, "task.toml: key 'prompt' is empty"),
        (BAD + "timeout = 3\n", None, "task.toml: unknown key 'timeout'"),
        (BAD + "metadata = 'x'\n", None, "key 'metadata' must be a table, not str"),
        (BAD + "[metadata]\ntask = 'x'\n", None, "key 'metadata.task' is reserved"),
        (BAD, {"files": "not a folder"}, "task.toml: 'files' ("),
        (BAD, "link files", "'files' ("),
        (BAD, "link inside", "a link out of the folder"),
    ],
)
def test_a_broken_task_folder_is_refused_by_name(
    tmp_path: Path, toml: str | None, files: dict[str, str] | str | None, expected: str
) -> None:
    folder = tmp_path / "tasks" / "broken"
    folder.mkdir(parents=True)
    if toml is not None:
        (folder / "task.toml").write_text(toml)
    outside = tmp_path / "secret"
    outside.mkdir()
    if files == "link files":  # files/ is a link out of the task
        (folder / "files").symlink_to(outside)
    elif files == "link inside":  # files/ holds a link out of it
        (folder / "files").mkdir()
        (folder / "files" / "answers").symlink_to(outside)
    elif isinstance(files, dict):
        for name, text in files.items():
            (folder / name).write_text(text)
    with pytest.raises(ValueError) as raised:
        cli.load_tasks(tmp_path / "tasks")
    message = str(raised.value)
    assert expected in message
    assert str(folder) in message  # names the file (or folder) at fault


def test_a_folder_without_tasks_is_refused(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("no tasks here")
    (tmp_path / ".hidden").mkdir()
    with pytest.raises(ValueError, match="no tasks"):
        cli.load_tasks(tmp_path)
    with pytest.raises(ValueError, match="not a folder of tasks"):
        cli.load_tasks(tmp_path / "README.md")


def test_the_schedule_is_seeded_and_covers_every_task_each_epoch() -> None:
    pool = [cli.Task(f"task {i}") for i in range(5)]
    epoch = [t for step in range(5) for t in tasks_for_step(pool, step, 1, seed=3)]
    assert sorted(t.prompt for t in epoch) == [t.prompt for t in pool]
    assert tasks_for_step(pool, 7, 2, seed=3) == tasks_for_step(pool, 7, 2, seed=3)
    # Another seed, another order (these two seeds differ on these 5 tasks).
    assert tasks_for_step(pool, 0, 5, seed=0) != tasks_for_step(pool, 0, 5, seed=1)


# --- the example tasks' checks ---------------------------------------------------------------

# Run in the run's folder by a "solver" agent, in place of a model: (right, wrong) per task.
SOLUTIONS = {
    "hello_file": (
        "open('hello.txt', 'w').write('hello\\n')",
        "open('hello.txt', 'w').write('hello world\\n')",
    ),
    "list_folder": (
        "import subprocess; open('out.txt', 'w').write("
        "subprocess.run(['ls', 'data'], capture_output=True, text=True, check=True).stdout)",
        "open('out.txt', 'w').write('apple.txt\\nbanana.txt\\n')",
    ),
    "fix_add": (
        "import pathlib; p = pathlib.Path('mathutil.py'); "
        "p.write_text(p.read_text().replace('return a - b', 'return a + b'))",
        # Cheating: the test made to pass, the bug left in (the check runs its own copy).
        "open('test_mathutil.py', 'w').write('print(\"ok\")\\n')",
    ),
    "rename_function": (
        "import pathlib\n"
        "for name in ('greetings.py', 'main.py'):\n"
        "    p = pathlib.Path(name); p.write_text(p.read_text().replace('say_hello', 'greet'))",
        # Only the definition renamed: main.py still imports the old name.
        "import pathlib; p = pathlib.Path('greetings.py'); "
        "p.write_text(p.read_text().replace('say_hello', 'greet'))",
    ),
}


async def test_every_example_check_fails_untouched_or_wrong_and_passes_solved(
    cli_model: art.TrainableModel,
) -> None:
    tasks = cli.load_tasks(EXAMPLE_TASKS)
    assert {t.metadata["task"] for t in tasks} == set(SOLUTIONS)

    async def reward(task: cli.Task, code: str | None) -> float:
        argv = ["true"] if code is None else [sys.executable, "-c", code]
        run = await cli.rollout(cli_model, cli.CLIAgent("solver", argv), task, limits=LIMITS)
        assert run.metrics["exit_code"] == 0, run.logs
        return run.reward

    for task in tasks:
        right, wrong = SOLUTIONS[task.metadata["task"]]
        rewards = await asyncio.gather(reward(task, None), reward(task, wrong), reward(task, right))
        assert rewards == [0.0, 0.0, 1.0], (task.metadata["task"], rewards)


# --- training --------------------------------------------------------------------------------


async def register(backend: art.LocalBackend, name: str) -> art.TrainableModel:
    # A model of its own: these tests train, and the steps they assert are its own.
    model = art.TrainableModel(name=name, project="tests", base_model="tiny-qwen2.5")
    await model.register(backend)
    return model


def scored_tasks(root: Path, check: str, count: int = 2) -> list[cli.Task]:
    for i in range(count):
        write_task(
            root,
            f"answer_{i}",
            f"prompt = 'Write one word into answer.txt ({i}).'\ncheck = '''{check}'''\n",
            {"check/score.py": SCORE, "files/README.md": "Write your answer in answer.txt.\n"},
        )
    return cli.load_tasks(root)


async def test_train_trains_when_the_runs_of_a_task_score_differently(
    backend: art.LocalBackend, tmp_path: Path
) -> None:
    model = await register(backend, "cli-train-signal")
    tasks = scored_tasks(tmp_path, "python3 ${task_dir}/check/score.py")
    seen: list[cli.StepRecord] = []
    errlog = io.StringIO()
    report = await cli.train(
        model,
        TASK_AGENT,
        tasks,
        val_tasks=tasks[:1],
        steps=2,
        groups_per_step=2,
        rollouts_per_group=3,
        val_rollouts_per_task=2,
        limits=LIMITS,
        errlog=errlog,
        on_step=seen.append,
    )
    assert seen == report.steps and [r.step for r in report.steps] == [0, 1]
    for record in report.steps:
        assert record.trained, record.line()
        assert record.why_nothing_trained is None
        assert record.groups == 2 and record.groups_with_signal == 2
        assert record.signal_share == 1.0
        assert sorted(record.tasks) == ["answer_0", "answer_1"]  # one epoch per step
        assert record.rollouts == 6 and record.failed == 0
        assert record.runs.runs == 6 and record.runs.calls == 1.0 and record.runs.no_calls == 0
        assert record.runs.nonzero_exits == 0 and record.runs.timeouts == 0
        assert record.runs.first_prompt_tokens > 0 and record.runs.agent_s > 0
        assert 0.0 <= record.reward < 1.0 and record.reward_std > 0
    assert await model.get_step() == 2
    assert (report.before.step, report.after.step) == (0, 2)
    assert len(report.before.rewards) == len(report.after.rewards) == 2
    assert errlog.getvalue() == ""
    # Each step wrote an adapter, and the second moved it further.
    folder = backend.model_folder(model)
    first, second = (
        load_file(str(folder.checkpoint(step) / "adapter_model.safetensors")) for step in (1, 2)
    )
    assert any(k.endswith("lora_B.weight") and v.abs().sum() > 0 for k, v in first.items())
    assert any(not first[k].equal(second[k]) for k in first)
    table = report.table()
    assert table.startswith("validation, before vs after")
    assert "before (step 0)" in table and "after (step 2)" in table
    assert "model calls per run" in table and "trained nothing" not in table


async def test_train_says_why_a_step_trained_nothing(
    backend: art.LocalBackend, tmp_path: Path
) -> None:
    model = await register(backend, "cli-train-flat")
    # Every run fails the check: all groups alike.
    tasks = scored_tasks(tmp_path / "never", "false")
    report = await cli.train(
        model,
        TASK_AGENT,
        tasks,
        steps=1,
        groups_per_step=2,
        rollouts_per_group=2,
        val_rollouts_per_task=1,
        limits=LIMITS,
    )
    [record] = report.steps
    assert not record.trained and record.groups_with_signal == 0
    assert record.why_nothing_trained == (
        "all 2 groups scored 0 on every run: the agent solves none of these tasks; try more "
        "rollouts per group, a higher temperature, easier tasks, or a warm start"
    )
    assert await model.get_step() == 0
    assert "constant_reward" in {d.code for d in record.diagnoses}  # the backend's own rule
    table = report.table()
    assert "steps that trained nothing (1 of 1)" in table
    assert f"step 0: {record.why_nothing_trained}" in table

    # An agent that crashes before asking the model: the runs say so, not "solves none".
    crashing = cli.CLIAgent("crashing", ["sh", "-c", "echo 'no such option' >&2; exit 3"])
    errlog = io.StringIO()
    report = await cli.train(
        model,
        crashing,
        tasks,
        steps=1,
        groups_per_step=1,
        rollouts_per_group=2,
        val_rollouts_per_task=1,
        limits=LIMITS,
        errlog=errlog,
    )
    [record] = report.steps
    assert not record.trained and record.runs.nonzero_exits == 2 and record.runs.no_calls == 2
    why = record.why_nothing_trained or ""
    assert why.startswith("all 1 groups scored 0 on every run: 2 of 2 runs made no call")
    assert "2 of 2 runs exited with an error (exit 3 x2), e.g. 'no such option'" in why
    assert [d.code for d in record.diagnoses][:2] == ["agent_no_calls", "agent_errors"]
    # The step's 2 runs and each validation's (both tasks, once: the default is the first 8).
    assert errlog.getvalue().count("agent exit 3: no such option") == 2 + 2 + 2
    assert await model.get_step() == 0


async def test_a_broken_check_is_named(backend: art.LocalBackend, tmp_path: Path) -> None:
    model = await register(backend, "cli-train-broken-check")
    tasks = scored_tasks(tmp_path, "no-such-checker answer.txt", count=1)
    report = await cli.train(
        model,
        TASK_AGENT,
        tasks,
        steps=1,
        groups_per_step=1,
        rollouts_per_group=2,
        val_rollouts_per_task=1,
        limits=LIMITS,
    )
    why = report.steps[0].why_nothing_trained or ""
    assert "the check could not run in 2 of 2 runs (exit 127: command not found" in why
    assert "answer_0" in why


async def test_the_example_script_trains_and_prints_the_table(
    backend: art.LocalBackend, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = importlib.util.spec_from_file_location("cli_agents_example_train", EXAMPLE / "train.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    # The test agent in place of an npm one (it solves none of the tasks: a step without
    # signal, which the table reports), tiny-qwen2.5 in place of the real Qwen GGUF file.
    args = example.parse_args(
        ["--agent", str(HERE / "task_agent.py"), "--base-model", "tiny-qwen2.5",
         "--path", str(backend.path), "--name", "cli-example", "--steps", "1",
         "--groups-per-step", "1", "--rollouts-per-group", "2", "--val-rollouts", "1",
         "--timeout-s", "120"]
    )  # fmt: skip
    report = await example.train_on(args, backend)
    out = capsys.readouterr().out
    assert report.before.runs.runs == 4 and len(report.steps) == 1  # the 4 example tasks
    assert "validation, before vs after" in out and "steps that trained nothing (1 of 1)" in out
    with pytest.raises(SystemExit, match="not codex, claude, opencode, nor a file"):
        example.make_agent("no-such-agent")
    # Codex has no turn bound of its own: its runs are bounded in calls unless told otherwise.
    assert example.run_limits(args).max_calls is None
    assert example.run_limits(example.parse_args([])).max_calls == 4  # --agent codex
    codex = example.run_limits(example.parse_args(["--max-calls", "2", "--timeout-s", "60"]))
    assert (codex.max_calls, codex.timeout_s) == (2, 60.0)
    with pytest.raises(SystemExit):
        example.parse_args(["--max-calls", "0"])


async def test_a_spent_time_budget_starts_no_step(cli_model: art.TrainableModel) -> None:
    quick = cli.CLIAgent("quick", ["true"])  # no call, nothing to train: the loop alone
    report = await cli.train(
        cli_model, quick, [cli.Task("p", check="true")], time_budget_s=0, limits=LIMITS
    )
    assert report.steps == [] and len(report.before.rewards) == len(report.after.rewards) == 2
    assert report.before.mean_reward == report.after.mean_reward == 1.0
    assert "trained nothing" not in report.table()


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"rollouts_per_group": 1}, "rollouts_per_group must be >= 2"),
        ({"steps": 0}, "must be >= 1"),
        ({"time_budget_s": -1.0}, "time_budget_s"),
    ],
)
async def test_train_refuses_bad_settings(
    cli_model: art.TrainableModel, settings: dict[str, float], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        await cli.train(cli_model, TASK_AGENT, [cli.Task("p")], **settings)  # type: ignore[arg-type]
