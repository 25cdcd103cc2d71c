"""``art-core``'s parser (every subcommand, the integrations' included) is built without
importing torch or transformers: a command that needs neither (``mcp tools``, ``tracing
serve``, ``ui``, ``--help``) starts in well under a second instead of paying ~1.3 s of CPU
for torch first. Each subcommand imports what it needs when it runs."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "transformers", "peft", "vllm")


def test_building_the_parser_imports_no_heavy_package() -> None:
    # A fresh interpreter: this test process has imported torch long ago.
    code = (
        "import json, sys\n"
        "from art_core.cli import build_parser\n"
        "parser = build_parser()\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "skipping plugin command" not in done.stderr, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == [], done.stdout
