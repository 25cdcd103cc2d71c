"""One run of a command-line agent on a task, as a trajectory.

Each run gets a fresh temporary copy of the task's folder (its working directory), its own
empty ``HOME`` and ``TMPDIR``, and an environment made only of ``PATH``, the locale, the
rollout's URLs and key (``run.env()``) and the agent's own variables: no user configuration
or credentials reach the agent, and whatever it writes stays in the run's folder, removed
afterwards. The agent runs in its own process group (and, where the OS allows, its own
network, PID and mount namespaces: the gateway is the only address it can reach, and its
run's folder the only place it can write), bounded in time, output and processes
(``sandbox``). Then the task's check command runs in the same folder: its reward
is the number on the last line it prints, else 1.0 for exit status 0 and 0.0 otherwise.
Every call the agent made is in the trajectory, token-exact, whichever API it spoke.

Where the filesystem is isolated, every run sees its folders at the same paths
(``sandbox.RUN_ROOT``: ``/tmp/art-run/work``, ``/home`` and ``/tmp``), whatever their real
ones: its environment, its command and its configuration files say those, so agents that name
their folders in their prompts send the same prompts in every run of a group, and the
inference engine's prefix cache shares them. Elsewhere it sees their real paths.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from art_cli_agents.sandbox import (
    RUN_ROOT,
    Filesystem,
    Limits,
    Network,
    ProcessResult,
    isolates_filesystem,
    run_sandboxed,
)

# Kept in the trajectory's logs: the end of the agent's and the check's output.
LOG_TAIL_CHARS = 4000


@dataclass(frozen=True)
class Task:
    """What an agent is asked to do: a prompt, a folder it works in (copied for each run; an
    empty folder when None), and a check command that scores the folder afterwards (a list
    of arguments, or a string run by ``sh -c``; no check: reward 0). ``check_reads``: files
    or folders outside the run's folder that the check reads (its scripts, the expected
    answers): an isolated run has a private ``/tmp`` that would hide them, so they are shown
    to the check, read-only, at their own paths (never to the agent). Absolute paths.

    Example:
        >>> Task("Make the tests pass", folder="tasks/fizzbuzz", check="python -m pytest -q")
        Task(prompt='Make the tests pass', folder='tasks/fizzbuzz', check='python -m pytest -q', metadata={}, check_reads=())
    """

    prompt: str
    folder: str | Path | None = None
    check: str | Sequence[str] | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    check_reads: Sequence[str | Path] = ()

    def __post_init__(self) -> None:
        relative = [str(path) for path in self.check_reads if not Path(path).is_absolute()]
        if relative:
            raise ValueError(f"check_reads must be absolute paths: {relative}")

    def check_argv(self) -> list[str] | None:
        if self.check is None:
            return None
        if isinstance(self.check, str):
            return ["sh", "-c", self.check]
        return list(self.check)


def run_sampling(sampling: art.RolloutSampling | None, *keys: int) -> art.RolloutSampling | None:
    """``sampling`` for one run among many: its seed (when it has one) mixed with ``keys``
    (a group's index, a run's index...), so that runs given the same settings still differ,
    reproducibly.

    Example:
        >>> base = art.RolloutSampling(seed=7, temperature=1.0)
        >>> [run_sampling(base, i).seed for i in range(3)]
        [7000021, 7000022, 7000023]
        >>> run_sampling(art.RolloutSampling(temperature=1.0), 1).seed is None
        True
    """
    return None if sampling is None else sampling.for_run(*keys)


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
    filesystem: Filesystem = "auto",
    sampling: art.RolloutSampling | None = None,
) -> art.Trajectory:
    """Run ``agent`` once on ``task`` against ``model`` and return the scored trajectory
    (see the module). Metrics: ``exit_code`` (-1 when killed by the timeout or stopped),
    ``timed_out``, ``stopped_after_calls`` (ended by ``limits.max_calls``: stopped, or
    ended by itself once the gateway refused a call past it),
    ``agent_seconds``, ``output_bytes``, ``check_exit_code``, ``network_isolated``,
    ``filesystem_isolated``, ``processes_killed`` (the agent's processes still alive when it
    ended or timed out, all killed), ``process_limit`` (0: none). Its second log line says
    where the run saw its working folder and ``HOME``. ``sampling``: the gateway samples
    every call of the run with these settings, whatever the agent asks
    (``art.capture``'s; agents send no seed, and a temperature of their own).

    Example:
        >>> trajectory = await rollout(model, codex("codex"), Task("say hi"))  # needs a registered model, and the codex CLI (an npm install)  # doctest: +SKIP
    """
    limits = limits or Limits()
    # Isolated, the run sees its folders at RUN_ROOT's, the same in every run (see the module).
    seen_root = RUN_ROOT if isolates_filesystem(filesystem) else None
    scratch = Path(tempfile.mkdtemp(prefix="art-cli-"))
    try:
        folders = _RunFolders.make(scratch, task, seen_root)
        async with art.capture(
            model,
            metadata={"agent": agent.name, **task.metadata, **(metadata or {})},
            sampling=sampling,
            max_calls=limits.max_calls,
        ) as run:
            rollout_env = run.env()
            values = {
                "prompt": task.prompt,
                "model": run.model_name,
                "openai_base_url": rollout_env["OPENAI_BASE_URL"],
                "anthropic_base_url": rollout_env["ANTHROPIC_BASE_URL"],
                "api_key": rollout_env["OPENAI_API_KEY"],
                "home": str(folders.seen_home),
                "workdir": str(folders.seen_work),
            }
            # Written here at their real paths; what they say is what the run sees.
            _write_files(folders.home, agent.config_files(values))
            env = {
                **_base_environment(folders.seen_home, folders.seen_tmp),
                **rollout_env,
                **agent.environment(values),
            }
            stop = asyncio.Event()
            watcher = (
                asyncio.create_task(_stop_after_calls(run, limits, stop))
                if limits.max_calls is not None
                else None
            )
            try:
                result = await run_sandboxed(
                    agent.command(values),
                    cwd=folders.work,
                    env=env,
                    limits=limits,
                    timeout_s=limits.timeout_s,
                    network=network,
                    gateway=_gateway_address(run.base_url),
                    scratch=scratch,
                    filesystem=filesystem,
                    writable=folders.writable,
                    seen_at=folders.seen_at,
                    stop=stop,
                )
            finally:
                if watcher is not None:
                    watcher.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await watcher
            # Whether it asked past its bound, ended by the stop or by itself on the refusal.
            at_limit = result.stopped or (
                limits.max_calls is not None and await run.calls_refused() > 0
            )
        check = await _run_check(task, folders, limits, network=network, filesystem=filesystem)
        command = shlex.join(agent.command({**values, "prompt": "<prompt>"}))
        return run.trajectory(
            reward=reward_of(check),
            metrics=_run_metrics(result, check, at_limit),
            logs=_run_logs(command, result, check, folders, at_limit),
        )
    finally:
        await asyncio.to_thread(shutil.rmtree, scratch, True)


# How often a run with ``Limits.max_calls`` asks the gateway how far it got.
_CALLS_POLL_S = 0.5


async def _stop_after_calls(run: art.Run, limits: Limits, stop: asyncio.Event) -> None:
    """Set ``stop`` once the agent asks for a call past ``limits.max_calls`` (the gateway
    refused it, unsampled: the agent acted on its last answer, its tools ran, before it asked
    again), or ``limits.settle_s`` after the last allowed call was answered, whichever comes
    first (an agent that neither asks again nor ends)."""
    assert limits.max_calls is not None
    # No event says a call was recorded or refused (the backend may be remote): asked, not
    # told.
    while len(await run.fetch_calls()) < limits.max_calls:
        if await run.calls_refused():
            break
        await asyncio.sleep(_CALLS_POLL_S)
    else:
        loop = asyncio.get_running_loop()
        settled = loop.time() + limits.settle_s
        while loop.time() < settled and not await run.calls_refused():  # noqa: ASYNC110
            await asyncio.sleep(min(_CALLS_POLL_S, limits.settle_s))
    stop.set()


@dataclass(frozen=True)
class _RunFolders:
    """A run's working folder, ``HOME`` and ``TMPDIR`` under its scratch folder, and where
    the run sees them (``seen_at``: None when at their own paths)."""

    scratch: Path
    work: Path
    home: Path
    tmp: Path
    seen_work: Path
    seen_home: Path
    seen_tmp: Path
    seen_at: dict[Path, Path] | None

    @classmethod
    def make(cls, scratch: Path, task: Task, seen_root: Path | None) -> _RunFolders:
        """Create them: the working folder a copy of the task's folder (else empty)."""
        work, home, tmp = scratch / "work", scratch / "home", scratch / "tmp"
        # Where the run sees them, and where they are.
        seen = {folder: (seen_root or scratch) / folder.name for folder in (work, home, tmp)}
        if task.folder is not None:
            # Links are copied as links (a link out of the task folder is not followed).
            shutil.copytree(task.folder, work, symlinks=True)
        else:
            work.mkdir()
        home.mkdir()
        tmp.mkdir()
        return cls(
            scratch,
            work,
            home,
            tmp,
            seen[work],
            seen[home],
            seen[tmp],
            seen if seen_root is not None else None,
        )

    @property
    def writable(self) -> list[Path]:
        return [self.work, self.home, self.tmp]


async def _run_check(
    task: Task,
    folders: _RunFolders,
    limits: Limits,
    *,
    network: Network,
    filesystem: Filesystem,
) -> ProcessResult | None:
    """Run the task's check in the run's folders (None when the task has none)."""
    check_argv = task.check_argv()
    if check_argv is None:
        return None
    return await run_sandboxed(
        check_argv,
        cwd=folders.work,
        env=_base_environment(folders.seen_home, folders.seen_tmp),
        limits=limits,
        timeout_s=limits.check_timeout_s,
        network=network,
        gateway=None,
        scratch=folders.scratch,
        filesystem=filesystem,
        writable=folders.writable,
        seen_at=folders.seen_at,
        readable=[Path(path) for path in task.check_reads],
    )


def _how_it_ended(result: ProcessResult, at_limit: bool) -> str:
    if result.stopped:
        return "stopped after its last call (Limits.max_calls)"
    if at_limit:
        return "ended on the refusal of a call past Limits.max_calls"
    return "timed out" if result.timed_out else "ended"


def _run_logs(
    command: str,
    result: ProcessResult,
    check: ProcessResult | None,
    folders: _RunFolders,
    at_limit: bool,
) -> list[str]:
    """The run's log lines: the command (prompt elided), how it ended, the ends of its
    output and of the check's."""
    logs = [
        f"$ {command}",
        f"exit: {result.exit_code} ({_how_it_ended(result, at_limit)}) after "
        f"{result.seconds:.1f} s; network {result.network}; filesystem {result.filesystem} "
        f"(cwd {folders.seen_work}, HOME {folders.seen_home}); {result.processes_killed} "
        "processes left, killed",
        f"stdout (end):\n{_tail(result.stdout)}",
        f"stderr (end):\n{_tail(result.stderr)}",
    ]
    if check is not None:
        logs.append(f"check exit: {check.exit_code}; output (end):\n{_tail(check.stdout)}")
    return logs


def _run_metrics(
    result: ProcessResult, check: ProcessResult | None, at_limit: bool
) -> dict[str, float | int | bool]:
    """The run's metrics (see ``rollout``)."""
    return {
        "exit_code": -1 if result.exit_code is None else result.exit_code,
        "timed_out": result.timed_out,
        "stopped_after_calls": at_limit,
        "agent_seconds": result.seconds,
        "output_bytes": result.output_bytes,
        "check_exit_code": -1 if check is None or check.exit_code is None else check.exit_code,
        "network_isolated": result.network == "isolated",
        "filesystem_isolated": result.filesystem == "isolated",
        "processes_killed": result.processes_killed,
        "process_limit": result.process_limit or 0,
    }


async def rollout_group(
    model: art.TrainableModel,
    agent: CLIAgent,
    task: Task,
    n: int,
    *,
    limits: Limits | None = None,
    network: Network = "auto",
    filesystem: Filesystem = "auto",
    sampling: art.RolloutSampling | None = None,
) -> art.TrajectoryGroup:
    """``n`` concurrent runs of ``agent`` on ``task``: a group to train on. With a
    ``sampling`` seed, run ``i`` gets its own seed derived from it (``run_sampling``): the
    runs differ, and the same seed replays the same group.

    Example:
        >>> group = await rollout_group(model, codex("codex"), task, 4)  # needs a registered model, and the codex CLI (an npm install)  # doctest: +SKIP
    """
    group = art.TrajectoryGroup(
        rollout(
            model,
            agent,
            task,
            limits=limits,
            network=network,
            filesystem=filesystem,
            sampling=run_sampling(sampling, i),
        )
        for i in range(n)
    )
    (gathered,) = await art.gather_trajectory_groups([group], pbar_desc=None)
    return gathered
