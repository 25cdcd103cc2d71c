"""The task sources of ``learning_suite.py``: tasks nobody in the project wrote, each with its
task set and difficulty fixed here (before any tuning), split into train / validation / test.

- ``verifiers``: verifiers' own ``ReasoningGymEnv`` on reasoning-gym's ``chain_sum`` (two
  terms of 1-2 digits, ``+``/``-``), single-turn, the answer in ``<answer>`` tags, scored by
  the environment's rubric (the generator's ``score_answer``). Run unchanged in the verifiers
  runtime (``art_verifiers``).
- ``calculator``: reasoning-gym's ``basic_arithmetic`` (2-3 terms of up to 3 digits, ``+-*``)
  with the PyPI ``mcp-server-calculator``: calculate, then report the number; scored by the
  generator's ``score_answer``.
- ``time``: the PyPI ``mcp-server-time``: convert a clock time between two IANA timezones; the
  answer is checked against ``zoneinfo``'s conversion on the day of the run.
- ``git``: the PyPI ``mcp-server-git`` over throwaway repositories built here: the current
  branch, or the subject of the latest commit; the answer is read back from git itself.

Every source gives disjoint splits: ``test`` (100 tasks: the reported figure, an interval of
about +/-0.1 at worst), ``val`` (32 tasks: choosing the step), ``train`` (the rest).
"""

from __future__ import annotations

import dataclasses
import os
import random
import shlex
import subprocess
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import art_core as art

HERE = Path(__file__).resolve().parent
TEST_TASKS, VAL_TASKS = 100, 32
CALCULATOR_SERVER = shlex.join([sys.executable, str(HERE / "_calculator_server.py"), "--http"])
TIME_SERVER = shlex.join([sys.executable, str(HERE / "_mcp_http.py"), "time", "Etc/UTC"])
GIT_SERVER = shlex.join([sys.executable, str(HERE / "_mcp_http.py"), "git"])

# groups(model, tasks, runs_per_task, temperature) -> one TrajectoryGroup per task, in order.
GroupsFn = Callable[
    [art.TrainableModel, Sequence[Any], int, float], Awaitable[list[art.TrajectoryGroup]]
]


@dataclass
class Source:
    """One task source: its splits and how to run a group of rollouts of a task."""

    name: str
    description: str
    train: list[Any]
    val: list[Any]
    test: list[Any]
    groups: GroupsFn


def _split(items: list[Any], label: str) -> tuple[list[Any], list[Any], list[Any]]:
    if len(items) < TEST_TASKS + VAL_TASKS + 32:
        raise SystemExit(f"{label}: only {len(items)} distinct tasks")
    test, val = items[:TEST_TASKS], items[TEST_TASKS : TEST_TASKS + VAL_TASKS]
    return items[TEST_TASKS + VAL_TASKS :], val, test


# Model calls a run of an MCP source may make (its answer tool's call included), unless
# ``--max-turns`` says otherwise: a lookup, the repeated-call notice's turn, the answer.
MAX_TURNS = 3


def _tool_settings(
    max_tokens: int, max_turns: int, max_answer_chars: int, prompt: str, **more: Any
) -> Any:
    """What every MCP source runs with: one grammar-forced call a turn, ``max_turns`` turns."""
    import art_mcp

    return art_mcp.RolloutSettings(
        tool_choice="required",
        parallel_tool_calls=False,
        max_turns=max_turns,
        max_tokens=max_tokens,
        max_answer_chars=max_answer_chars,
        system_prompt=prompt,
        **more,
    )


def _mcp_source(
    name: str,
    description: str,
    tasks: list[Any],
    server: Any,
    reward: Any,
    settings: Any,
    errlog: Any,
) -> Source:
    """An MCP source: its tasks split, its groups run by ``art_mcp.rollout`` on ``server``."""
    train, val, test = _split(tasks, name)
    return Source(
        name=name,
        description=description,
        train=train,
        val=val,
        test=test,
        groups=_mcp_groups(server, reward, settings, errlog),
    )


def _mcp_groups(server: Any, reward_fn: Any, settings: Any, errlog: Any) -> GroupsFn:
    import art_mcp

    async def groups(
        model: art.TrainableModel, tasks: Sequence[Any], runs: int, temperature: float
    ) -> list[art.TrajectoryGroup]:
        sampled = dataclasses.replace(settings, temperature=temperature)
        return await art.gather_trajectory_groups(
            (
                art.TrajectoryGroup(
                    art_mcp.rollout(
                        model, task, server, reward_fn=reward_fn, settings=sampled, errlog=errlog
                    )
                    for _ in range(runs)
                )
                for task in tasks
            ),
            pbar_desc=None,
            max_exceptions=0.25,
        )

    return groups


# ---------------------------------------------------------------------------- verifiers
VERIFIERS_GYM = [
    {
        "name": "chain_sum",
        "weight": 1.0,
        "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2},
    }
]


