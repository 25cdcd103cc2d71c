"""The machine-speed calibration ``bash run.sh test`` prints beside its phase table
(``art_core.testing.calibration``): its line, the file it writes, and the wall time scaled to
the slowest machine seen, against the CI budget."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from art_core.cpu import cpu_model
from art_core.testing import calibration
from art_core.testing.calibration import BUDGET_S, REFERENCE, SLOWEST_SEEN, Speed

ROOT = Path(__file__).resolve().parent.parent


def test_measures_writes_and_scales(tmp_path, capsys):
    out = tmp_path / "speed.json"
    assert calibration.main(["--repeats", "1", "--out", str(out)]) == 0
    line = capsys.readouterr().out.strip()
    written = calibration.read(out)
    assert written.python_s > 0 and written.torch_s > 0
    assert line.startswith("machine speed: python ")
    assert f"-> {written.slowdown:.2f}x the reference's time" in line
    assert [p.name for p in tmp_path.iterdir()] == ["speed.json"], "written whole, renamed"

    assert calibration.main(["--scale", "600", "--speed", str(out)]) == 0
    scaled = capsys.readouterr().out.strip()
    expected = 600 * SLOWEST_SEEN / written.slowdown
    assert scaled.startswith("scaled to the slowest machine seen")
    assert f": {expected:.0f} s, " in scaled


def test_the_verdict_against_the_budget():
    on_the_slowest = Speed(REFERENCE.python_s * SLOWEST_SEEN, REFERENCE.torch_s * SLOWEST_SEEN)
    assert on_the_slowest.slowdown == SLOWEST_SEEN
    assert calibration.scaled_line(BUDGET_S, on_the_slowest).endswith(
        f"{BUDGET_S} s, within the {BUDGET_S} s budget"
    )
    assert "OVER the" in calibration.scaled_line(BUDGET_S + 1, on_the_slowest)
    # Twice as fast as the reference: a wall time counts 2 * 1.21 times on the slowest.
    fast = Speed(REFERENCE.python_s / 2, REFERENCE.torch_s / 2)
    assert calibration.scaled_to_slowest(400, fast.slowdown) == pytest.approx(400 * 2 * 1.21)
    with pytest.raises(ValueError, match="slowdown must be positive"):
        calibration.scaled_to_slowest(400, 0.0)


@pytest.mark.parametrize(
    "content", ["", "not json", "{}", '{"python_s": 1.0}', '{"python_s": "x", "torch_s": 1}']
)
def test_a_file_that_is_not_a_speed_is_named(tmp_path, capsys, content):
    bad = tmp_path / "speed.json"
    bad.write_text(content)
    with pytest.raises(ValueError, match=r"speed\.json: not a machine speed"):
        calibration.read(bad)
    with pytest.raises(SystemExit) as exited:
        calibration.main(["--scale", "10", "--speed", str(bad)])
    assert exited.value.code == 2
    assert "not a machine speed" in capsys.readouterr().err


def test_scale_needs_the_speed_file():
    with pytest.raises(SystemExit):
        calibration.main(["--scale", "10"])
    with pytest.raises(SystemExit):
        calibration.main(["--repeats", "0"])


def test_the_slowdown_weighs_the_interpreter_as_the_suite_does():
    # The two machines the weight was fitted to: an Intel Xeon (the reference's kind) and an
    # AMD EPYC with a faster interpreter and a slower fp32 matmul; the suite ran 0.84x as long
    # on the EPYC, which the slowdowns' ratio gives (an equal weight gave 1.2x).
    xeon = Speed(python_s=0.92, torch_s=0.83)
    epyc = Speed(python_s=0.67, torch_s=1.66)
    assert epyc.slowdown / xeon.slowdown == pytest.approx(1565 / 1866, abs=0.02)


def test_the_line_names_the_cpu(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC  7B13\nflags\t\t: avx2\n")
    assert cpu_model(info) == "AMD EPYC 7B13 (avx2)"
    assert cpu_model(tmp_path / "missing").endswith(" (no AVX2)")
    speed = Speed(python_s=1.0, torch_s=1.0, cpu=cpu_model(info))
    assert "(fixed workload, one core, AMD EPYC 7B13 (avx2)) ->" in speed.line()
    out = tmp_path / "speed.json"
    out.write_text('{"python_s": 1.0, "torch_s": 1.0, "cpu": "AMD EPYC 7B13 (avx2)"}')
    assert calibration.read(out) == speed


def shell_function(name: str) -> str:
    """``name``'s definition in ``run.sh``: from ``name() {`` to the first line that is ``}``."""
    text = (ROOT / "run.sh").read_text()
    start = text.index(f"\n{name}() {{") + 1
    return text[start : text.index("\n}\n", start) + 3]


def test_the_background_installs_are_paused_while_the_machine_is_timed(tmp_path):
    """``calibrate`` in ``run.sh`` stops every background install's process group (the
    install and what it started) for as long as the workload runs, then lets it go on (an
    install beside the workload made the machine read slow: the comment above ``calibrate``)."""
    ticks, seen = tmp_path / "ticks.txt", tmp_path / "seen.txt"
    # A stand-in for the venv's python: counts the install's ticks across a second of
    # "workload", and writes the speed file's stand-in line.
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(
        "#!/bin/sh\n"
        f'a=$(wc -l < "{ticks}"); sleep 1; b=$(wc -l < "{ticks}")\n'
        f'echo "$a $b" > "{seen}"\n'
        'echo "machine speed: stand-in"\n'
    )
    python.chmod(0o755)
    # The install: a shell that starts a child ticking ten times a second, 30 ticks (the
    # group, not only the install's own shell, must stop; it ends by itself whatever happens).
    install = f"sh -c 'for i in $(seq 30); do date +%s.%N >> \"{ticks}\"; sleep 0.1; done'"
    script = "\n".join(
        [
            "set -euo pipefail",
            f'VENV="{tmp_path / "venv"}" ART_TEST_INSTALLS_DIR="{tmp_path}"',
            f'MACHINE_SPEED="{tmp_path / "speed.json"}"',
            "BACKGROUND=()",
            shell_function("background_install"),
            shell_function("calibrate"),
            f"background_install ticker {install}",
            f'until [ -s "{ticks}" ]; do sleep 0.05; done',
            "calibrate",
            'wait "${BACKGROUND[0]}"',  # after it, the install goes on to its end
        ]
    )
    done = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "machine speed: stand-in"
    before, after = map(int, seen.read_text().split())
    assert before >= 1 and after == before, f"{after - before} ticks while timed"
    assert len(ticks.read_text().split()) == 30, "the install did not go on to its end"
    assert (tmp_path / "ticker.status").read_text().strip() == "0"
