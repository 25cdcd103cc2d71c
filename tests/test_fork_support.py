"""The fork server the README, benchmark and remote tests start their processes from
(``fork_support``): children side by side, each in the environment, folder, affinity and
limits its request gives, each one's end reported with its status, a hung one killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fork_support import ForkServer

# A fork server without the heavy imports: what is tested is the forking, not the imports.
SERVER = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from fork_support import run_script, zygote
zygote(run_script, preimport=())
"""
REPORT = """
import json, os, resource, sys, time
print(json.dumps({
    "cwd": os.getcwd(),
    "marker": os.environ.get("FORK_TEST_MARKER"),
    "gone": os.environ.get("FORK_TEST_GONE"),
    "cores": sorted(os.sched_getaffinity(0)),
    "files": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
    "argv": sys.argv[1:],
}), flush=True)
if sys.argv[1:] == ["wait"]:
    time.sleep(600)
sys.exit(int(sys.argv[1]) if sys.argv[1:] and sys.argv[1].isdigit() else 0)
"""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ForkServer]:
    (tmp_path / "server.py").write_text(SERVER)
    env = {**os.environ, "FORK_TEST_GONE": "set in the server"}
    forks = ForkServer([sys.executable, str(tmp_path / "server.py")], env)
    assert forks.ready
    yield forks
    forks.close()
    assert forks.process.returncode == 0


def test_children_run_side_by_side_each_with_its_own_settings(
    server: ForkServer, tmp_path: Path
) -> None:
    script = tmp_path / "report.py"
    script.write_text(REPORT)
    (tmp_path / "a").mkdir()
    core = sorted(os.sched_getaffinity(0))[-1]
    waiting = server.start(
        {
            "argv": [str(script), "wait"],
            "cwd": str(tmp_path / "a"),
            "environ": {"FORK_TEST_MARKER": "a", "PATH": os.environ["PATH"]},
            "cores": [core],
            "max_open_files": 256,
            "out": str(tmp_path / "a.out"),
        }
    )
    assert waiting.poll() is None
    exiting = server.start(
        {
            "argv": [str(script), "3"],
            "cwd": str(tmp_path),
            "env": {"FORK_TEST_MARKER": "b"},
            "out": str(tmp_path / "b.out"),
            "err": str(tmp_path / "b.err"),
        }
    )
    assert exiting.wait(60) == 3 and exiting.returncode == 3
    assert waiting.poll() is None  # the other one still runs
    b = json.loads((tmp_path / "b.out").read_text())
    assert b["marker"] == "b" and b["gone"] == "set in the server" and b["argv"] == ["3"]
    assert b["cwd"] == str(tmp_path)
    os.kill(waiting.pid, signal.SIGKILL)
    assert waiting.wait(60) == -9
    a = json.loads((tmp_path / "a.out").read_text())
    # The whole environment replaced, the folder, the core and the file limit applied.
    assert a == {
        "cwd": str(tmp_path / "a"),
        "marker": "a",
        "gone": None,
        "cores": [core],
        "files": 256,
        "argv": ["wait"],
    }
    assert server.running() == 0


def test_a_child_past_its_time_is_killed_with_what_it_started(
    server: ForkServer, tmp_path: Path
) -> None:
    script = tmp_path / "hang.py"
    pid_file = tmp_path / "grandchild.pid"
    script.write_text(
        "import subprocess, sys, time\n"
        f"child = subprocess.Popen(['sleep', '600'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(600)\n"
    )
    out = tmp_path / "out.txt"
    status = server.run({"argv": [str(script)], "cwd": str(tmp_path), "out": str(out)}, 2)
    assert status == -9
    assert "(killed after 2 s)" in out.read_text()
    grandchild = int(pid_file.read_text())
    done = subprocess.run(["ps", "-o", "stat=", "-p", str(grandchild)], capture_output=True)
    assert done.returncode != 0 or done.stdout.decode().startswith("Z")  # gone, or reaped soon
