"""``art-core ruler FILE.jsonl``: scores every group of a file with the stand-in judge."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from art_core.cli import main
from art_core.trajectories import Trajectory, TrajectoryGroup

USER = {"role": "user", "content": "What is the capital of Peru?"}


def cli(*args: str) -> int:
    return main(["ruler", *args])


def run(answer: str) -> Trajectory:
    return Trajectory(messages_and_choices=[USER, {"role": "assistant", "content": answer}])


@pytest.fixture
def groups_file(tmp_path: Path) -> Path:
    path = tmp_path / "groups.jsonl"
    group = TrajectoryGroup([run("Lima. score-hint: 0.95"), run("Cusco. score-hint: 0.15")])
    as_list = [
        run("Lima! score-hint: 0.9").model_dump(mode="json"),
        run("Quito. score-hint: 0").model_dump(mode="json"),
    ]
    path.write_text(group.model_dump_json() + "\n\n" + json.dumps(as_list) + "\n")
    return path


def test_scores_a_file_prints_a_table_and_writes_the_groups(judge, groups_file, tmp_path, capsys):
    out = tmp_path / "scored.jsonl"
    rubric = tmp_path / "rubric.txt"
    rubric.write_text("Only the correct capital deserves a high score.")

    options = ["--judge-model", "judge-cli", "--judge-base-url", judge.base_url]
    code = cli(str(groups_file), *options, "--rubric", str(rubric), "--out", str(out))

    printed = capsys.readouterr().out
    assert code == 0
    assert len(judge.requests) == 2  # one judge call per group
    assert all("Only the correct capital" in r["messages"][0]["content"] for r in judge.requests)
    rows = [line.split() for line in printed.splitlines() if line.strip().startswith(("1 ", "2 "))]
    assert [(row[0], row[1], row[4]) for row in rows] == [
        ("1", "1", "0.950"),
        ("1", "2", "0.150"),
        ("2", "1", "0.900"),
        ("2", "2", "0.000"),
    ]
    assert "run 1: 0 tool calls, 0 tool results, hint 0.95" in printed
    assert "scored 2/2 groups with 2 judge call(s)" in printed
    scored = [TrajectoryGroup.model_validate_json(line) for line in out.read_text().splitlines()]
    assert [[t.reward for t in g] for g in scored] == [[0.95, 0.15], [0.9, 0.0]]
    assert scored[0].metrics["ruler_judge_calls"] == 1

    # a second run is served from the cache
    assert cli(str(groups_file), *options, "--rubric", str(rubric)) == 0
    assert len(judge.requests) == 2
    assert "scored 2/2 groups with 0 judge call(s)" in capsys.readouterr().out


def test_a_failing_group_exits_1_and_the_others_are_scored(judge, groups_file, capsys):
    judge.script = ["not_json", "not_json"]  # the first request and its retry fail
    options = ["--judge-model", "m", "--judge-base-url", judge.base_url]
    code = cli(str(groups_file), *options, "--concurrency", "1", "--no-cache")
    captured = capsys.readouterr()
    assert code == 1
    assert "FAILED: RULER judge 'm' gave no valid scores after 2 attempts" in captured.out
    assert "scored 1/2 groups" in captured.out
    assert "1 group(s) could not be scored: 1" in captured.err


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("not json", "groups.jsonl:1"),
        ('{"id": 3}', "expected a TrajectoryGroup object or a list of trajectories"),
        ('[{"reward": "high"}]', "groups.jsonl:1"),
    ],
)
def test_bad_input_exits_2_naming_the_line(judge, tmp_path, capsys, line, problem):
    path = tmp_path / "groups.jsonl"
    path.write_text(line + "\n")
    code = cli(str(path), "--judge-model", "m", "--judge-base-url", judge.base_url)
    assert code == 2
    assert problem in capsys.readouterr().err
    assert judge.requests == []


def test_missing_file_and_missing_key_exit_2(judge, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    missing = str(tmp_path / "nope.jsonl")
    assert cli(missing, "--judge-model", "m", "--judge-base-url", judge.base_url) == 2
    assert "cannot read" in capsys.readouterr().err
    (tmp_path / "g.jsonl").write_text("[]\n")
    assert cli(str(tmp_path / "g.jsonl"), "--judge-model", "gpt-4.1") == 2
    assert "no API key" in capsys.readouterr().err


def test_console_entry_point(judge, groups_file, tmp_path):
    options = ["--judge-model", "m", "--judge-base-url", judge.base_url]
    cache = ["--cache-path", str(tmp_path / "c.sqlite")]
    result = subprocess.run(
        [sys.executable, "-m", "art_core.cli", "ruler", str(groups_file), *options, *cache],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "scored 2/2 groups" in result.stdout
