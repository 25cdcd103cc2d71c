"""Hostile agents stay contained (issue 47): an agent that writes outside its folders, forks a
tree of detached processes, hangs, floods its output, forks without end or connects to
another server is bounded, killed with everything it started, and reported in its run's
metrics, and leaves nothing outside its scratch folder. Where this machine cannot isolate a
run, each test checks that the metrics say so instead; where a test can, it forces the open
branch too, so both are run here."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

import art_cli_agents as cli
import pytest
from art_cli_agents import sandbox
from art_cli_agents.confine import pid_max_is_per_namespace
from art_cli_agents.sandbox import KILL_GRACE_S, RUN_ROOT, filesystem_isolation

import art_core as art

HERE = Path(__file__).parent
AGENT = [sys.executable, str(HERE / "fake_agent.py")]


def fake(mode: str, *args: str) -> cli.CLIAgent:
    return cli.CLIAgent("fake", [*AGENT, mode, *args])


def output(trajectory: art.Trajectory, which: str = "stdout") -> str:
    """The kept end of the agent's stdout (or the check's output: ``which="check"``)."""
    line = next(line for line in trajectory.logs if line.startswith(which))
    return line.split("\n", 1)[1]


def processes_named(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
        except OSError:
            pass
    return found


def settled(marker: str, expected: int) -> list[int]:
    """The processes named ``marker``, once as many as ``expected`` are left (a process just
    sent SIGKILL takes a moment to go), or after 3 s."""
    deadline = time.monotonic() + 3
    while len(left := processes_named(marker)) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("filesystem", ["auto", "open"])
async def test_writes_outside_the_runs_folders_stay_out(
    cli_model: art.TrainableModel, filesystem: sandbox.Filesystem
) -> None:
    """Directly, through ``..`` and through links it makes: to a file in /tmp (a private
    /tmp, isolated: written there, gone with the run) and to one in the task's own folder
    (read-only, isolated); the check command, the same program, no better."""
    tag = uuid.uuid4().hex
    # Next to this file, not under /tmp: a folder of the machine, read-only to the run.
    task_folder = Path(tempfile.mkdtemp(prefix=f".task-{tag}-", dir=HERE))
    (task_folder / "README.md").write_text("a task\n")
    in_tmp, in_task = Path("/tmp") / f"art-escape-{tag}", task_folder / f"escape-{tag}"
    outside = [
        target.with_name(target.name + suffix)
        for target in (in_tmp, in_task)
        for suffix in ("", ".via-link", ".file-link")
    ]
    escape = [*AGENT, "escape", str(in_tmp), str(in_task)]
    task = cli.Task("escape", folder=task_folder, check=escape)
    try:
        trajectory = await cli.rollout(
            cli_model, cli.CLIAgent("fake", escape), task, filesystem=filesystem
        )
        isolated = filesystem == "auto" and filesystem_isolation()
        assert trajectory.metrics["filesystem_isolated"] == isolated, trajectory.logs
        assert f"filesystem {'isolated' if isolated else 'open'}" in trajectory.logs[1]
        assert trajectory.metrics["exit_code"] == 0 and trajectory.metrics["check_exit_code"] == 0
        agent, check = json.loads(output(trajectory)), json.loads(output(trajectory, "check"))
        for report in (agent, check):
            # Where a real agent writes (Codex: $HOME/.codex, TMPDIR, /tmp) it still can.
            assert set(report["allowed"].values()) == {"written"}, report
            assert len(report["escapes"]) == 8
            for attempt, outcome in report["escapes"].items():
                if not isolated or str(in_tmp) in attempt:  # the machine's /tmp, or its own
                    assert outcome == "written", (attempt, report)
                else:
                    assert outcome == "refused: Read-only file system", (attempt, report)
        written = [path for path in outside if path.exists()]
        if isolated:
            assert written == []
            assert sorted(os.listdir(task_folder)) == ["README.md"]
            # Not even the check, after the agent, saw what the agent wrote in its /tmp.
            assert check["seen"] == []
        else:
            assert written == outside
            assert check["seen"] == [str(in_tmp), str(in_task)]
        # Links out of the run's folder were removed with it, never followed.
        assert (task_folder / "README.md").read_text() == "a task\n"
    finally:
        for path in outside:
            path.unlink(missing_ok=True)
        shutil.rmtree(task_folder)


@pytest.mark.parametrize("filesystem", ["auto", "open"])
async def test_every_isolated_run_sees_its_folders_at_the_same_paths(
    cli_model: art.TrainableModel, filesystem: sandbox.Filesystem
) -> None:
    """Two concurrent runs of a group, isolated: each sees its folder, HOME and TMPDIR at
    RUN_ROOT's paths (agents name them in their prompts: the same prompts, shared by the
    prefix cache), in its environment, its command and its configuration file; its check
    too. Each sees its own files there, not the other's, and nothing is made at those paths
    on this machine. Open: each sees its real folders."""
    made_here = RUN_ROOT.exists()  # then this machine has one of its own: not checked
    words = "${workdir} ${home}"
    agent = cli.CLIAgent(
        "fake",
        [*AGENT, "paths", "${workdir}", "${home}"],
        files={".config/fake/paths": words},
        env={"FAKE_PATHS": words},
    )
    task = cli.Task("paths", check=[*AGENT, "paths"])
    group = await cli.rollout_group(cli_model, agent, task, 2, filesystem=filesystem)
    isolated = filesystem == "auto" and filesystem_isolation()
    assert len(group.trajectories) == 2, group.exceptions
    runs = []
    for trajectory in group.trajectories:
        assert trajectory.metrics["filesystem_isolated"] == isolated, trajectory.logs
        assert trajectory.metrics["exit_code"] == 0 and trajectory.metrics["check_exit_code"] == 0
        runs.append((json.loads(output(trajectory)), json.loads(output(trajectory, "check"))))
    for (agent_saw, check_saw), other in zip(runs, reversed(runs), strict=True):
        work, home, tmp = agent_saw["cwd"], agent_saw["home"], agent_saw["tmpdir"]
        if isolated:
            assert (work, home, tmp) == tuple(str(RUN_ROOT / f) for f in ("work", "home", "tmp"))
        else:  # its real folders, its own
            assert Path(work).parent == Path(home).parent == Path(tmp).parent
            assert Path(work).parent.name.startswith("art-cli-")
            assert work != other[0]["cwd"]
        assert agent_saw["words"] == [work, home]
        assert agent_saw["config"] == agent_saw["env"]["FAKE_PATHS"] == f"{work} {home}"
        assert agent_saw["env"]["XDG_CONFIG_HOME"] == f"{home}/.config"
        assert agent_saw["holds"] == {"cwd": [], "home": [".config"], "tmpdir": []}
        # The check, in the same folders, seen at the same paths: the agent's marks, and
        # not the other run's.
        assert (check_saw["cwd"], check_saw["home"], check_saw["tmpdir"]) == (work, home, tmp)
        mark, others = agent_saw["mark"], other[0]["mark"]
        for name, held in check_saw["holds"].items():
            assert mark in held and others not in held, (name, held)
    for trajectory, (saw, _) in zip(group.trajectories, runs, strict=True):
        state = "isolated" if isolated else "open"
        said = f"filesystem {state} (cwd {saw['cwd']}, HOME {saw['home']})"
        assert said in trajectory.logs[1], trajectory.logs[1]
    if not made_here:
        assert not RUN_ROOT.exists()


async def test_without_isolation_runs_say_so_and_demands_refuse(
    cli_model: art.TrainableModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As on a machine without mount namespaces, then without any namespaces."""
    monkeypatch.setattr(sandbox, "filesystem_isolation", lambda: False)
    with pytest.raises(RuntimeError, match="filesystem isolation is not possible"):
        await cli.rollout(cli_model, fake("flood", "1"), cli.Task("x"), filesystem="isolated")
    trajectory = await cli.rollout(cli_model, fake("flood", "1"), cli.Task("x"))
    assert not trajectory.metrics["filesystem_isolated"]
    assert trajectory.metrics["network_isolated"] == (cli.isolation_prefix() is not None)
    # Its real folders, not RUN_ROOT's (which only an isolated filesystem can show).
    assert (
        "filesystem open (cwd /" in trajectory.logs[1] and str(RUN_ROOT) not in trajectory.logs[1]
    )
    monkeypatch.setattr(sandbox, "isolation_prefix", lambda: None)
    with pytest.raises(RuntimeError, match="network isolation is not possible"):
        await cli.rollout(cli_model, fake("flood", "1"), cli.Task("x"), network="isolated")
    trajectory = await cli.rollout(cli_model, fake("flood", "1"), cli.Task("x"))
    assert trajectory.metrics["exit_code"] == 0
    assert not trajectory.metrics["network_isolated"]
    assert not trajectory.metrics["filesystem_isolated"]
    assert trajectory.metrics["process_limit"] == 0


