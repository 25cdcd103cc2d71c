"""``art-core art-alias {install,uninstall,status}``: the opt-in ``.pth`` hook that lets
``import art`` mean art_core where no other ``art`` exists (see ``art_core.art_alias``)."""

from __future__ import annotations

import argparse
import importlib.machinery
import sysconfig
from pathlib import Path
from typing import Any

from art_core import art_alias
from art_core.files import atomic_write_text

PTH_NAME = "art_core_art_alias.pth"


def pth_line(source: Path) -> str:
    """The ``.pth`` line that loads this file by path and installs the finder (loading it by
    path keeps art-core itself out of every interpreter start). A missing file is skipped."""
    path = str(source.resolve())
    return (
        "import importlib.util as u, os; "
        f"p = {path!r}; "
        's = os.path.isfile(p) and u.spec_from_file_location("art_core_art_alias", p); '
        "m = s and u.module_from_spec(s); "
        "s and s.loader.exec_module(m); "
        "m and m.install()\n"
    )


def _site(args: argparse.Namespace) -> Path:
    return Path(args.site) if args.site else Path(sysconfig.get_paths()["purelib"])


def _command(args: argparse.Namespace) -> int:
    pth = _site(args) / PTH_NAME
    if args.action == "install":
        atomic_write_text(pth, pth_line(Path(art_alias.__file__)))
        print(f"installed {pth}: `import art` now means art_core where no other `art` exists")
    elif args.action == "uninstall":
        pth.unlink(missing_ok=True)
        print(f"removed {pth}")
    else:
        state = "installed" if pth.is_file() else "not installed"
        spec = importlib.machinery.PathFinder.find_spec("art")
        other = f"; another `art` is installed ({spec.origin}) and wins" if spec else ""
        print(f"{pth}: {state}{other}")
    return 0


def add_parser(subparsers: Any) -> None:
    """``art-core art-alias {install,uninstall,status} [--site DIR]``."""
    parser = subparsers.add_parser(
        "art-alias",
        help="let `import art` mean art_core in this environment (only where no other `art` exists)",
        description=art_alias.__doc__,
    )
    parser.add_argument("action", choices=["install", "uninstall", "status"])
    parser.add_argument("--site", help="site-packages folder (default: this environment's)")
    parser.set_defaults(func=_command)
