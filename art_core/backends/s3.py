"""Back up a model's folder to S3 and restore it: ART's ``_experimental_push_to_s3`` /
``_experimental_pull_from_s3``.

The layout is ART's: ``s3://{bucket}/{prefix/}{project}/models/{name}/`` mirrors the model
folder (``checkpoints/0003/...``, ``history.jsonl``, ``calls.sqlite``, ...), so a folder
pushed by ART can be pulled here and the other way round. ART shells out to ``aws s3 sync``;
this uses boto3 (the ``s3`` extra), which reads the same configuration: credentials and
region from the environment or ``~/.aws``, a profile by name, and ``AWS_ENDPOINT_URL`` for
S3-compatible stores (MinIO, moto, R2). The bucket defaults to ``$BACKUP_BUCKET``, as in ART.

What a sync sends or fetches is decided per file: a file is copied when the other side lacks
it or its size or MD5 differs. Three rules keep the folder consistent:

- a checkpoint is immutable: an existing local checkpoint is never overwritten by a pull, and
  a pulled one is written under a hidden name and renamed into place when all its files are
  there (an interrupted pull leaves no half checkpoint under a step's name);
- ``calls.sqlite`` is pushed from a consistent snapshot (SQLite's backup API), never copied
  while the gateway writes it; its ``-wal`` / ``-shm`` files are never sent;
- every key pulled must name a plain path inside the folder: a key with ``..``, an absolute
  path or a hidden part is refused, so a bucket cannot write outside the model's folder.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from art_core.model_folder import ModelFolder

logger = logging.getLogger(__name__)

BUCKET_ENV = "BACKUP_BUCKET"
# Single-part uploads up to this size, so an object's ETag is its MD5 (what the next sync
# compares); S3 takes up to 5 GiB in one PUT, far above an adapter's size.
SINGLE_PART_LIMIT = 4 * 1024**3
# SQLite's side files: the snapshot of calls.sqlite already holds what they hold.
SKIPPED_SUFFIXES = ("-wal", "-shm", "-journal")


class S3SyncError(RuntimeError):
    """An S3 backup or restore failed (bucket missing or unreachable, credentials, a key
    that does not name a path inside the model's folder)."""


@dataclass
class SyncReport:
    """What one push or pull did: relative paths copied, already up to date, deleted."""

    copied: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One line, e.g. ``3 copied, 2 unchanged, 0 deleted``."""
        text = f"{len(self.copied)} copied, {len(self.unchanged)} unchanged, {len(self.deleted)} deleted"
        return text + (f", {len(self.skipped)} skipped" if self.skipped else "")


def s3_prefix(project: str, model_name: str, prefix: str | None = None) -> str:
    """The key prefix of a model's folder (ART's layout), ending in ``/``.

    Example:
        >>> s3_prefix("2048", "agent-001", prefix="runs/")
        'runs/2048/models/agent-001/'
    """
    lead = f"{prefix.strip('/')}/" if prefix and prefix.strip("/") else ""
    return f"{lead}{project}/models/{model_name}/"


def resolve_bucket(bucket: str | None) -> str:
    """``bucket``, or ``$BACKUP_BUCKET`` as in ART; an error naming both when neither is set."""
    bucket = bucket or os.environ.get(BUCKET_ENV)
    if not bucket:
        raise S3SyncError(f"no S3 bucket: pass s3_bucket=... or set ${BUCKET_ENV}")
    return bucket


def safe_relative_path(relative: str) -> PurePosixPath:
    """``relative`` as a path inside the model folder, or ``S3SyncError``.

    Example:
        >>> safe_relative_path("checkpoints/0001/adapter_config.json").parts[:2]
        ('checkpoints', '0001')
        >>> safe_relative_path("../escape")  # doctest: +IGNORE_EXCEPTION_DETAIL
        Traceback (most recent call last):
        S3SyncError: ...
    """
    path = PurePosixPath(relative)
    if (
        not relative
        or path.is_absolute()
        or "\\" in relative
        or "\x00" in relative
        or any(part in ("", ".", "..") or part.startswith(".") for part in relative.split("/"))
    ):
        raise S3SyncError(f"refusing S3 key part {relative!r}: not a plain path inside the folder")
    return path


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _same(path: Path, remote: dict[str, Any]) -> bool:
    """Whether a local file holds what the remote object holds (size, then MD5 = ETag of a
    single-part upload; a multipart ETag never matches, so such a file is copied again)."""
    if path.stat().st_size != remote["Size"]:
        return False
    return _md5(path) == str(remote["ETag"]).strip('"')


class S3Folder:
    """One model folder's copy in S3 (blocking calls: run them in a thread).

    Example:
        >>> remote = S3Folder(folder, bucket="my-backups")  # needs a network service: S3  # doctest: +SKIP
        >>> remote.push().summary()  # needs a network service: S3  # doctest: +SKIP
        '7 copied, 0 unchanged, 0 deleted'
    """

    def __init__(
        self,
        folder: ModelFolder,
        *,
        bucket: str | None = None,
        prefix: str | None = None,
        profile: str | None = None,
    ) -> None:
        try:
            import boto3
            from boto3.s3.transfer import TransferConfig
        except ImportError as error:  # the s3 extra
            raise S3SyncError("S3 backup needs boto3: pip install 'art-core[s3]'") from error
        self.folder = folder
        self.bucket = resolve_bucket(bucket)
        project, name = folder.root.parent.parent.name, folder.root.name
        self.prefix = s3_prefix(project, name, prefix)
        session = boto3.Session(profile_name=profile) if profile else boto3.Session()
        self.client = session.client("s3")
        self.transfer = TransferConfig(multipart_threshold=SINGLE_PART_LIMIT)

    def url(self) -> str:
        """``s3://bucket/prefix/project/models/name/``."""
        return f"s3://{self.bucket}/{self.prefix}"

    # ------------------------------------------------------------------------------ listing
    def remote_objects(self, under: str = "") -> dict[str, dict[str, Any]]:
        """Objects under the folder's prefix (+ ``under``), by path relative to the folder."""
        from botocore.exceptions import ClientError

        objects: dict[str, dict[str, Any]] = {}
        paginator = self.client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + under):
                for item in page.get("Contents", []):
                    relative = item["Key"][len(self.prefix) :]
                    if relative and not relative.endswith("/"):
                        objects[relative] = item
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") == "NoSuchBucket":
                raise S3SyncError(f"S3 bucket {self.bucket!r} does not exist") from error
            raise S3SyncError(f"listing {self.url()} failed: {error}") from error
        return objects

    def local_files(self) -> Iterator[str]:
        """Relative paths of the folder's files that a push sends (no hidden entries, no
        SQLite side files)."""
        root = self.folder.root
        for directory, subdirectories, files in os.walk(root):
            subdirectories[:] = sorted(d for d in subdirectories if not d.startswith("."))
            for name in sorted(files):
                if name.startswith(".") or name.endswith(SKIPPED_SUFFIXES):
                    continue
                yield Path(directory, name).relative_to(root).as_posix()

    # ------------------------------------------------------------------------------ push
    def ensure_bucket(self) -> None:
        """Create the bucket when it does not exist (as ART's push does)."""
        from botocore.exceptions import ClientError

        try:
            self.client.head_bucket(Bucket=self.bucket)
            return
        except ClientError as error:
            code = str(error.response.get("Error", {}).get("Code"))
            if code not in ("404", "NoSuchBucket", "NotFound"):
                raise S3SyncError(f"S3 bucket {self.bucket!r}: {error}") from error
        logger.warning("S3 bucket %s does not exist, creating it", self.bucket)
        try:
            self.client.create_bucket(Bucket=self.bucket)
        except ClientError as error:
            raise S3SyncError(
                f"could not create S3 bucket {self.bucket!r} (it may belong to someone else, "
                f"or the credentials may not allow it): {error}"
            ) from error

    def push(self, *, delete: bool = False) -> SyncReport:
        """Upload what differs; ``delete`` also removes objects the folder no longer has."""
        if not self.folder.root.is_dir():
            raise S3SyncError(f"no model folder at {self.folder.root} to push")
        self.ensure_bucket()
        remote = self.remote_objects()
        report = SyncReport()
        local = list(self.local_files())
        with tempfile.TemporaryDirectory(prefix="art-s3-") as scratch:
            for relative in local:
                path = self.folder.root / relative
                if relative == self.folder.calls_db.name:
                    path = _sqlite_snapshot(path, Path(scratch) / relative)
                if relative in remote and _same(path, remote[relative]):
                    report.unchanged.append(relative)
                    continue
                self.client.upload_file(
                    str(path), self.bucket, self.prefix + relative, Config=self.transfer
                )
                report.copied.append(relative)
        if delete:
            for relative in sorted(set(remote) - set(local)):
                self.client.delete_object(Bucket=self.bucket, Key=self.prefix + relative)
                report.deleted.append(relative)
        return report

    # ------------------------------------------------------------------------------ pull
    def pull(self, *, step: int | None = None, delete: bool = False) -> SyncReport:
        """Download what differs (only ``checkpoints/{step:04d}`` when ``step`` is given);
        ``delete`` also removes local files the bucket does not have (never checkpoints)."""
        self.ensure_bucket()  # as ART's pull does: a new bucket pulls nothing
        under = f"checkpoints/{step:04d}/" if step is not None else ""
        remote = self.remote_objects(under)
        paths = {relative: safe_relative_path(relative) for relative in remote}
        report = SyncReport()
        root = self.folder.root
        root.mkdir(parents=True, exist_ok=True)
        checkpoints: dict[str, list[str]] = {}
        for relative, path in paths.items():
            if path.parts[0] == "checkpoints" and len(path.parts) > 2:
                checkpoints.setdefault(path.parts[1], []).append(relative)
                continue
            target = root / relative
            if target.is_file() and _same(target, remote[relative]):
                report.unchanged.append(relative)
                continue
            self._download(relative, target)
            report.copied.append(relative)
        for name, keys in sorted(checkpoints.items()):
            self._pull_checkpoint(name, keys, report)
        if delete and step is None:
            for relative in self.local_files():
                if relative not in remote and not relative.startswith("checkpoints/"):
                    (root / relative).unlink()
                    report.deleted.append(relative)
        return report

    def _pull_checkpoint(self, name: str, keys: list[str], report: SyncReport) -> None:
        """One checkpoint folder, written whole under a hidden name and renamed into place;
        an existing one is left as it is (checkpoints never change once written)."""
        target = self.folder.checkpoints / name
        if target.exists():
            if ModelFolder.is_complete(target):
                report.unchanged.extend(keys)
            else:
                report.skipped.extend(keys)
                logger.warning("%s exists locally but is incomplete: not overwritten", target)
            return
        self.folder.checkpoints.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".pull-{name}-", dir=self.folder.checkpoints))
        try:
            for relative in keys:
                inner = PurePosixPath(relative).relative_to(f"checkpoints/{name}")
                self._download(relative, staging / inner)
            os.replace(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        report.copied.extend(keys)

    def _download(self, relative: str, target: Path) -> None:
        """One object to ``target``, atomically (a temporary file renamed into place)."""
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        os.close(handle)
        try:
            self.client.download_file(self.bucket, self.prefix + relative, temporary)
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise


def _sqlite_snapshot(source: Path, target: Path) -> Path:
    """A consistent copy of a live SQLite database (the backup API reads it under its own
    lock, so a gateway writing calls meanwhile never yields a torn file)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(f"file:{source}?mode=ro", uri=True) as src, sqlite3.connect(target) as dst:
        src.backup(dst)
    return target


async def push_model_folder(
    folder: ModelFolder,
    *,
    bucket: str | None = None,
    prefix: str | None = None,
    profile: str | None = None,
    delete: bool = False,
    verbose: bool = False,
) -> SyncReport:
    """Upload a model's folder to S3 (off the event loop).

    Example:
        >>> await push_model_folder(backend.model_folder(model), bucket="b")  # needs a network service: S3  # doctest: +SKIP
    """

    def run() -> SyncReport:
        remote = S3Folder(folder, bucket=bucket, prefix=prefix, profile=profile)
        report = remote.push(delete=delete)
        _report(verbose, f"pushed {folder.root} to {remote.url()}: {report.summary()}")
        return report

    return await asyncio.to_thread(run)


async def pull_model_folder(
    folder: ModelFolder,
    *,
    step: int | None = None,
    bucket: str | None = None,
    prefix: str | None = None,
    profile: str | None = None,
    delete: bool = False,
    verbose: bool = False,
) -> SyncReport:
    """Download a model's folder (or one checkpoint) from S3 (off the event loop).

    Example:
        >>> await pull_model_folder(backend.model_folder(model), bucket="b")  # needs a network service: S3  # doctest: +SKIP
    """

    def run() -> SyncReport:
        remote = S3Folder(folder, bucket=bucket, prefix=prefix, profile=profile)
        report = remote.pull(step=step, delete=delete)
        _report(verbose, f"pulled {remote.url()} to {folder.root}: {report.summary()}")
        return report

    return await asyncio.to_thread(run)


def _report(verbose: bool, line: str) -> None:
    if verbose:
        print(line, flush=True)
    else:
        logger.info(line)