async def test_a_run_folder_cannot_shadow_the_sandboxs_modules(
    cli_model: art.TrainableModel, tmp_path: Path
) -> None:
    """The sandbox's launcher starts in the run's folder, with every privilege, before it
    confines anything: modules planted there (by a task, or by the agent for its check) are
    not imported."""
    planted = Path(tempfile.gettempdir()) / f"art-shadow-{uuid.uuid4().hex}"
    task_folder = tmp_path / "task"
    (task_folder / "art_cli_agents").mkdir(parents=True)
    source = f"open({str(planted)!r}, 'w').write('imported')\n"
    for module in ("json.py", "ctypes.py", "signal.py", "art_cli_agents/__init__.py"):
        (task_folder / module).write_text(source)
    try:
        trajectory = await cli.rollout(
            cli_model, fake("flood", "1"), cli.Task("x", folder=task_folder, check=["true"])
        )
        assert trajectory.metrics["exit_code"] == 0 and trajectory.reward == 1.0
        assert not planted.exists()
    finally:
        planted.unlink(missing_ok=True)


@pytest.mark.parametrize("isolation", ["auto", "open"])
async def test_a_process_tree_dies_with_the_agent(
    cli_model: art.TrainableModel, isolation: sandbox.Network
) -> None:
    """A child, a child in its own session and a double-forked daemon deaf to SIGTERM."""
    marker = f"art-tree-{uuid.uuid4().hex}"
    trajectory = await cli.rollout(
        cli_model,
        fake("tree", marker, "exit"),
        cli.Task("tree"),
        network=isolation,
        filesystem=isolation,
    )
    isolated = isolation == "auto" and cli.isolation_prefix() is not None
    left = settled(marker, 0 if isolated else 2)
    try:
        assert trajectory.metrics["exit_code"] == 0, trajectory.logs
        assert "tree up" in output(trajectory)
        if isolated:  # its own PID namespace: all three were alive, and are gone
            assert trajectory.metrics["processes_killed"] == 3
            assert left == []
        else:  # only the child left in its process group is found, and killed
            assert trajectory.metrics["processes_killed"] == 1
            assert len(left) == 2
    finally:
        kill_all(left)


