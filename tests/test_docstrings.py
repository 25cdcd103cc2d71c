"""Every docstring example (``>>>``) of ``art_core`` and of each integration package
(``integrations/*/art_*``) runs here as a doctest, so none of them can rot (issue 52).

One test per module that shows an example, named by the module. Its docstrings are found with
``doctest.DocTestFinder`` (the module's own functions, classes, methods and properties, each
docstring run in a copy of the module's globals, as ``python -m doctest`` does) and run with
``AwaitingRunner``: a ``doctest.DocTestRunner`` where an example may ``await`` (and ``async
with``/``async for``) at top level, compiled with ``ast.PyCF_ALLOW_TOP_LEVEL_AWAIT`` and
awaited on one event loop per module. ``...`` in an expected output matches anything
(``ELLIPSIS``, pytest's default for doctests). Each module runs in a temporary folder of its
own (what an example writes, ``.art`` included, lands there), with RULER's and art_core's cache
under it (the docstrings of a module share its folder and loop, each its own copy of the
globals), ``random``, NumPy and torch seeded before each docstring, and the process's
environment variables put back after: safe beside the other tests of an xdist worker. An
example that starts a thread, a server or a loaded model stops it again (``close``,
``stop``, ``shutdown``), so nothing outlives its module.

A skipped example says why on its own line, with one of the stock reasons of ``REASONS``
(text may follow it) in a comment just before the directive::

    >>> await model.train(groups)  # needs a registered model: ...  # doctest: +SKIP

A skip without one fails its module's test. ``test_skips_are_counted`` counts every module's
examples, run and skipped by reason, into its report section (``pytest -rP``);
``python tests/test_docstrings.py`` prints the same table.

A module that cannot be imported here (an optional dependency that lives in a venv of its
own) is listed in ``NOT_IMPORTABLE`` with the reason; any other module that fails to import
fails its test, and so does a listed one that imports.
"""

from __future__ import annotations
import __future__

import ast
import asyncio
import collections
import doctest
import importlib
import inspect
import os
import random
import re
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = [
    ROOT / "art_core",
    *sorted(p for p in ROOT.glob("integrations/*/art_*") if (p / "__init__.py").is_file()),
]

# Modules that cannot be imported in the test environment, with the reason. None today: the
# optional heavy dependencies (vLLM, verifiers, each in a venv of its own) are imported inside
# the functions that use them, so every module imports and its examples run or say why not.
NOT_IMPORTABLE: dict[str, str] = {}

# The stock reasons a skipped example gives (the comment before ``# doctest: +SKIP`` starts with
# one of them; a detail may follow), each with what it covers.
REASONS: dict[str, str] = {
    "needs a network service": (
        "a hosted model or judge, S3, W&B, or a server (inference, MLflow, `art-core serve`) "
        "at an address the example names"
    ),
    "needs an install": (
        "a runtime installed on demand (vLLM, a tracing server, the verifiers venv, an npm "
        "agent, libfaketime), or the install itself"
    ),
    "needs a registered model": (
        "a model served by a backend (engine, gateway, trainer), or the rollouts and groups "
        "made with one: seconds to minutes on CPU; the tests of that part run it"
    ),
    "too slow for a docstring": "training steps, a compile, a conversion: seconds to minutes",
    "starts a server": "a server or subprocess that runs until stopped, or on a fixed port",
    "changes process-wide state": (
        "an import hook, a tracing or metrics sink, trace processors or a cached status for "
        "the whole process (the test's worker runs other tests after it)"
    ),
    "needs files": "files the user has (a checkpoint, a GGUF file, a trained model folder)",
    "fragment": (
        "an illustrative fragment continuing names the surrounding prose or code defines "
        "(a request inside the gateway, a loaded model, a captured run)"
    ),
}

SKIP_REASON = re.compile(r"#\s*([^#\n]*?)\s*#\s*doctest:[^\n]*\+SKIP", re.MULTILINE)
AWAIT_HOOK = "__await_example__"


def module_names() -> list[str]:
    """Every module of the packages whose source shows an example (``>>>``), without importing
    anything (collection stays cheap)."""
    names = []
    for package in PACKAGES:
        for path in sorted(package.rglob("*.py")):
            if ">>>" not in path.read_text(encoding="utf-8"):
                continue
            parts = path.relative_to(package.parent).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


MODULES = module_names()


def import_module(name: str) -> ModuleType | None:
    """The module; None for one of ``NOT_IMPORTABLE`` that fails to import as listed."""
    try:
        module = importlib.import_module(name)
    except ImportError:
        if name in NOT_IMPORTABLE:
            return None
        raise
    assert name not in NOT_IMPORTABLE, f"{name} imports here: remove it from NOT_IMPORTABLE"
    return module


