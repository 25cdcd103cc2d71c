"""One run of a command-line agent on a task, as a trajectory.

Each run gets a fresh temporary copy of the task's folder (its working directory), its own
empty ``HOME`` and ``TMPDIR``, and an environment made only of ``PATH``, the locale, the
rollout's URLs and key (``run.env()``) and the agent's own variables: no user configuration
or credentials reach the agent, and whatever it writes stays in the run's folder, removed
afterwards. The agent runs in its own process group (and, where the OS allows, its own
network and PID namespaces: the gateway is the only address it can reach), bounded in time
and output (``sandbox``). Then the task's check command runs in the same folder: its reward
is the number on the last line it prints, else 1.0 for exit status 0 and 0.0 otherwise.
Every call the agent made is in the trajectory, token-exact, whichever API it spoke.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import art_core as art
from art_cli_agents.agents import CLIAgent
from art_cli_agents.sandbox import Limits, Network, ProcessResult, run_sandboxed

# Kept in the trajectory's logs: the end of the agent's and the check's output.
LOG_TAIL_CHARS = 4000


@dataclass(frozen=True)
class Task:
    """What an agent is asked to do: a prompt, a folder it works in (copied for each run; an
    empty folder when None), and a check command that scores the folder afterwards (a list
    of arguments, or a string run by ``sh -c``; no check: reward 0).

    Example:
        >>> Task("Make the tests pass", folder="tasks/fizzbuzz", check="python -m pytest -q")
        Task(prompt='Make the tests pass', folder='tasks/fizzbuzz', check='python -m pytest -q', metadata={})
    """

    prompt: str
    folder: str | Path | None = None
    check: str | Sequence[str] | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def check_argv(self) -> list[str] | None:
        if self.check is None:
            return None
        if isinstance(self.check, str):
            return ["sh", "-c", self.check]
        return list(self.check)


def reward_of(check: ProcessResult | None) -> float:
    """The reward a check's result gives: the number on its last non-empty output line, else
    1.0 when it exited 0, else 0.0 (a check that timed out scores 0).

    Example:
        >>> reward_of(ProcessResult(0, False, 0.1, "3 passed\\n0.75\\n", "", 14, "open"))
        0.75
        >>> reward_of(ProcessResult(1, False, 0.1, "1 failed\\n", "", 9, "open"))
        0.0
    """
    if check is None or check.timed_out:
        return 0.0
    lines = [line.strip() for line in check.stdout.splitlines() if line.strip()]
    if lines:
        try:
            value = float(lines[-1])
        except ValueError:
            pass
        else:
            if value == value and abs(value) != float("inf"):  # not NaN or infinite
                return value
    return 1.0 if check.exit_code == 0 else 0.0


def _base_environment(home: Path, tmp: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": str(home),
        "TMPDIR": str(tmp),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "CI": "1",
    }


def _write_files(home: Path, files: Mapping[str, str]) -> None:
    for relative, text in files.items():
        path = home / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def _gateway_address(base_url: str) -> tuple[str, int]:
    parts = urlsplit(base_url)
    return parts.hostname or "127.0.0.1", parts.port or (443 if parts.scheme == "https" else 80)


def _tail(text: str) -> str:
    return text[-LOG_TAIL_CHARS:]


async def rollout(
    model: art.TrainableModel,
    agent: CLIAgent,
    task: Task,
    *,
    limits: Limits | None = None,
    network: Network = "auto",
    metadata: Mapping[str, Any] | None = None,
) -> art.Trajectory:
    """Run ``agent`` once on ``task`` against ``model`` and return the scored trajectory
    (see the module). Metrics: ``exit_code`` (-1 when killed by the timeout), ``timed_out``,
    ``agent_seconds``, ``output_bytes``, ``check_exit_code``, ``network_isolated``.

    Example:
        >>> trajectory = await rollout(model, codex("codex"), Task("say hi"))  # doctest: +SKIP
    """
    limits = limits or Limits()
    scratch = Path(tempfile.mkdtemp(prefix="art-cli-"))
    try:
        work, home, tmp = scratch / "work", scratch / "home", scratch / "tmp"
        if task.folder is not None:
            # Links are copied as links (a link out of the task folder is not followed).
            shutil.copytree(task.folder, work, symlinks=True)
        else:
            work.mkdir()
        home.mkdir()
        tmp.mkdir()
        async with art.capture(
            model, metadata={"agent": agent.name, **task.metadata, **(metadata or {})}
        ) as run:
            rollout_env = run.env()
            values = {
                "prompt": task.prompt,
                "model": run.model_name,
                "openai_base_url": rollout_env["OPENAI_BASE_URL"],
                "anthropic_base_url": rollout_env["ANTHROPIC_BASE_URL"],
                "api_key": rollout_env["OPENAI_API_KEY"],
                "home": str(home),
                "workdir": str(work),
            }
            _write_files(home, agent.config_files(values))
            env = {**_base_environment(home, tmp), **rollout_env, **agent.environment(values)}
            result = await run_sandboxed(
                agent.command(values),
                cwd=work,
                env=env,
                limits=limits,
                timeout_s=limits.timeout_s,
                network=network,
                gateway=_gateway_address(run.base_url),
                scratch=scratch,
            )
        check_argv = task.check_argv()
        check = None
        if check_argv is not None:
            check = await run_sandboxed(
                check_argv,
                cwd=work,
                env=_base_environment(home, tmp),
                limits=limits,
                timeout_s=limits.check_timeout_s,
                network=network,
                gateway=None,
                scratch=scratch,
            )
        logs = [
            f"$ {shlex.join(agent.command({**values, 'prompt': '<prompt>'}))}",
            f"exit: {result.exit_code} ({'timed out' if result.timed_out else 'ended'}) after "
            f"{result.seconds:.1f} s; network {result.network}",
            f"stdout (end):\n{_tail(result.stdout)}",
            f"stderr (end):\n{_tail(result.stderr)}",
        ]
        if check is not None:
            logs.append(f"check exit: {check.exit_code}; output (end):\n{_tail(check.stdout)}")
        return run.trajectory(
            reward=reward_of(check),
            metrics={
                "exit_code": -1 if result.exit_code is None else result.exit_code,
                "timed_out": result.timed_out,
                "agent_seconds": result.seconds,
                "output_bytes": result.output_bytes,
                "check_exit_code": -1
                if check is None or check.exit_code is None
                else check.exit_code,
                "network_isolated": result.network == "isolated",
            },
            logs=logs,
        )
    finally:
        await asyncio.to_thread(shutil.rmtree, scratch, True)


async def rollout_group(
    model: art.TrainableModel,
    agent: CLIAgent,
    task: Task,
    n: int,
    *,
    limits: Limits | None = None,
    network: Network = "auto",
) -> art.TrajectoryGroup:
    """``n`` concurrent runs of ``agent`` on ``task``: a group to train on.

    Example:
        >>> group = await rollout_group(model, codex("codex"), task, 4)  # doctest: +SKIP
    """
    group = art.TrajectoryGroup(
        rollout(model, agent, task, limits=limits, network=network) for _ in range(n)
    )
    (gathered,) = await art.gather_trajectory_groups([group], pbar_desc=None)
    return gathered
