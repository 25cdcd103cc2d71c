"""Packages into a virtual environment of its own (the vLLM runtime, the tracing servers, the
verifiers runtime): with uv where it can be had, given pip's own settings, else with pip.

uv installs a stack in a fraction of pip's time and CPU (the vLLM runtime: about 3x faster
here), and these installs run in the background while the tests run: every CPU-second pip
spends resolving and unpacking is taken from a test. uv reads none of pip's configuration
(its files, ``PIP_*`` variables), so pip's find-links, indexes and constraints are read from
``pip config list`` and passed as uv's options, resolved as pip resolves them (the best
version across every index: ``--index-strategy unsafe-best-match``); pip's certificate
bundle is given to uv's TLS. Where uv is not installed, or fails, pip installs.

``bash run.sh`` installs the project's own venv through this file, run as a script (``python
-P art_core/venvs.py install ARGS``) before art_core is installed: it imports nothing but the
standard library.

Example:
    >>> settings_from_pip_config("global.find-links='/opt/wheels /more'\\n:env:.timeout='9'")
    ['--find-links', '/opt/wheels', '--find-links', '/more']
    >>> settings_from_pip_config("global.constraint='/etc/c.txt'\\nglobal.index-url='x'")
    ['--constraint', '/etc/c.txt', '--index-url', 'x']
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

# pip's option (the last part of a `pip config list` key) -> uv's flag.
_FLAGS = {
    "find-links": "--find-links",
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "constraint": "--constraint",
}


def settings_from_pip_config(listing: str) -> list[str]:
    """uv's options for what ``pip config list`` printed (``listing``): each find-links,
    index, extra index and constraint once, in pip's order."""
    options: list[str] = []
    seen: set[tuple[str, str]] = set()
    for line in listing.splitlines():
        key, sep, value = line.partition("=")
        flag = _FLAGS.get(key.rsplit(".", 1)[-1]) if sep else None
        if flag is None:
            continue
        for item in value.strip().strip("'\"").split():
            if (flag, item) not in seen:
                seen.add((flag, item))
                options += [flag, item]
    return options


def _pip_config(python: str | os.PathLike[str], *arguments: str) -> str | None:
    """What ``python -m pip config ARGUMENTS`` printed; None where it failed or is absent."""
    try:
        done = subprocess.run(
            [str(python), "-m", "pip", "config", *arguments],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def pip_settings_for_uv(python: str | os.PathLike[str] = sys.executable) -> list[str]:
    """uv's options for pip's settings as ``python``'s pip reads them; none without pip."""
    return settings_from_pip_config(_pip_config(python, "list") or "")


def _pip_cert(python: str | os.PathLike[str]) -> str | None:
    """pip's certificate bundle (a proxy's own CA, where there is one)."""
    given = os.environ.get("SSL_CERT_FILE") or os.environ.get("PIP_CERT")
    if given:
        return given
    return (_pip_config(python, "get", "global.cert") or "").strip() or None


def find_uv() -> str | None:
    """The uv beside this interpreter (the project's venv has it), else the one on PATH."""
    beside = Path(sys.executable).parent / "uv"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("uv")


def create_venv(target: Path) -> Path:
    """A new venv at ``target`` (with pip: a runtime may install into it later); its python."""
    subprocess.run([sys.executable, "-m", "venv", str(target)], check=True)
    return target / "bin" / "python"


def compile_at_install(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether an install byte-compiles every module it puts in place: only where Python
    will not cache a module's bytecode itself (``PYTHONDONTWRITEBYTECODE`` set).

    Where it caches them, the first process that imports a module compiles it, once: a
    run's processes import a fraction of their files (a whole test run compiled 36,500 of
    the 89,800 in the project's venv and the runtimes, at about 3 ms of CPU each): compiling
    them all at install cost a fresh test run about 4.5 CPU-minutes, in its setup and in the
    background installs beside the tests. Where
    it does not, a module not compiled at install is compiled again by every process that
    imports it (a whole test run 1.7x slower).

    Example:
        >>> compile_at_install({"PYTHONDONTWRITEBYTECODE": "1"}), compile_at_install({})
        (True, False)
    """
    return bool(environ.get("PYTHONDONTWRITEBYTECODE"))


def install(python: Path | str, packages: Sequence[str], *, quiet: bool = True) -> None:
    """Install ``packages`` (pip requirement specifiers) into ``python``'s venv: with uv where
    it can be had and succeeds, else with pip (upgraded first), byte-compiled as
    ``compile_at_install`` says. Raises ``subprocess.CalledProcessError`` when neither
    installs them."""
    q = ["-q"] if quiet else []
    compile_now = compile_at_install()
    uv = find_uv()
    if uv is not None:
        environment = dict(os.environ)
        cert = _pip_cert(python)
        if cert:
            environment["SSL_CERT_FILE"] = cert
        command = [uv, "pip", "install", *q, "--python", str(python)]
        command += ["--compile-bytecode"] if compile_now else []
        command += ["--index-strategy", "unsafe-best-match", *pip_settings_for_uv(python)]
        if subprocess.run([*command, *packages], env=environment, check=False).returncode == 0:
            return
        print("uv could not install these; pip installs them", file=sys.stderr)
    subprocess.run([str(python), "-m", "pip", "install", *q, "--upgrade", "pip"], check=True)
    compiled = [] if compile_now else ["--no-compile"]
    subprocess.run([str(python), "-m", "pip", "install", *q, *compiled, *packages], check=True)


def uninstall(python: Path | str, packages: Sequence[str], *, quiet: bool = True) -> None:
    """Remove ``packages`` (names) from ``python``'s venv (uv where it can be had, else pip)."""
    q = ["-q"] if quiet else []
    uv = find_uv()
    if uv is not None:
        command = [uv, "pip", "uninstall", *q, "--python", str(python), *packages]
        if subprocess.run(command, check=False).returncode == 0:
            return
    subprocess.run([str(python), "-m", "pip", "uninstall", "-y", *q, *packages], check=True)


def main(argv: Sequence[str]) -> int:
    """``install ARGS``: pip install arguments (requirements, ``-e``, ``--no-deps``...) into
    this interpreter's venv, as ``install`` does; the exit status is the installer's."""
    if len(argv) > 1 and argv[0] == "install":
        try:
            install(sys.executable, argv[1:])
        except subprocess.CalledProcessError as error:
            return error.returncode or 1
        return 0
    print("usage: python art_core/venvs.py install ARGS...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    # run.sh runs this file before art_core is installed (`python -P art_core/venvs.py ...`).
    sys.exit(main(sys.argv[1:]))