def find_tests(module: ModuleType) -> list[doctest.DocTest]:
    """The module's docstrings that hold examples, in the order of the source."""
    tests = doctest.DocTestFinder(exclude_empty=True).find(module)
    return sorted((t for t in tests if t.examples), key=lambda t: (t.lineno or 0, t.name))


def is_skipped(example: doctest.Example) -> bool:
    return bool(example.options.get(doctest.SKIP))


def skip_reason(example: doctest.Example) -> str | None:
    """The stock reason of a skipped example (``REASONS``), None when it gives none."""
    found = SKIP_REASON.search(example.source)
    if found is None:
        return None
    text = found.group(1)
    return next((reason for reason in REASONS if text.startswith(reason)), None)


def where(test: doctest.DocTest, example: doctest.Example) -> str:
    """``file:line`` of an example (a property's docstring has no line of its own in doctest:
    its first source line is looked up)."""
    filename = Path(test.filename or "?")
    try:
        filename = filename.relative_to(ROOT)
    except ValueError:
        pass
    if test.lineno is not None:
        return f"{filename}:{test.lineno + example.lineno + 1}"
    first = ">>> " + example.source.splitlines()[0].strip()
    lines = Path(test.filename or "").read_text(encoding="utf-8").splitlines()
    line = next((i + 1 for i, text in enumerate(lines) if text.strip() == first), 0)
    return f"{filename}:{line}"


def future_flags(globs: dict[str, Any]) -> int:
    """The ``from __future__`` flags of a module's globals (what doctest compiles with)."""
    flags = 0
    for name in __future__.all_feature_names:
        feature = globs.get(name)
        if feature is getattr(__future__, name):
            flags |= feature.compiler_flag
    return flags


class AwaitingRunner(doctest.DocTestRunner):
    """A ``DocTestRunner`` whose examples may use ``await``, ``async with`` and ``async for``
    at top level, awaited on ``loop``.

    doctest executes each example with ``exec``, which cannot await. An example that awaits is
    replaced, for the run, by a call to a hook in its globals; the hook puts the example's own
    text back (what a failure report shows), compiles it in ``"single"`` mode with
    ``ast.PyCF_ALLOW_TOP_LEVEL_AWAIT`` (an expression's value is still printed for the
    comparison) and runs the coroutine on ``loop``. Exceptions propagate as doctest expects.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, optionflags: int = 0) -> None:
        super().__init__(optionflags=optionflags)
        self.loop = loop

    def run(
        self,
        test: doctest.DocTest,
        compileflags: int | None = None,
        out: Callable[[str], object] | None = None,
        clear_globs: bool = True,
    ) -> doctest.TestResults:
        flags = future_flags(test.globs) if compileflags is None else compileflags
        originals: dict[int, str] = {}
        for index, example in enumerate(test.examples):
            if not is_skipped(example) and self._awaits(example.source, flags):
                originals[index] = example.source
                example.source = f"{AWAIT_HOOK}({index})\n"

        def await_example(index: int) -> None:
            example = test.examples[index]
            example.source = originals[index]
            code = compile(
                example.source,
                f"<doctest {test.name}[{index}]>",
                "single",
                flags | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
                True,
            )
            result = eval(code, test.globs)
            if inspect.iscoroutine(result):
                self.loop.run_until_complete(result)

        test.globs[AWAIT_HOOK] = await_example
        try:
            return super().run(test, flags, out, clear_globs)
        finally:
            for index, source in originals.items():
                test.examples[index].source = source

    @staticmethod
    def _awaits(source: str, flags: int) -> bool:
        try:
            code = compile(
                source, "<example>", "single", flags | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, True
            )
        except SyntaxError:
            return False  # doctest reports it
        return bool(code.co_flags & inspect.CO_COROUTINE)


def seed() -> None:
    """The same random numbers for every docstring, whatever ran before it."""
    random.seed(0)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(0)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(0)


def close(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what the examples left running on ``loop``, then close it."""
    pending = asyncio.all_tasks(loop)
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.run_until_complete(loop.shutdown_default_executor())
    loop.close()


def unexplained_skips(tests: list[doctest.DocTest]) -> list[str]:
    """``file:line: source`` of each skipped example without a stock reason."""
    return [
        f"{where(test, example)}: {example.source.splitlines()[0]}"
        for test in tests
        for example in test.examples
        if is_skipped(example) and skip_reason(example) is None
    ]


def count(tests: list[doctest.DocTest]) -> tuple[int, collections.Counter[str]]:
    """How many examples run, and the skipped ones by reason."""
    run = sum(not is_skipped(e) for t in tests for e in t.examples)
    skipped = collections.Counter(
        skip_reason(e) or "(no reason)" for t in tests for e in t.examples if is_skipped(e)
    )
    return run, skipped