async def test_a_hung_agent_is_killed_by_the_timeout_with_its_tree(
    cli_model: art.TrainableModel,
) -> None:
    """The agent ignores SIGTERM too: SIGKILL after the grace, and the namespace goes."""
    marker = f"art-hang-{uuid.uuid4().hex}"
    limits = cli.Limits(timeout_s=2)
    trajectory = await cli.rollout(
        cli_model, fake("tree", marker, "hang"), cli.Task("hang"), limits=limits
    )
    isolated = cli.isolation_prefix() is not None
    left = settled(marker, 0 if isolated else 2)
    try:
        assert trajectory.metrics["timed_out"] and trajectory.metrics["exit_code"] == -1
        assert trajectory.metrics["agent_seconds"] < 2 + KILL_GRACE_S + 3
        assert "tree up" in output(trajectory)
        assert trajectory.calls == []
        if isolated:  # the agent and its three processes, all killed
            assert trajectory.metrics["processes_killed"] == 4
            assert left == []
        else:  # the agent and its child in the group; the two that left it survive
            assert trajectory.metrics["processes_killed"] == 2
            assert len(left) == 2
    finally:
        kill_all(left)


async def test_an_agent_without_a_turn_bound_is_stopped_after_max_calls(
    cli_model: art.TrainableModel,
) -> None:
    """``Limits.max_calls``: an agent that calls the model forever (Codex CLI has no turn
    bound) is stopped ``settle_s`` after its 2nd answer, having acted on it (the check sees
    both turns), long before its timeout, and not counted as timed out; a third call is
    never made (the agent works 5 s between calls)."""
    limits = cli.Limits(timeout_s=300, max_calls=2, settle_s=0.5)
    task = cli.Task("turns", check='test "$(cat turns.txt)" = 2')
    trajectory = await cli.rollout(cli_model, fake("turns", "5"), task, limits=limits)
    assert len(trajectory.calls) == 2, trajectory.logs
    assert trajectory.metrics["stopped_after_calls"] is True
    assert trajectory.metrics["timed_out"] is False and trajectory.metrics["exit_code"] == -1
    assert trajectory.reward == 1.0, trajectory.logs
    assert trajectory.metrics["agent_seconds"] < 120
    assert "stopped after its last call" in trajectory.logs[1]
    with pytest.raises(ValueError, match="max_calls"):
        cli.Limits(max_calls=0)
    with pytest.raises(ValueError, match="settle_s"):
        cli.Limits(settle_s=-1.0)


