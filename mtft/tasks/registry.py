"""Discover task definitions in folders: every ``*.yaml`` file with a top-level ``task`` key (plug-in code of a
task is imported only when the task is used, see :class:`TaskCatalog`).

Folders listed in ``data.task_dirs`` are searched first, then the built-in tasks, so a user task of the same
name shadows a built-in one without editing the library. The built-in tasks are the repository's top-level
``tasks/`` folder, which a wheel installs as the package data ``mtft/builtin_tasks`` (setup.cfg).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Optional

from mtft.core.errors import ConfigError
from mtft.tasks.base import Task
from mtft.tasks.declarative import build_task, read_task_spec


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


class TaskCatalog(Mapping[str, Task]):
    """The discovered tasks by name. A task file is read (safe YAML, no code) at discovery; a task whose file
    names a ``class:`` plug-in is built -- its code imported -- only when it is looked up, so a run imports the
    plug-ins of the tasks it uses and no others. Tasks without a plug-in are built at once, so a mistake in any
    task file is reported before a run starts."""

    def __init__(self) -> None:
        self._built: dict[str, Task] = {}
        self._deferred: dict[str, tuple[dict[str, Any], Path]] = {}
        self._files: dict[str, Path] = {}

    def add(self, spec: dict[str, Any], path: Path) -> None:
        name = spec["name"]
        if name in self:
            return  # an earlier folder's task of the same name shadows this one
        self._files[name] = path
        if "class" in spec:
            self._deferred[name] = (spec, path)
        else:
            self._built[name] = build_task(spec, path)

    def __getitem__(self, name: str) -> Task:
        if name not in self._built:
            spec, path = self._deferred.pop(name)  # KeyError for an unknown name, as a Mapping should
            self._built[name] = build_task(spec, path)
        return self._built[name]

    def file_of(self, name: str) -> Path:
        """The task file ``name`` was read from (the one that shadows any other of the same name)."""
        return self._files[name]

    def __iter__(self) -> Iterator[str]:
        return iter([*self._built, *self._deferred])

    def __len__(self) -> int:
        return len(self._built) + len(self._deferred)

    def __contains__(self, name: object) -> bool:
        return name in self._built or name in self._deferred


def discover_tasks(extra_dirs: Iterable[str | Path] = ()) -> TaskCatalog:
    tasks = TaskCatalog()
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
            spec = read_task_spec(path)
            if spec is not None:
                tasks.add(spec, path)
    return tasks


def get_task(name: str, available: Mapping[str, Task]) -> Task:
    if name not in available:
        raise ConfigError(f"unknown task {name!r}; available tasks: {', '.join(sorted(available)) or 'none'}")
    return available[name]
