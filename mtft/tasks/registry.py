"""Discover task definitions in folders: every ``*.yaml`` file with a top-level ``task`` key.

Folders listed in ``data.task_dirs`` are searched first, then the built-in tasks, so a user task of the same
name shadows a built-in one without editing the library. The built-in tasks are the repository's top-level
``tasks/`` folder, which a wheel installs as the package data ``mtft/builtin_tasks`` (setup.cfg).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Iterable, Optional

from mtft.core.errors import ConfigError
from mtft.tasks.base import Task
from mtft.tasks.declarative import load_task_file


def builtin_task_dir() -> Optional[Path]:
    """The folder of the built-in task files: the package data of an installed wheel, else the ``tasks/`` folder
    of the source checkout that ``mtft`` is imported from (an editable install, or ``PYTHONPATH``); None if neither.

    The checkout is recognised by its ``setup.cfg``, so that an unrelated ``tasks/`` folder beside an installed
    package is never read."""
    installed = resources.files("mtft") / "builtin_tasks"
    if isinstance(installed, Path) and installed.is_dir():
        return installed
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "setup.cfg").is_file() and (checkout / "tasks").is_dir():
        return checkout / "tasks"
    return None


def discover_tasks(extra_dirs: Iterable[str | Path] = ()) -> dict[str, Task]:
    tasks: dict[str, Task] = {}
    folders = [*map(Path, extra_dirs)]
    for folder in folders:
        if not folder.is_dir():
            raise ConfigError(f"data.task_dirs: task folder not found: {folder}")
    builtin = builtin_task_dir()
    if builtin is not None:
        folders.append(builtin)
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
