"""The documentation site's reference pages, generated at every build (mkdocs.yml runs this
script through mkdocs-gen-files; nothing it writes is committed or kept in docs/):

- ``reference/cli.md``: ``art-core --help`` and the help of every subcommand, recursively, taken
  from the parsers themselves (``art_core.cli.build_parser``), so the page cannot drift from
  the code. The integrations' subcommands (``art-core mcp``, ``art-core verifiers``) join as on
  the command line, through the ``art_core.commands`` entry points; one declared by an
  integration's pyproject.toml but missing from the parser (the integration not installed:
  ``bash run.sh setup``) is a build warning, so a strict build fails rather than publish a
  page without it.
- ``reference/python.md`` and ``reference/python/<package>.md``: the public API of art_core and
  of each integration package (the names in its ``__all__``, in that order), rendered by
  mkdocstrings from the source (griffe reads it statically; nothing is imported). Each name is
  anchored at its public path (``art_core.TrainableModel``), except one that shares its path
  with a submodule (``art_mcp.train``, ``art_core.capture``): griffe finds the module there,
  so it is rendered, and anchored, where it is defined (``art_mcp.train.train``).

mkdocs.yml's nav lists each package's page, and its mkdocstrings paths each integration's
folder: a new integration goes into both (a strict build fails until then).
"""

from __future__ import annotations

import argparse
import ast
import functools
import logging
import os
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parent.parent
# The width the help is formatted at (argparse reads $COLUMNS): it fits the page's code block.
HELP_COLUMNS = 80
log = logging.getLogger("mkdocs.plugins.gen_reference")  # a warning here fails --strict


@dataclass(frozen=True)
class Package:
    """A documented Python package: its import name, its distribution and its source folder."""

    name: str
    distribution: str
    folder: Path

    @property
    def page(self) -> str:
        return f"reference/python/{self.name}.md"

    def init_module(self) -> ast.Module:
        return ast.parse((self.folder / "__init__.py").read_text())

    def summary(self) -> str:
        """The first paragraph of the package's docstring, on one line."""
        docstring = ast.get_docstring(self.init_module()) or ""
        first = docstring.split("\n\n")[0]
        summary = " ".join(first.split()).removeprefix(f"{self.name}: ")
        return summary[:1].upper() + summary[1:]

    def exports(self) -> list[str]:
        """The names in the package's ``__all__``."""
        for node in self.init_module().body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
            ):
                return list(ast.literal_eval(node.value))
        raise ValueError(f"{self.folder}/__init__.py has no __all__")


def _pyproject(folder: Path) -> dict:
    with (folder / "pyproject.toml").open("rb") as file:
        return tomllib.load(file)


@functools.cache
def packages() -> list[Package]:
    """art_core, then each integration's package (integrations/*/art_*)."""
    found = [Package("art_core", _pyproject(ROOT)["project"]["name"], ROOT / "art_core")]
    for project in sorted(p.parent for p in ROOT.glob("integrations/*/pyproject.toml")):
        distribution = _pyproject(project)["project"]["name"]
        for init in sorted(project.glob("art_*/__init__.py")):
            found.append(Package(init.parent.name, distribution, init.parent))
    return found


# ---------------------------------------------------------------------------- command line


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """The parser's subcommands' parsers, in the order they were added (aliases once)."""
    seen: set[int] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    yield sub


def _help_sections(parser: argparse.ArgumentParser, depth: int = 0) -> Iterator[str]:
    level = "#" * min(depth + 2, 6)
    yield f"{level} `{parser.prog}`\n\n```text\n{parser.format_help().rstrip()}\n```\n"
    for sub in _subcommands(parser):
        yield from _help_sections(sub, depth + 1)


def _declared_plugin_commands() -> dict[str, str]:
    """Subcommand name -> integration folder, for each ``art_core.commands`` entry point."""
    declared = {}
    for project in sorted(ROOT.glob("integrations/*/pyproject.toml")):
        with project.open("rb") as file:
            entry_points = tomllib.load(file)["project"].get("entry-points", {})
        for name in entry_points.get("art_core.commands", {}):
            declared[name] = str(project.parent.relative_to(ROOT))
    return declared


