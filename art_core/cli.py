"""The ``art-core`` command line. Each subcommand lives next to the part it drives and
registers itself through an ``add_parser(subparsers)`` function listed in ``COMMANDS``.

Installed integrations add their own subcommands (``art-core mcp ...``) through the
``art_core.commands`` entry-point group, so the core never imports a framework itself."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points

# module path -> imported lazily, so `art-core --help` stays fast and optional parts stay optional
COMMANDS: list[str] = [
    "art_core.art_alias_cli",
    "art_core.demo",
    "art_core.engines.cli",
    "art_core.evals.cli",
    "art_core.export.cli",
    "art_core.rewards.cli",
    "art_core.server.cli",
    "art_core.metrics.plot",
    "art_core.tracing.cli",
    "art_core.ui.cli",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="art-core", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module_name in COMMANDS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                continue  # that part is not built yet / not installed
            raise
        module.add_parser(subparsers)
    for entry_point in entry_points(group="art_core.commands"):
        try:
            entry_point.load()(subparsers)
        except Exception as exc:  # one broken plugin must not take the whole CLI down
            print(f"art-core: skipping plugin command {entry_point.name!r}: {exc}", file=sys.stderr)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``art-core`` console script.

    Example:
        >>> main(["--help"])  # prints the commands, then exits as argparse does
        Traceback (most recent call last):
        SystemExit: 0
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    result = args.func(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
