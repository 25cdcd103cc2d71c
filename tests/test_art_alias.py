"""``import art`` for ART code: the opt-in hook answers only where no other ``art`` exists.

Each check runs a fresh interpreter whose site folder (``site.addsitedir``) holds the ``.pth``
file ``art-core art-alias install`` writes, as site-packages would at start-up."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from art_core.art_alias_cli import PTH_NAME
from art_core.cli import main


def python(code: str, *sites: Path, path: Path | None = None) -> str:
    prelude = "import site\n" + "".join(f"site.addsitedir({str(s)!r})\n" for s in sites)
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = f"{path}{os.pathsep}{env.get('PYTHONPATH', '')}"
    done = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_art_code_imports_art_core_under_arts_names(tmp_path: Path) -> None:
    assert main(["art-alias", "install", "--site", str(tmp_path)]) == 0
    assert (tmp_path / PTH_NAME).is_file()
    out = python(
        """
        import art
        from art import TrainableModel, Trajectory, gather_trajectory_groups
        from art.local import LocalBackend
        from art.local.backend import LocalBackend as LocalBackend2
        from art.utils import retry
        from art.types import Messages, TrainConfig
        import art.dev
        import art_core
        assert art.TrainableModel is TrainableModel is art_core.TrainableModel
        assert LocalBackend is LocalBackend2 is art_core.LocalBackend
        assert retry is art_core.retry and TrainConfig is art_core.TrainConfig
        assert art.dev.InternalModelConfig is art_core.dev.InternalModelConfig
        assert not hasattr(art_core, "local")  # art_core's own modules are left as they were
        try:
            from art.skypilot import SkyPilotBackend
        except ImportError as exc:
            print("missing:", type(exc).__name__)
        print("ok", art_core.__name__)
        """,
        tmp_path,
    )
    assert out.splitlines() == ["missing: ModuleNotFoundError", "ok art_core"]
    assert main(["art-alias", "uninstall", "--site", str(tmp_path)]) == 0
    assert not (tmp_path / PTH_NAME).exists()


def test_a_real_art_package_wins(tmp_path: Path) -> None:
    site_dir, other = tmp_path / "site", tmp_path / "other"
    (other / "art").mkdir(parents=True)
    (other / "art" / "__init__.py").write_text("WHO = 'the ascii-art library'\n")
    main(["art-alias", "install", "--site", str(site_dir)])
    out = python("import art; print(art.WHO)", site_dir, path=other)
    assert out.strip() == "the ascii-art library"