def cli_page() -> str:
    from art_core.cli import build_parser

    with mock.patch.dict(os.environ, {"COLUMNS": str(HELP_COLUMNS)}):
        parser = build_parser()
        present = {sub.prog.removeprefix("art-core ") for sub in _subcommands(parser)}
        for name, folder in _declared_plugin_commands().items():
            if name not in present:
                log.warning(
                    "reference/cli.md: `art-core %s` is missing: is %s installed "
                    "(bash run.sh setup)?",
                    name,
                    folder,
                )
        sections = list(_help_sections(parser))
    intro = (
        "# Command line\n\n"
        "Everything `art-core` does from a shell: the help each command prints "
        "(`art-core COMMAND --help`), generated from the command-line parsers themselves. "
        "The installed integrations add their own commands (`art-core mcp`, "
        "`art-core verifiers`).\n"
    )
    return "\n".join([intro, *sections])


# ---------------------------------------------------------------------------- Python API


def python_index(found: list[Package]) -> str:
    rows = "\n".join(
        f"| [`{p.name}`](python/{p.name}.md) | `{p.distribution}` | {p.summary()} |" for p in found
    )
    return (
        "# Python API\n\n"
        "The public names of each package: what its `__all__` exports, the names to import "
        "(`import art_core as art`, then `art.TrainableModel`, ...). Everything else is "
        "internal and may change.\n\n"
        "| Package | Distribution | What it is |\n|---|---|---|\n"
        f"{rows}\n"
    )


def _module_file(module: str) -> Path | None:
    """The source file of a module of the documented packages (None for any other)."""
    top = module.split(".")[0]
    roots = [p.folder.parent for p in packages() if p.name == top]
    for root in roots:
        base = root.joinpath(*module.split("."))
        for candidate in (base / "__init__.py", base.with_suffix(".py")):
            if candidate.is_file():
                return candidate
    return None


def _is_module(path: str) -> bool:
    return _module_file(path) is not None


def _module_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """A module's statements, those under ``if`` / ``try`` (TYPE_CHECKING blocks) included."""
    for node in body:
        yield node
        if isinstance(node, ast.If | ast.Try):
            yield from _module_level(node.body + node.orelse)


def _import_chain(module: str, name: str) -> list[str]:
    """The paths ``module.name`` goes through to where it is defined, following each
    ``from X import name`` (TYPE_CHECKING blocks included): ``[module.name, ..., where]``."""
    chain = [f"{module}.{name}"]
    while (source := _module_file(module)) is not None and len(chain) < 10:
        imported = [
            (node.module, alias.name)
            for node in _module_level(ast.parse(source.read_text()).body)
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
            for alias in node.names
            if (alias.asname or alias.name) == name
        ]
        if not imported or imported[0] == (module, name):
            break  # defined here, or the submodule itself (`from art_core import dev`)
        module, name = imported[0]
        chain.append(f"{module}.{name}")
    return chain


def object_path(package: Package, name: str) -> str:
    """The path mkdocstrings renders a public name from.

    ``package.name``, unless that path or one it is imported through is also a submodule's
    (the function ``art_mcp.rollout`` and ``art_mcp/rollout.py``): griffe then finds the
    module where Python finds what ``__init__`` imported over it, so the name is rendered
    from where it is defined.
    """
    chain = _import_chain(package.name, name)
    if _is_module(chain[-1]) or not any(_is_module(path) for path in chain[:-1]):
        return chain[0]
    return chain[-1]


def package_page(package: Package) -> str:
    page = [
        f"# `{package.name}`\n",
        # The package's docstring (members: false), then each public name in __all__ order.
        f"::: {package.name}\n    options:\n      members: false\n      show_root_heading: false\n",
    ]
    for name in package.exports():
        path = object_path(package, name)
        if _is_module(path):  # a submodule in __all__ (art_core.dev): under its full name
            page.append(f"::: {path}\n    options:\n      show_root_full_path: true\n")
        else:
            page.append(f"::: {path}\n")
    return "\n".join(page)


def main() -> None:
    with mkdocs_gen_files.open("reference/cli.md", "w") as file:
        file.write(cli_page())
    found = packages()
    with mkdocs_gen_files.open("reference/python.md", "w") as file:
        file.write(python_index(found))
    for package in found:
        with mkdocs_gen_files.open(package.page, "w") as file:
            file.write(package_page(package))


main()
