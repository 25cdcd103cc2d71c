"""The hooks of one pytest run that make it fast and safe side by side: the cores and locks
of xdist workers (``workers``), the waits for background installs (``installs``), the
default timeouts and what a hung test leaves behind (``hangs``), and the order of the modules.

``art_core.testing.pytest_plugin`` registers one ``RunHooks`` per run; its state lives on it,
not in module globals.

Module order: heaviest first, so the long modules start early and the workers finish
together; a module with a ``whole_machine`` test last (it waits for the other worker's test).
``$ART_TEST_DURATIONS`` names a JSON file ``{module path from the rootdir: seconds}``
(``tests/durations.json`` in this repository); modules it does not name run after, in
collection order. A module with a ``needs_install`` test starts no earlier than after
``INSTALL_HEADSTART_S`` seconds of other modules' work, so the workers do not sit waiting for
an install that the checks and the first modules would have covered. ``$ART_TEST_DURATIONS_OUT`` names where the run writes its own timings, in
the same form (``bash run.sh test`` writes ``.art/test-durations.json``).

Example:
    >>> order_by_weight(["b.py", "a.py", "c.py"], {"a.py": 30.0, "c.py": 5.0})
    ['a.py', 'c.py', 'b.py']
    >>> weights = {"vllm.py": 250.0, "a.py": 200.0, "b.py": 150.0, "c.py": 10.0}
    >>> order_by_weight(list(weights), weights, deferred={"vllm.py"}, headstart_s=300.0)
    ['a.py', 'b.py', 'vllm.py', 'c.py']
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from art_core.testing import installs
from art_core.testing.workers import CoreShare, RunLocks

try:  # only with the dev extra: pytest-timeout, and psutil to reap what a hung test started
    import pytest_timeout  # noqa: F401

    from art_core.testing import hangs
except ImportError:
    hangs = None  # type: ignore[assignment]

DURATIONS_ENV = "ART_TEST_DURATIONS"
DURATIONS_OUT_ENV = "ART_TEST_DURATIONS_OUT"
_install_failures = pytest.StashKey[str]()
_alarm = pytest.StashKey["hangs.Alarm"]()


# Seconds of module work (summed over the workers) before a module that waits for a background
# install may start: on a fresh 2-core machine the vLLM runtime (the longest) ends about 3
# minutes into the tests.
INSTALL_HEADSTART_S = 400.0


def order_by_weight(
    modules: list[str],
    weights: dict[str, float],
    deferred: set[str] = frozenset(),  # type: ignore[assignment]
    headstart_s: float = INSTALL_HEADSTART_S,
    last: set[str] = frozenset(),  # type: ignore[assignment]
) -> list[str]:
    """``modules`` (each once) heaviest first, the ones without a weight after in their own
    order; each of ``deferred`` no earlier than after ``headstart_s`` of the others' weight;
    ``last`` after all the others (heaviest first among them).

    Example:
        >>> order_by_weight(["a.py", "b.py", "c.py"], {"a.py": 9.0, "b.py": 5.0}, last={"a.py"})
        ['b.py', 'c.py', 'a.py']
    """
    ranked = sorted(dict.fromkeys(modules), key=lambda m: -weights.get(m, 0.0))
    ending = [m for m in ranked if m in last]
    ranked = [m for m in ranked if m not in last]
    first = [m for m in ranked if m not in deferred]
    later = [m for m in ranked if m in deferred]
    done, cut = 0.0, len(first)
    for index, module in enumerate(first):
        if done >= headstart_s:
            cut = index
            break
        done += weights.get(module, 0.0)
    head, tail = first[:cut], first[cut:]
    return head + sorted(later + tail, key=lambda m: -weights.get(m, 0.0)) + ending


def read_weights(path: str) -> dict[str, float]:
    """The ``{module: seconds}`` file at ``path``; a usage error naming the file and what is
    wrong with it when it cannot be read."""
    try:
        weights = json.loads(Path(path).read_text())
        return {str(k): float(v) for k, v in weights.items()}
    except (OSError, ValueError, AttributeError, TypeError) as error:
        raise pytest.UsageError(
            f"{DURATIONS_ENV}={path}: not a readable JSON object of module paths to seconds "
            f"({error})"
        ) from error


class RunHooks:
    """One run's hooks (a pytest plugin object)."""

    def __init__(self, config: pytest.Config) -> None:
        self.is_worker = hasattr(config, "workerinput")
        self.is_controller = not self.is_worker and config.getoption("dist", "no") != "no"
        self.cores: CoreShare | None = None
        self.locks: RunLocks | None = None
        # What xdist tells its worker itself, not the PYTEST_XDIST_* variables it exports: a
        # pytest that a test starts inherits those without being a worker of this run.
        worker = getattr(config, "workerinput", None)
        if worker is not None and hasattr(os, "sched_setaffinity"):
            name, count = str(worker.get("workerid", "")), worker.get("workercount")
            if name.startswith("gw") and name[2:].isdigit() and isinstance(count, int):
                self.cores = CoreShare(int(name[2:]), count)
                self.cores.pin(self.cores.own)
                self.locks = RunLocks(str(worker["testrunuid"]))
        self.module_seconds: dict[str, float] = {}

    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        if hangs is not None and not config.getini("timeout") and not config.getoption("timeout"):
            for item in items:  # a test's own timeout marker wins
                if item.get_closest_marker("timeout") is None:
                    slow = item.get_closest_marker("slow") is not None
                    seconds = hangs.SLOW_TIMEOUT_S if slow else hangs.DEFAULT_TIMEOUT_S
                    item.add_marker(pytest.mark.timeout(seconds))
        path = os.environ.get(DURATIONS_ENV)
        if path:
            weights = read_weights(path)
            rootdir = Path(config.rootpath)

            def module(item: pytest.Item) -> str:
                try:
                    return str(item.path.relative_to(rootdir))
                except ValueError:
                    return str(item.path)

            # A whole-machine test waits until no other test runs: beside a long module (a
            # real-model test takes minutes) its worker would sit idle, so such modules go
            # last, when the other worker's tests are short.
            alone = {module(i) for i in items if i.get_closest_marker("whole_machine")}
            order = order_by_weight([module(i) for i in items], weights, last=alone)
            rank = {m: i for i, m in enumerate(order)}
            items.sort(key=lambda item: rank[module(item)])  # stable within a module

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, None, None]:
        # Before pytest-timeout's timer starts: the wait for an install or for the other
        # workers is not the test's own time (each has its own bound).
        folder = installs.installs_dir()
        marker = item.get_closest_marker("needs_install")
        if folder is not None and marker is not None:
            wait_s = installs.wait_s()
            problems = [installs.wait_for_install(name, folder, wait_s) for name in marker.args]
            if any(problems):
                item.stash[_install_failures] = "\n".join(p for p in problems if p)
        before = hangs.descendants() if hangs is not None else set()
        with self._placed(item):
            yield
        alarm = item.stash.get(_alarm, None)
        if hangs is not None and alarm is not None and alarm.fired:
            left = hangs.reap(hangs.descendants() - before)
            if left:
                _record_warning(item.ihook, f"{item.nodeid} timed out; killed: {left}", item)

    @contextlib.contextmanager
    def _placed(self, item: pytest.Item) -> Generator[None, None, None]:
        """Beside the other workers' tests, or alone on every core; memory-heavy ones in turn."""
        if self.locks is None or self.cores is None:
            yield
            return
        heavy = item.get_closest_marker("memory_heavy") is not None
        with contextlib.ExitStack() as stack:
            if item.get_closest_marker("whole_machine"):
                stack.enter_context(self.locks.alone())
                stack.enter_context(self.cores.whole_machine())
            else:
                stack.enter_context(self.locks.beside_others())
            if heavy:
                stack.enter_context(self.locks.memory())
            yield

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        problem = item.stash.get(_install_failures, None)
        if problem:
            pytest.fail(problem, pytrace=False)

    @pytest.hookimpl(optionalhook=True, tryfirst=True)
    def pytest_timeout_set_timer(self, item: pytest.Item, settings: object) -> bool | None:
        """pytest-timeout's ``signal`` method with the stacks in the failure (see ``hangs``)."""
        if hangs is None or getattr(settings, "method", None) != "signal":
            return None
        alarm = hangs.Alarm()
        item.stash[_alarm] = alarm
        alarm.start(float(settings.timeout))  # type: ignore[attr-defined]
        return True

    @pytest.hookimpl(optionalhook=True, tryfirst=True)
    def pytest_timeout_cancel_timer(self, item: pytest.Item) -> bool | None:
        alarm = item.stash.get(_alarm, None)
        if alarm is None:
            return None
        alarm.cancel()
        return True

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Each module's time (its tests' setup, call and teardown); under xdist the controller
        sees every worker's reports."""
        module = report.nodeid.split("::", 1)[0]
        self.module_seconds[module] = self.module_seconds.get(module, 0.0) + report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        out = os.environ.get(DURATIONS_OUT_ENV)
        if out and not self.is_worker and self.module_seconds:
            ranked = sorted(self.module_seconds.items(), key=lambda kv: -kv[1])
            target = Path(out)
            temporary = target.with_name(target.name + ".tmp")
            temporary.write_text(json.dumps({k: round(v, 1) for k, v in ranked}, indent=1) + "\n")
            temporary.replace(target)
        if hangs is not None and not self.is_controller:
            # Nothing a test started outlives the session (a server a fixture failed to stop);
            # never in an xdist controller, whose children are the workers.
            left = hangs.reap(hangs.descendants())
            if left:
                _record_warning(
                    session.config.hook, f"left running at the end of the session, killed: {left}"
                )


def _record_warning(hook: Any, text: str, item: pytest.Item | None = None) -> None:
    """``text`` in the run's warnings summary, as pytest records warnings itself (``item``'s
    under xdist go to the controller). Not ``warnings.warn``: where this runs (after a
    test's own protocol, at the session's end) pytest applies the configured filters
    (``error:::art_core``) and it would raise, an internal error that ends the whole worker
    instead of a line beside the test that left the processes."""
    message = warnings.WarningMessage(UserWarning(text), UserWarning, __file__, 0)
    hook.pytest_warning_recorded.call_historic(
        kwargs={
            "warning_message": message,
            "nodeid": item.nodeid if item is not None else "",
            "when": "runtest" if item is not None else "config",
            "location": None,
        }
    )