async def test_an_agent_that_asks_past_max_calls_is_refused_and_its_run_ends_then(
    cli_model: art.TrainableModel,
) -> None:
    """An agent that asks again at once: its call past ``max_calls`` is refused by the
    gateway (unsampled, unrecorded) and the run ends then, by itself on the refusal or
    stopped, not after ``settle_s`` (here longer than the run's timeout: waiting for it
    would time the run out)."""
    limits = cli.Limits(timeout_s=300, max_calls=2, settle_s=600)
    task = cli.Task("turns", check='test "$(cat turns.txt)" = 2')
    trajectory = await cli.rollout(cli_model, fake("turns", "0"), task, limits=limits)
    assert len(trajectory.calls) == 2, trajectory.logs
    assert trajectory.metrics["stopped_after_calls"] is True, trajectory.logs
    assert trajectory.metrics["timed_out"] is False, trajectory.logs
    assert trajectory.reward == 1.0, trajectory.logs  # it acted on both answers
    assert "Limits.max_calls" in trajectory.logs[1]


async def test_a_flood_of_output_is_bounded(cli_model: art.TrainableModel) -> None:
    limits = cli.Limits(max_output_bytes=1000)
    trajectory = await cli.rollout(
        cli_model, fake("flood", str(5_000_000)), cli.Task("flood"), limits=limits
    )
    assert trajectory.metrics["output_bytes"] == 5_000_000, trajectory.logs
    assert trajectory.metrics["exit_code"] == 0
    assert len(output(trajectory)) <= 1000


async def test_a_fork_bomb_is_bounded(cli_model: art.TrainableModel) -> None:
    """Processes (and threads) alive at once stop at the bound, where the kernel has one per
    PID namespace (Linux 6.14+); the bomb here stops itself at 400."""
    limits = cli.Limits(max_processes=1)
    trajectory = await cli.rollout(cli_model, fake("bomb", "400"), cli.Task("bomb"), limits=limits)
    assert trajectory.metrics["exit_code"] == 0, trajectory.logs
    started = int(output(trajectory).split()[-1])
    if cli.isolation_prefix() is not None and pid_max_is_per_namespace():
        # 1 + 300 (see Limits): the launcher, the forwarder and the agent take three.
        assert trajectory.metrics["process_limit"] == 301
        assert started == 301 - 3
        assert "refused: Resource temporarily unavailable" in output(trajectory)
    else:
        assert trajectory.metrics["process_limit"] == 0
        assert started == 400
    # Every one was still sleeping when the agent ended: each counted, each killed.
    assert trajectory.metrics["processes_killed"] == started