def table(run: int, skipped: collections.Counter[str]) -> str:
    lines = [f"{run} examples run, {sum(skipped.values())} skipped"]
    lines += [f"  {n:4d}  skipped: {reason}" for reason, n in skipped.most_common()]
    return "\n".join(lines)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    module = import_module(name)
    if module is None:
        pytest.skip(f"{name} cannot be imported here: {NOT_IMPORTABLE[name]}")
    tests = find_tests(module)
    unexplained = unexplained_skips(tests)
    assert not unexplained, (
        f"skipped examples without a reason (a comment starting with one of {list(REASONS)} "
        "before `# doctest: +SKIP`):\n" + "\n".join(unexplained)
    )
    monkeypatch.chdir(tmp_path)
    environ = dict(os.environ)
    os.environ["ART_CORE_CACHE_DIR"] = str(tmp_path / "cache")
    loop = asyncio.new_event_loop()
    runner = AwaitingRunner(loop, optionflags=doctest.ELLIPSIS)
    report: list[str] = []
    try:
        for test in tests:
            seed()
            runner.run(test, out=report.append)
    finally:
        close(loop)
        os.environ.clear()
        os.environ.update(environ)
    request.node.add_report_section("call", "docstring examples", table(*count(tests)))
    assert runner.failures == 0, "".join(report)


def census() -> tuple[int, collections.Counter[str], dict[str, str]]:
    """Every module's examples: how many run, the skipped ones by reason, and the modules
    that could not be imported (with the reason)."""
    run, skipped, missing = 0, collections.Counter[str](), {}
    for name in MODULES:
        module = import_module(name)
        if module is None:
            missing[name] = NOT_IMPORTABLE[name]
            continue
        module_run, module_skipped = count(find_tests(module))
        run += module_run
        skipped += module_skipped
    return run, skipped, missing


def test_skips_are_counted(request: pytest.FixtureRequest) -> None:
    """The totals (``pytest -rP`` shows them); each stock reason is still given somewhere."""
    run, skipped, missing = census()
    text = table(run, skipped)
    text += "".join(f"\nnot importable: {name}: {why}" for name, why in missing.items())
    request.node.add_report_section("call", "docstring examples", text)
    print(text)
    unused = [reason for reason in REASONS if reason not in skipped]
    assert not unused, f"stock reasons no example gives any more (remove them): {unused}"


PARSER = doctest.DocTestParser()


def test_a_skip_gives_a_stock_reason_before_the_directive() -> None:
    """The form the docstrings use parses as a skip, and only a stock reason counts."""
    test = PARSER.get_doctest(
        ">>> train()  # needs a registered model: `model`  # doctest: +SKIP\n"
        ">>> train()  # shown for later  # needs files  # doctest: +SKIP\n"
        ">>> train(\n...     1)  # fragment  # doctest: +SKIP\n"
        ">>> train()  # doctest: +SKIP\n"
        ">>> train()  # shown for later  # doctest: +SKIP\n",
        {},
        "reasons",
        "reasons.py",
        0,
    )
    assert all(is_skipped(example) for example in test.examples)
    reasons = [skip_reason(example) for example in test.examples]
    assert reasons == ["needs a registered model", "needs files", "fragment", None, None]
    assert len(unexplained_skips([test])) == 2


def test_the_runner_awaits_and_reports_the_example_as_written() -> None:
    """Top-level ``await`` and ``async with`` run on the loop, values are compared as
    doctest compares them, and a failure shows the example's own text."""
    source = (
        ">>> import asyncio\n"
        ">>> await asyncio.sleep(0, result=3)\n"
        "3\n"
        ">>> async with asyncio.timeout(60):\n"
        "...     value = await asyncio.sleep(0, result=4)\n"
        ">>> value\n"
        "4\n"
        ">>> await asyncio.sleep(0, result=5)\n"
        "6\n"
    )
    test = PARSER.get_doctest(source, {}, "awaiting", "awaiting.py", 0)
    loop = asyncio.new_event_loop()
    report: list[str] = []
    try:
        runner = AwaitingRunner(loop)
        runner.run(test, out=report.append)
    finally:
        close(loop)
    assert (runner.tries, runner.failures) == (5, 1)
    assert "await asyncio.sleep(0, result=5)" in "".join(report)
    assert AWAIT_HOOK not in "".join(report)


if __name__ == "__main__":
    totals = census()
    print(table(totals[0], totals[1]))
    for module_name, why in totals[2].items():
        print(f"not importable: {module_name}: {why}")
