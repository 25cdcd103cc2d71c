"""What the GPU checks run on: versions, the GPU, and art_core's pins against what is installed.

art_core is not pip-installed on the GPU machine (its torch and transformers come with the
image, the rest from the wheel bundle): this report says which of its requirements the
installed versions meet, so a pin that would refuse them shows here, not as an install error.

Usage: python benchmarks/gpu_env.py [--smoke]   (prints; exits 1 when torch cannot be imported)

The report takes about a second anywhere, so ``--smoke`` (every benchmark has one) runs the
same report, in full.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, requires, version
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
SHOWN: tuple[str, ...] = (
    "torch",
    "transformers",
    "peft",
    "accelerate",
    "tokenizers",
    "safetensors",
)
SHOWN += ("huggingface-hub", "numpy", "llguidance", "pydantic", "openai")
SHOWN += ("pytest", "pytest-asyncio")


def installed(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def pin_lines() -> list[str]:
    """One line per requirement of art_core (and the tests): installed version, ok or not."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = []
    for text in (*project["dependencies"], "pytest-asyncio>=0.24"):
        requirement = Requirement(text)
        found = installed(requirement.name)
        if found is None:
            verdict = "MISSING"
        elif requirement.specifier.contains(found, prereleases=True):
            verdict = "ok"
        else:
            verdict = "DIFFERS (art_core's pin refuses it; it runs from PYTHONPATH regardless)"
        lines.append(f"  {requirement!s:<32}{found or '-':<24}{verdict}")
    return lines


def unmet_below() -> list[str]:
    """The requirements of art_core's dependencies, all the way down, that what is installed
    does not meet (the image's own versions meet the bundle's wheels here, or do not)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    todo = [Requirement(t) for t in (*project["dependencies"], "pytest-asyncio")]
    seen: set[str] = set()
    unmet = []
    while todo:
        parent = todo.pop()
        name = parent.name.lower()
        if name in seen or installed(name) is None:
            continue
        seen.add(name)
        for text in requires(name) or []:
            requirement = Requirement(text)
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue
            found = installed(requirement.name)
            if found is None or not requirement.specifier.contains(found, prereleases=True):
                unmet.append(f"  {name} needs {requirement}: installed {found or 'none'}")
            todo.append(requirement)
    return unmet or [f"  none: all requirements of {len(seen)} packages are met"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="the same report (it is quick)")
    parser.parse_args()
    print(f"python {platform.python_version()} ({sys.executable})")
    for name in SHOWN:
        print(f"{name:<18}{installed(name) or 'not installed'}")
    try:
        import torch
    except ImportError as exc:
        print(f"torch cannot be imported: {exc}")
        return 1
    print(f"torch CUDA build  {torch.version.cuda}")
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            print(
                f"cuda:{index}            {props.name}, {props.total_memory / 2**30:.1f} GiB, "
                f"capability {props.major}.{props.minor}, bf16 {torch.cuda.is_bf16_supported()}"
            )
    else:
        print("CUDA: not found (no GPU visible to torch)")
    print("art_core's requirements against what is installed:")
    print("\n".join(pin_lines()))
    print("requirements of those packages that what is installed does not meet:")
    print("\n".join(unmet_below()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