async def test_only_the_gateway_is_reachable(cli_model: art.TrainableModel) -> None:
    """Another server on this machine's loopback is out of reach when isolated."""

    async def hello(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(hello, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        trajectory = await cli.rollout(
            cli_model, fake("probe", "127.0.0.1", str(port)), cli.Task("probe")
        )
        opened = await cli.rollout(
            cli_model, fake("probe", "127.0.0.1", str(port)), cli.Task("probe"), network="open"
        )
    assert "reached" in output(opened)
    assert not opened.metrics["network_isolated"]
    if cli.isolation_prefix() is not None:
        assert trajectory.metrics["network_isolated"]
        assert "unreachable" in output(trajectory)
    else:  # this machine allows no namespaces: the run says its network was open
        assert not trajectory.metrics["network_isolated"]
        assert "reached" in output(trajectory)


async def test_a_node_program_writes_its_home_and_tmpdir(cli_model: art.TrainableModel) -> None:
    """What Codex CLI and Claude Code (Node programs) need: $HOME/.codex, ~/.claude, TMPDIR,
    a child process, a worker thread."""
    if shutil.which("node") is None:
        pytest.fail("node is missing: the command-line agents need Node 20 (and so does this)")
    script = """
const fs = require("fs"), os = require("os"), path = require("path");
for (const dir of [".codex", ".claude"]) {
  fs.mkdirSync(path.join(os.homedir(), dir), { recursive: true });
  fs.writeFileSync(path.join(os.homedir(), dir, "config"), "y");
}
fs.writeFileSync(path.join(os.tmpdir(), "x"), "y");
fs.mkdtempSync(path.join(os.tmpdir(), "node-"));
require("child_process").execFileSync("sh", ["-c", "echo child > child.txt"]);
const { Worker } = require("worker_threads");
new Worker("process.exit(0)", { eval: true }).on("exit", () => console.log("ok", os.tmpdir()));
"""
    trajectory = await cli.rollout(
        cli_model, cli.CLIAgent("node", ["node", "-e", script]), cli.Task("node")
    )
    assert trajectory.metrics["exit_code"] == 0, trajectory.logs
    assert output(trajectory).startswith("ok /")


async def test_programs_under_the_hosts_tmp_stay_reachable_but_other_runs_do_not(
    cli_model: art.TrainableModel, tmp_path: Path
) -> None:
    """The run's private /tmp shows the host's /tmp read-only (a checkout, a virtual
    environment or the agent itself may live there: a CI clone in /tmp), except the scratch
    folders of runs (another run's work is not one read away)."""
    if not filesystem_isolation():
        pytest.fail("this test needs an isolated filesystem (Linux namespaces): none here")
    program = Path(tempfile.mkdtemp(prefix="art-test-program-", dir="/tmp")) / "agent.sh"
    other_run = Path(tempfile.mkdtemp(prefix="art-cli-other-", dir="/tmp"))
    try:
        (other_run / "solution.txt").write_text("the answer\n")
        program.write_text(
            "#!/bin/sh\n"
            f"test -e {other_run}/solution.txt && echo other-run-visible\n"
            f"echo edit > {program.parent}/edited 2>/dev/null || echo host-tmp-read-only\n"
            "echo ran > ran.txt\n"
        )
        program.chmod(0o755)
        trajectory = await cli.rollout(
            cli_model,
            cli.CLIAgent("under-tmp", [str(program)]),
            cli.Task("run", check="test -f ran.txt"),
        )
        assert trajectory.metrics["filesystem_isolated"] and trajectory.reward == 1.0, (
            trajectory.logs
        )
        said = output(trajectory)
        assert "host-tmp-read-only" in said and "other-run-visible" not in said, said
        assert not (program.parent / "edited").exists()
    finally:
        shutil.rmtree(program.parent, ignore_errors=True)
        shutil.rmtree(other_run, ignore_errors=True)