def verifiers_source(seed: int, max_tokens: int) -> Source:
    from art_verifiers import VerifiersEnv, rollout_groups

    env_args = {
        "gym": VERIFIERS_GYM,
        "num_train_examples": 512,
        "num_eval_examples": TEST_TASKS + VAL_TASKS,
        "seed": seed,
    }
    common: dict[str, Any] = {
        "env_args": env_args,
        "paths": [str(HERE / "learning_envs")],
        "env_vars": {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"},
    }
    train_env = VerifiersEnv("reasoning_gym_env", split="train", **common)
    eval_env = VerifiersEnv("reasoning_gym_env", split="eval", **common)

    async def groups(
        model: art.TrainableModel, tasks: Sequence[Any], runs: int, temperature: float
    ) -> list[art.TrajectoryGroup]:
        # A task is (split, row index): one runtime call per split present.
        out: dict[int, art.TrajectoryGroup] = {}
        for env in (train_env, eval_env):
            chosen = [(i, t[1]) for i, t in enumerate(tasks) if t[0] == env.split]
            if not chosen:
                continue
            made = await rollout_groups(
                model,
                env,
                [row for _, row in chosen],
                rollouts_per_example=runs,
                sampling_args={"max_tokens": max_tokens, "temperature": temperature},
                raise_on_error=False,
            )
            out.update({i: g for (i, _), g in zip(chosen, made, strict=True)})
        return [out[i] for i in range(len(tasks))]

    evals = [("eval", i) for i in range(TEST_TASKS + VAL_TASKS)]
    return Source(
        name="verifiers",
        description="verifiers ReasoningGymEnv, reasoning-gym chain_sum (2 terms, 1-2 digits), "
        "single-turn, <answer> tags",
        train=[("train", i) for i in range(512)],
        val=evals[TEST_TASKS:],
        test=evals[:TEST_TASKS],
        groups=groups,
    )


# ---------------------------------------------------------------------------- calculator
CALCULATOR_PROMPT = (
    "You solve arithmetic with the calculate tool: pass it the expression, e.g. 12*7. "
    "Then call complete_task with the number it returned."
)


def calculator_source(
    seed: int, max_tokens: int, server: Any, errlog: Any, max_turns: int = MAX_TURNS
) -> Source:
    import art_mcp
    import reasoning_gym

    dataset = reasoning_gym.create_dataset(
        "basic_arithmetic",
        size=1200,
        seed=seed,
        min_terms=2,
        max_terms=3,
        max_digits=3,
        operators=("+", "-", "*"),
    )
    tasks, seen = [], set()
    for index, entry in enumerate(dataset):
        if entry["question"] not in seen:
            seen.add(entry["question"])
            tasks.append(
                art_mcp.Scenario(
                    task=entry["question"], answer=str(entry["answer"]), metadata={"index": index}
                )
            )

    def reward(scenario: Any, trajectory: art.Trajectory) -> float:
        answer = trajectory.metadata.get("final_answer")
        entry = dataset[scenario.metadata["index"]]
        return float(dataset.score_answer(str(answer).strip() if answer else None, entry))

    settings = _tool_settings(max_tokens, max_turns, 40, CALCULATOR_PROMPT)
    return _mcp_source(
        "calculator",
        "reasoning-gym basic_arithmetic (2-3 terms, <= 3 digits, +-*) with the "
        "PyPI mcp-server-calculator",
        tasks[:600],
        server,
        reward,
        settings,
        errlog,
    )


# ---------------------------------------------------------------------------- time
TIMEZONES = [
    "Europe/London",
    "Europe/Paris",
    "Europe/Moscow",
    "Asia/Tokyo",
    "Asia/Shanghai",
    "Asia/Kolkata",
    "Asia/Dubai",
    "Australia/Sydney",
    "America/New_York",
    "America/Chicago",
    "America/Los_Angeles",
    "America/Sao_Paulo",
]
TIME_PROMPT = (
    "You answer questions about time with the tools. Timezones are IANA names such as "
    "Europe/Madrid. When you have the answer, call complete_task with it."
)


def converted(clock: str, source: str, target: str) -> str:
    """``clock`` (HH:MM) today in ``source``, as HH:MM in ``target`` (what convert_time says).

    Example:
        >>> len(converted("09:30", "Europe/London", "Asia/Tokyo"))
        5
    """
    hour, minute = (int(part) for part in clock.split(":"))
    today = datetime.now(ZoneInfo(source))
    when = today.replace(hour=hour, minute=minute, second=0, microsecond=0)
    return when.astimezone(ZoneInfo(target)).strftime("%H:%M")


def time_source(
    seed: int, max_tokens: int, server: Any, errlog: Any, max_turns: int = MAX_TURNS
) -> Source:
    import art_mcp

    rng = random.Random(seed)
    tasks, seen = [], set()
    while len(tasks) < 400:
        source, target = rng.sample(TIMEZONES, 2)
        clock = f"{rng.randrange(24):02d}:{rng.choice((0, 15, 30, 45)):02d}"
        if (source, target, clock) in seen:
            continue
        seen.add((source, target, clock))
        tasks.append(
            art_mcp.Scenario(
                task=f"It is {clock} in {source}. What time is it then in {target}? "
                "Answer with the time as HH:MM.",
                metadata={"clock": clock, "source": source, "target": target},
            )
        )

    def reward(scenario: Any, trajectory: art.Trajectory) -> float:
        answer = trajectory.metadata.get("final_answer")
        meta = scenario.metadata
        expected = converted(meta["clock"], meta["source"], meta["target"])
        return float(isinstance(answer, str) and expected in answer)

    settings = _tool_settings(max_tokens, max_turns, 24, TIME_PROMPT)
    return _mcp_source(
        "time",
        "PyPI mcp-server-time: convert a time between two of 12 IANA timezones",
        tasks,
        server,
        reward,
        settings,
        errlog,
    )


# ---------------------------------------------------------------------------- git
GIT_TOOLS = ["git_log", "git_show", "git_status", "git_branch"]  # read-only: answers stay true
GIT_PROMPT = (
    "You answer questions about git repositories with the git tools; pass the repository's "
    "path as repo_path. When you have the answer, call complete_task with it."
)
WORDS = (
    "add fix remove update rename parse render cache retry index export import guard sort "
    "merge split trim log route bound check load save"
).split()
NOUNS = (
    "parser readme config tests docs cache router logger schema client server loader queue "
    "index widget report token session"
).split()
BRANCHES = (
    "main develop release feature-login feature-cache hotfix-crash docs-update refactor-io "
    "experiment spike-ui"
).split()


def _git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "Ada",
        "GIT_AUTHOR_EMAIL": "ada@example.com",
        "GIT_COMMITTER_NAME": "Ada",
        "GIT_COMMITTER_EMAIL": "ada@example.com",
        "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z",
        "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z",
    }
    done = subprocess.run(
        ["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True
    )
    return done.stdout.strip()


def build_repositories(root: Path, count: int, seed: int) -> list[dict[str, str]]:
    """``count`` small repositories under ``root`` (seeded: the same every run), each with a
    branch and 2-3 commits; what each one's answers are, read back from git."""
    rng = random.Random(seed)
    repos = []
    for i in range(count):
        repo = root / f"r{i:03d}"
        repo.mkdir(parents=True, exist_ok=True)
        branch = rng.choice(BRANCHES)
        _git(repo, "init", "-q", "-b", branch)
        for n in range(rng.randint(2, 3)):
            (repo / f"file{n}.txt").write_text(f"{i} {n}\n")
            _git(repo, "add", "-A")
            _git(
                repo,
                "commit",
                "-q",
                "-m",
                f"{rng.choice(WORDS).capitalize()} the {rng.choice(NOUNS)}",
            )
        repos.append(
            {
                "path": str(repo),
                "branch": _git(repo, "branch", "--show-current"),
                "subject": _git(repo, "log", "-1", "--format=%s"),
            }
        )
    return repos


def exact_answer(scenario: Any, trajectory: art.Trajectory) -> float:
    """1.0 when the final answer states the expected one (``art_mcp.contains_answer``), else
    0: no partial credit, so the figure is a success rate."""
    from art_mcp.rewards import contains_answer

    return float(contains_answer(trajectory.metadata.get("final_answer"), scenario.answer))


def git_source(
    seed: int, max_tokens: int, root: Path, server: Any, errlog: Any, max_turns: int = MAX_TURNS
) -> Source:
    import art_mcp

    repos = build_repositories(root, 200, seed)
    rng = random.Random(seed + 1)
    tasks = []
    for repo in repos:
        for kind in ("branch", "subject"):
            question = (
                f"What is the current branch of the git repository at {repo['path']}?"
                if kind == "branch"
                else f"What is the subject of the latest commit in the git repository at "
                f"{repo['path']}?"
            )
            tasks.append(art_mcp.Scenario(task=question, answer=repo[kind]))
    rng.shuffle(tasks)
    settings = _tool_settings(
        max_tokens, max_turns, 48, GIT_PROMPT, tools=GIT_TOOLS, connect_timeout_s=60.0
    )
    return _mcp_source(
        "git",
        "PyPI mcp-server-git over 200 generated repositories: the current branch "
        "or the latest commit's subject",
        tasks,
        server,
        exact_answer,
        settings,
        errlog,
    )


SOURCES = ("verifiers", "calculator", "time", "git")


def describe(source: Source) -> str:
    """One line: the source, its description and split sizes."""
    return (
        f"{source.name}: {source.description}; train {len(source.train)}, val "
        f"{len(source.val)}, test {len(source.test)} tasks"
    )
