"""The wheels a GPU machine without network needs to run art_core's CUDA checks.

The lent GPU machines (``bash run.sh gpu-check``) have Python 3.12 with torch, transformers,
peft and many more already installed, and no package index. What art_core needs beyond that
image travels beside the checkout as a folder of wheels (``.whl/`` by default), installed
there with ``pip install --no-index --no-deps --target``.

Which wheels: the closure of art_core's core dependencies (``pyproject.toml``, no extras) and
of what the tests need (pytest-asyncio), stopping at every package the image already holds
(``IMAGE``, copied from the lending tool's list; its dependencies come with it). Versions are
the ones installed here (the checks ran against them), binary ones for CPython 3.12 on
manylinux x86_64.

Usage: python benchmarks/gpu_bundle.py [DIR] [--list]   (``bash run.sh gpu-bundle`` runs it)
       python benchmarks/gpu_bundle.py --smoke   (resolves every pin, then downloads and checks
                                                  a few small wheels, one pure and one binary,
                                                  in a temporary folder: the same table)
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
# The GPU image's packages ("Python packages already there", 2026-11-17). Its Python is 3.12.3
# with torch 2.11.0+cu130, transformers 5.17.0, safetensors 0.8.0, tokenizers 0.23.2,
# numpy 2.5.2, huggingface-hub 1.33.0, accelerate 1.15.0.
IMAGE = frozenset(
    """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
    botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
    coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython
    diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
    frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
    hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
    jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities
    linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl
    meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
    narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
    nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile
    nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py
    nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime
    onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
    orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
    prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
    pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
    pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich
    sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn
    sentencepiece sentence-transformers setuptools shellingham simplejson six
    sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server
    tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio
    torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton
    typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt
    xarray xxhash yarl zipp""".split()
)
# What the tests add to the core's needs (pyproject's addopts loads art_core's pytest plugin).
TEST_NEEDS = ("pytest-asyncio",)
# Bundled although the image has them, at the version checked here. pydantic needs
# typing-extensions >= 4.16, newer than an image built around torch 2.11 may hold (newer ones
# only add names). transformers: the trainer passes a boolean ``logits_to_keep`` mask, which
# the image's 5.17 cannot index ("too many indices for tensor of dimension 3" in Qwen2's
# forward) though art_core's pin (>=5.0,<6) admits it; the version CI tests does.
ALWAYS = ("typing-extensions", "transformers")
# The image's versions that are known (a requirement refusing one bundles the version here).
IMAGE_VERSIONS = {"torch": "2.11.0", "transformers": "5.17.0", "safetensors": "0.8.0"}
IMAGE_VERSIONS |= {"tokenizers": "0.23.2", "numpy": "2.5.2", "huggingface-hub": "1.33.0"}
IMAGE_VERSIONS |= {"accelerate": "1.15.0"}
# Only the GPU machine's Python and platform (Ubuntu 24.04's glibc 2.39); --platform needs
# each manylinux tag by name (llguidance 1.9 is built for 2_31 alone).
PLATFORMS = tuple(f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35))
PLATFORMS += ("manylinux2014_x86_64", "manylinux1_x86_64")
TARGET_ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "extra": ""}
TARGET_ENV |= {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"}
TARGET_ENV |= {"implementation_name": "cpython", "platform_python_implementation": "CPython"}
LIMIT_MIB = 60  # the lending tool carries 64 MiB, the checkout included
# What --smoke downloads: the tests' pure-Python plugin and the first of these small binary
# wheels that is pinned (the download's --platform / --python-version path), < 1 MiB in all.
SMOKE_BINARY = ("jiter", "httptools", "rpds-py", "orjson")


def normalize(name: str) -> str:
    """A distribution's canonical name (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def core_requirements() -> list[Requirement]:
    """art_core's own dependencies (no extras) and the tests' additions."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(text) for text in (*project["dependencies"], *TEST_NEEDS, *ALWAYS)]


def needed() -> dict[str, str]:
    """``{name: version installed here}`` of every package to bundle (sorted by name).

    Walks the requirements on the target's markers (Python 3.12 on Linux); a package of the
    image ends the walk there, except those in ``ALWAYS`` and those whose known image version
    (``IMAGE_VERSIONS``) a requirement refuses.
    """
    bundle: dict[str, str] = {}
    todo = core_requirements()
    while todo:
        requirement = todo.pop()
        name = normalize(requirement.name)
        if requirement.marker is not None and not requirement.marker.evaluate(TARGET_ENV):
            continue
        on_image = IMAGE_VERSIONS.get(name)
        refused = on_image is not None and not requirement.specifier.contains(on_image)
        if name in bundle or (name in IMAGE and name not in ALWAYS and not refused):
            continue
        try:
            installed = distribution(name)
        except PackageNotFoundError as exc:
            raise SystemExit(f"{name} is not installed here: run `bash run.sh check` once") from exc
        version = installed.version
        if not requirement.specifier.contains(version, prereleases=True):
            raise SystemExit(f"{name} {version} installed here does not satisfy {requirement}")
        bundle[name] = version
        todo.extend(Requirement(text) for text in installed.requires or [])
    return dict(sorted(bundle.items()))


def download(pins: dict[str, str], folder: Path) -> None:
    """``pip download`` every pin as a wheel for CPython 3.12 on manylinux x86_64."""
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps"]
    command += ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp"]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    specs = [f"{name}=={version}" for name, version in pins.items()]
    subprocess.run([*command, "-d", str(folder), *specs], check=True)


def wheel_name(path: Path) -> str:
    """The normalized distribution name of a wheel file."""
    return normalize(path.name.split("-")[0])


def check(folder: Path, pins: dict[str, str]) -> list[str]:
    """What is wrong with the folder: a pin without its wheel, an extra or a duplicate wheel,
    a wheel that is not a zip, or a total over ``LIMIT_MIB``; empty when all is well."""
    problems = []
    wheels = sorted(folder.glob("*.whl"))
    names = [wheel_name(w) for w in wheels]
    problems += [f"missing wheel: {n}=={v}" for n, v in pins.items() if n not in names]
    problems += [f"not a pinned package: {w.name}" for w in wheels if wheel_name(w) not in pins]
    problems += [f"two wheels of {n}" for n in sorted(set(names)) if names.count(n) > 1]
    problems += [f"not a wheel: {w.name}" for w in wheels if not zipfile.is_zipfile(w)]
    size = sum(w.stat().st_size for w in wheels) / 2**20
    if size > LIMIT_MIB:
        problems.append(f"{size:.1f} MiB is over the {LIMIT_MIB} MiB limit")
    return problems


def smoke_pins(pins: dict[str, str]) -> dict[str, str]:
    """The few small pins ``--smoke`` downloads (see ``SMOKE_BINARY``)."""
    names = [n for n in TEST_NEEDS if n in pins]
    names += [n for n in SMOKE_BINARY if n in pins][:1]
    if not names:
        raise SystemExit(f"none of {TEST_NEEDS + SMOKE_BINARY} is pinned: update SMOKE_BINARY")
    return {name: pins[name] for name in sorted(names)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default=None, type=Path, help="default: .whl/")
    parser.add_argument("--list", action="store_true", help="print the pins, download nothing")
    parser.add_argument(
        "--smoke", action="store_true", help="resolve all, download a few small wheels (temp)"
    )
    args = parser.parse_args()
    pins = needed()
    if args.list:
        print("\n".join(f"{name}=={version}" for name, version in pins.items()))
        return
    if args.smoke:
        chosen = smoke_pins(pins)
        print(f"{len(pins)} pins resolved; --smoke downloads {len(chosen)}: {', '.join(chosen)}")
        with tempfile.TemporaryDirectory(prefix="art-gpu-bundle-") as tmp:
            bundle(args.folder or Path(tmp) / "whl", chosen)
        return
    bundle(args.folder or ROOT / ".whl", pins)


def bundle(folder: Path, pins: dict[str, str]) -> None:
    """Download ``pins`` into a fresh ``folder``, print its wheels, refuse a bad bundle."""
    # A fresh folder: a wheel of another version left from an earlier bundle would make two.
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    download(pins, folder)
    wheels = sorted(folder.glob("*.whl"))
    for wheel in wheels:
        print(f"{wheel.stat().st_size / 2**20:8.2f} MiB  {wheel.name}")
    total = sum(w.stat().st_size for w in wheels) / 2**20
    print(f"{total:8.2f} MiB  in {len(wheels)} wheels, {folder}")
    problems = check(folder, pins)
    if problems:
        raise SystemExit("bundle refused:\n  " + "\n  ".join(problems))


if __name__ == "__main__":
    main()
