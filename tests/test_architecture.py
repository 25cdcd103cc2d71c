"""The layers of art_core as code: `.importlinter`'s contracts hold, and ARCHITECTURE.md's
"may import" table says the same as they do.

The table is read, not trusted: every part of art_core and every integration has a row, each
row's "may import" names only parts of lower layers, and each part imports (at run time,
inside functions too) only what its row names. A new part, or a new kind of import between
parts, therefore means a new row or entry, and the layer it belongs to in `.importlinter`.
"""

from __future__ import annotations

import configparser
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import grimp  # import-linter's graph (the dev extra installs both)

ROOT = Path(__file__).resolve().parent.parent
CORE = "art_core"
LAYERS_CONTRACT = "importlinter:contract:layers"
INTEGRATIONS_CONTRACT = "importlinter:contract:integrations"


@dataclass(frozen=True)
class Row:
    parts: tuple[str, ...]  # module tails (`server`, `model`) or integration packages
    may_import: frozenset[str]
    line: str


def config() -> configparser.ConfigParser:
    parser = configparser.ConfigParser()
    parser.read(ROOT / ".importlinter")
    return parser


def layer_lines(section: str) -> list[str]:
    return [line.strip() for line in config()[section]["layers"].splitlines() if line.strip()]


def layer_index(section: str) -> dict[str, int]:
    """Part -> its layer (0 is the top)."""
    return {
        part.strip(): index
        for index, line in enumerate(layer_lines(section))
        for part in re.split(r"[|:]", line)
    }


def independent_layers(section: str) -> list[list[str]]:
    return [
        [part.strip() for part in line.split("|")] for line in layer_lines(section) if "|" in line
    ]


def part_of(module: str) -> str:
    """`art_core.gateway.apis.chat` -> `gateway`; other packages (and `art_core`) stay whole."""
    pieces = module.split(".")
    if pieces[0] == CORE:
        return pieces[1] if len(pieces) > 1 else CORE
    return pieces[0]


def core_parts_on_disk() -> set[str]:
    package = ROOT / CORE
    modules = {p.stem for p in package.glob("*.py") if p.name != "__init__.py"}
    packages = {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
    return modules | packages


def table_rows() -> Iterator[Row]:
    text = (ROOT / "ARCHITECTURE.md").read_text()
    lines = iter(text.splitlines())
    for line in lines:
        if re.fullmatch(r"\|\s*part\s*\|\s*owns\s*\|\s*may import\s*\|", line.strip()):
            break
    else:
        raise AssertionError('ARCHITECTURE.md has no "| part | owns | may import |" table')
    next(lines)  # |---|---|---|
    for line in lines:
        if not line.startswith("|"):
            return
        first = line.split(" | ", 1)[0]
        last = line.rstrip().rstrip("|").rsplit(" | ", 1)[1]
        parts = tuple(re.split(r"[/.]", token)[0] for token in re.findall(r"`([^`]+)`", first))
        # Names in parentheses explain an entry ("`backends` (the `Backend` protocol)").
        named = re.findall(r"`([^`]+)`", re.sub(r"\([^()]*\)", "", last))
        yield Row(parts, frozenset(named), line)


@cache
def rows() -> tuple[Row, ...]:
    return tuple(table_rows())


@cache
def imports_between_parts() -> dict[str, dict[str, str]]:
    """Part -> {part it imports: one import that does it, for the failure message}."""
    integrations = sorted(layer_index(INTEGRATIONS_CONTRACT))
    graph = grimp.build_graph(*integrations, cache_dir=None, exclude_type_checking_imports=True)
    found: dict[str, dict[str, str]] = {}
    for importer in graph.modules:
        for imported in graph.find_modules_directly_imported_by(importer):
            source, target = part_of(importer), part_of(imported)
            if not importer.startswith(CORE + "."):
                target = imported.split(".")[0]  # an integration imports packages, not parts
            if source != target:
                found.setdefault(source, {}).setdefault(target, f"{importer} -> {imported}")
    return found


def test_the_contracts_hold() -> None:
    lint_imports = "from importlinter.cli import lint_imports_command as c; c()"
    done = subprocess.run(
        [sys.executable, "-c", lint_imports, "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout, done.stdout


def test_every_part_has_a_row_and_a_layer() -> None:
    table = [part for row in rows() for part in row.parts]
    assert len(table) == len(set(table)), f"a part has two rows: {sorted(table)}"
    integrations = set(layer_index(INTEGRATIONS_CONTRACT)) - {CORE}
    core_in_table = set(table) - integrations
    on_disk = core_parts_on_disk()
    assert core_in_table == on_disk, (
        f"parts of art_core without a row: {sorted(on_disk - core_in_table)}; "
        f"rows naming no part: {sorted(core_in_table - on_disk)}"
    )
    assert set(layer_index(LAYERS_CONTRACT)) == on_disk
    assert integrations <= set(table), f"integrations without a row: {integrations - set(table)}"
    packages = {p.parent.name for p in ROOT.glob("integrations/*/art_*/__init__.py")}
    assert packages == integrations, f"integrations not in .importlinter: {packages - integrations}"
    assert integrations | {CORE} == set(config()["importlinter"]["root_packages"].split())


def test_each_row_may_import_only_lower_layers() -> None:
    core, outer = layer_index(LAYERS_CONTRACT), layer_index(INTEGRATIONS_CONTRACT)
    for row in rows():
        layers = outer if row.parts[0] in outer and row.parts[0] != CORE else core
        for part in row.parts:
            for name in row.may_import:
                if name == CORE and layers is core:
                    # The public API: only the entry points' layer (the top) may import it.
                    assert layers[part] == 0, f"{part} may not import {CORE}: {row.line}"
                    continue
                assert name in layers, f"{name!r} is not a part of this table: {row.line}"
                assert layers[name] > layers[part], (
                    f"{part} may not import {name} (its layer is not below): {row.line}"
                )


def test_each_part_imports_only_what_its_row_says() -> None:
    wrong = []
    for row in rows():
        for part in row.parts:
            for target, example in sorted(imports_between_parts().get(part, {}).items()):
                if target not in row.may_import and target not in row.parts:
                    wrong.append(f"{part} imports {target} ({example})")
    assert not wrong, (
        "imports that ARCHITECTURE.md's table does not list (add them to the row, if the "
        "layers of .importlinter allow them):\n" + "\n".join(wrong)
    )


def test_siblings_joined_by_a_bar_do_not_import_each_other() -> None:
    # What import-linter checks for `|`, said once more in the table's words.
    for siblings in independent_layers(LAYERS_CONTRACT):
        for row in rows():
            for part in set(row.parts) & set(siblings):
                others = (set(siblings) - {part}) & row.may_import
                assert not others, f"{part} may import its siblings {others}: {row.line}"
