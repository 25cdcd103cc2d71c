"""``art-core verifiers``: install the verifiers runtime (its own venv)."""

from __future__ import annotations

import argparse

from art_verifiers.runtime import install_runtime


def install(extra: list[str]) -> int:
    """Create the verifiers venv (idempotent) and print where it is; ``extra`` packages (your
    environments) are installed beside verifiers.

    Example:
        >>> install([])  # needs an install: this is the install (a venv from PyPI)  # doctest: +SKIP
    """
    print(f"verifiers: {install_runtime(quiet=False, extra=tuple(extra))}")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "verifiers", help="run verifiers environments as rollouts (their own runtime venv)"
    )
    actions = parser.add_subparsers(dest="action", required=True)
    install_parser = actions.add_parser("install", help="create the verifiers runtime venv")
    install_parser.add_argument(
        "extra", nargs="*", help="more packages for that venv, e.g. your environments"
    )
    install_parser.set_defaults(func=lambda args: install(args.extra))
