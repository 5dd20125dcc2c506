"""Discover task definitions in folders: every ``*.yaml`` file with a top-level ``task`` key.

Folders listed in ``data.task_dirs`` are searched first, then the repository's ``tasks/`` folder, so a user
task of the same name shadows a built-in one without editing the library.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from mtft.core.errors import ConfigError
from mtft.tasks.base import Task
from mtft.tasks.declarative import load_task_file

BUILTIN_TASK_DIR = Path(__file__).resolve().parents[2] / "tasks"


def discover_tasks(extra_dirs: Iterable[str | Path] = ()) -> dict[str, Task]:
    tasks: dict[str, Task] = {}
    folders = [*map(Path, extra_dirs)]
    for folder in folders:
        if not folder.is_dir():
            raise ConfigError(f"data.task_dirs: task folder not found: {folder}")
    if BUILTIN_TASK_DIR.is_dir():  # present in a checkout (the editable install the README uses)
        folders.append(BUILTIN_TASK_DIR)
    for folder in folders:
        for path in sorted(folder.rglob("*.yaml")):
            if "fixtures" in path.relative_to(folder).parts:
                continue
            task = load_task_file(path)
            if task is not None:
                tasks.setdefault(task.name, task)
    return tasks


def get_task(name: str, available: dict[str, Task]) -> Task:
    if name not in available:
        raise ConfigError(f"unknown task {name!r}; available tasks: {', '.join(sorted(available)) or 'none'}")
    return available[name]
