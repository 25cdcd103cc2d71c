"""Tasks on disk: a folder of tasks, one subfolder per task.

::

    tasks/
      hello_file/
        task.toml        prompt = "...", check = "..."   (required)
        files/           the run's starting folder, copied for each run (optional: empty)
        check/           whatever the check needs, kept out of the run's folder (optional)

``task.toml`` holds ``prompt`` (what the agent is asked), ``check`` (a shell command, run with
``sh -c`` in the run's copy of ``files/`` after the agent ends: exit 0 scores 1.0, or the
number on its last output line, ``art_cli_agents.reward_of``), and an optional
``[metadata]`` table (copied into ``Task.metadata``). In ``check``, ``${task_dir}`` becomes
the task folder's absolute path, shell-quoted: the check's own scripts and expected outputs
live in ``check/`` and are reached as ``${task_dir}/check/...``. The check runs with the
run's base environment only (``PATH``, the locale, its own ``HOME``), so a path in its
command line is the one way to hand it a location. The agent is not given that path and its
copy holds only ``files/``; where the sandbox confines the filesystem, the task folder is
read-only to it, but not hidden: a check must not rely on the agent being unable to read it.

A task's name (its folder's name) is ``Task.metadata["task"]``. Everything is validated on
load: a problem raises ``ValueError`` naming the file and the key.
"""

from __future__ import annotations

import os
import shlex
import tomllib
from pathlib import Path
from typing import Any

from art_cli_agents.rollout import Task

TASK_FILE = "task.toml"
FILES_DIR = "files"
# In a check command: replaced by the task folder's absolute path, shell-quoted. Only this
# exact text is replaced; any other ``$...`` is the shell's.
TASK_DIR_PLACEHOLDER = "${task_dir}"
_REQUIRED = ("prompt", "check")
_KEYS = (*_REQUIRED, "metadata")


def load_task(path: str | Path) -> Task:
    """The task in folder ``path`` (see the module); its name is the folder's name.

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp()) / "hello"
        >>> folder.mkdir()
        >>> _ = (folder / "task.toml").write_text('prompt = "Write hello.txt"\\ncheck = "test -f hello.txt"\\n')
        >>> task = load_task(folder)
        >>> task.prompt, task.check, task.folder, task.metadata
        ('Write hello.txt', 'test -f hello.txt', None, {'task': 'hello'})
        >>> _ = (folder / "task.toml").write_text('prompt = "Write hello.txt"\\n')
        >>> load_task(folder)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: .../hello/task.toml: missing key 'check' (a shell command that scores the run's folder)
    """
    folder = Path(path).absolute()
    if not folder.is_dir():
        raise ValueError(f"{folder}: not a task folder (expected a folder holding {TASK_FILE})")
    source = folder / TASK_FILE
    if not source.is_file():
        raise ValueError(f"{source}: missing (every task folder needs a {TASK_FILE})")
    try:
        data = tomllib.loads(source.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{source}: not valid TOML: {exc}") from None
    unknown = sorted(set(data) - set(_KEYS))
    if unknown:
        raise ValueError(
            f"{source}: unknown key {unknown[0]!r} (a task has {', '.join(map(repr, _KEYS))})"
        )
    what = {
        "prompt": "what the agent is asked to do",
        "check": "a shell command that scores the run's folder",
    }
    for key in _REQUIRED:
        if key not in data:
            raise ValueError(f"{source}: missing key {key!r} ({what[key]})")
        if not isinstance(data[key], str):
            raise ValueError(
                f"{source}: key {key!r} must be a string, not {type(data[key]).__name__}"
            )
        if not data[key].strip():
            raise ValueError(f"{source}: key {key!r} is empty")
    metadata = data.get("metadata", {})
    if not isinstance(metadata, dict):
        raise ValueError(f"{source}: key 'metadata' must be a table, not {type(metadata).__name__}")
    if "task" in metadata:
        raise ValueError(
            f"{source}: key 'metadata.task' is reserved (the task's name is its folder's name)"
        )
    return Task(
        data["prompt"],
        folder=_files_folder(folder, source),
        check=data["check"].replace(TASK_DIR_PLACEHOLDER, shlex.quote(str(folder))),
        metadata={"task": folder.name, **metadata},
        # What ${task_dir} names must stay visible to the check inside an isolated run.
        check_reads=(folder,) if TASK_DIR_PLACEHOLDER in data["check"] else (),
    )


def _files_folder(folder: Path, source: Path) -> Path | None:
    """``folder/files`` when there is one, refused if it is a link, not a folder, or holds
    a link that leads out of it (links are copied as links: it would lead out of the run's
    folder, to the task's own files or elsewhere)."""
    files = folder / FILES_DIR
    if files.is_symlink():
        raise ValueError(
            f"{source}: {FILES_DIR!r} ({files}) is a symbolic link; it must be a folder in the task"
        )
    if not files.exists():
        return None
    if not files.is_dir():
        raise ValueError(f"{source}: {FILES_DIR!r} ({files}) is not a folder")
    root = files.resolve()
    for parent, dirs, names in os.walk(files):
        for name in [*dirs, *names]:
            entry = Path(parent) / name
            if entry.is_symlink():
                target = (entry.parent / os.readlink(entry)).resolve()
                if not target.is_relative_to(root):
                    raise ValueError(
                        f"{source}: {FILES_DIR!r} holds {entry.relative_to(folder)}, a link out of "
                        f"the folder (to {os.readlink(entry)})"
                    )
    return files


def load_tasks(path: str | Path) -> list[Task]:
    """Every task in folder ``path``, one per subfolder, sorted by name (folders whose name
    starts with ``.`` or ``_`` are skipped; files beside them, e.g. a README, are ignored).

    Example:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> for name in ("b_task", "a_task"):
        ...     (root / name).mkdir()
        ...     _ = (root / name / "task.toml").write_text('prompt = "p"\\ncheck = "true"\\n')
        >>> [task.metadata["task"] for task in load_tasks(root)]
        ['a_task', 'b_task']
    """
    root = Path(path).absolute()
    if not root.is_dir():
        raise ValueError(f"{root}: not a folder of tasks")
    folders = sorted(
        entry
        for entry in root.iterdir()
        if entry.is_dir() and not entry.name.startswith((".", "_"))
    )
    if not folders:
        raise ValueError(
            f"{root}: no tasks (expected one subfolder per task, each with {TASK_FILE})"
        )
    return [load_task(folder) for folder in folders]


def task_name(task: Task) -> str:
    """The task's name: ``metadata["task"]`` (set by the loader), else its prompt's start.

    Example:
        >>> task_name(Task("Create hello.txt containing hello, nothing else"))
        'Create hello.txt containing hell...'
        >>> task_name(Task("x", metadata={"task": "hello_file"}))
        'hello_file'
    """
    name: Any = task.metadata.get("task")
    if isinstance(name, str) and name:
        return name
    return task.prompt if len(task.prompt) <= 32 else task.prompt[:32] + "..."
