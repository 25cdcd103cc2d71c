"""Packages into a venv of its own (``art_core.venvs``): pip's settings read for uv, and a real
install and removal with uv into a new venv, from a wheel on local disk (no index reached)."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest

from art_core import venvs


def _wheel(folder: Path, name: str = "artprobe", version: str = "0.1") -> Path:
    """A minimal pure-Python wheel: one module, its metadata, its record."""
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": "VALUE = 42\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
        archive.writestr(f"{info}/RECORD", "".join(f"{m},,\n" for m in [*files, f"{info}/RECORD"]))
    return path


def test_pip_settings_become_uv_options_once_each_in_order():
    listing = "\n".join(
        [
            "global.find-links='/opt/wheels /more'",
            "install.find-links='/opt/wheels'",  # the same folder again: once
            "global.extra-index-url='https://mirror.example/simple'",
            "global.timeout='60'",  # not an install source: left to uv's default
            'user.constraint="/etc/pins.txt"',
            "no equals sign here",
        ]
    )
    assert venvs.settings_from_pip_config(listing) == [
        "--find-links", "/opt/wheels",
        "--find-links", "/more",
        "--extra-index-url", "https://mirror.example/simple",
        "--constraint", "/etc/pins.txt",
    ]  # fmt: skip
    assert venvs.settings_from_pip_config("") == []


def test_installs_into_a_new_venv_with_uv_and_removes(tmp_path):
    assert venvs.find_uv() is not None, "uv is missing: bash run.sh installs it into the venv"
    python = venvs.create_venv(tmp_path / "venv")
    wheel = _wheel(tmp_path)
    venvs.install(python, [str(wheel)])
    imported = subprocess.run(
        [str(python), "-c", "import artprobe; print(artprobe.VALUE)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert imported.stdout.strip() == "42"
    venvs.uninstall(python, ["artprobe"])
    gone = subprocess.run([str(python), "-c", "import artprobe"], capture_output=True, check=False)
    assert gone.returncode != 0


def test_a_package_that_cannot_be_had_raises(tmp_path):
    python = venvs.create_venv(tmp_path / "venv")
    with pytest.raises(subprocess.CalledProcessError):
        venvs.install(python, [str(tmp_path / "missing-0.1-py3-none-any.whl")])


def _bytecode(python: Path) -> list[Path]:
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return sorted(Path(site).glob("__pycache__/artprobe.*.pyc"))


def test_an_install_compiles_bytecode_only_where_python_would_not_cache_it(tmp_path, monkeypatch):
    wheel = _wheel(tmp_path)
    # PYTHONDONTWRITEBYTECODE set: every process would compile the module again, so the
    # install compiles it.
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    python = venvs.create_venv(tmp_path / "compiled")
    venvs.install(python, [str(wheel)])
    assert _bytecode(python), "installed without its bytecode where Python will not write it"
    # Unset: the install leaves it to the first import, which caches it once.
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE")
    python = venvs.create_venv(tmp_path / "lazy")
    venvs.install(python, [str(wheel)])
    assert not _bytecode(python), "compiled at install where the first import caches it"
    subprocess.run([str(python), "-c", "import artprobe"], check=True)
    assert _bytecode(python), "the first import did not cache the module's bytecode"
