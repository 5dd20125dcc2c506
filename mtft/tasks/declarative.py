"""Tasks declared in YAML files.

A task file names the task, its languages, the head, the columns, the metric and, per split, where the
data lives (see ``tasks/README.md``). The ``head`` picks the task kind (:mod:`mtft.tasks.kinds`);
``class:`` in the file selects a :class:`Task` subclass for tasks that need code -- ``module:Class`` defined in a
``.py`` file beside it, or ``package.module:Class`` importable (the built-in GLUE and SuperGLUE tasks name the
library's classes so); the YAML then supplies its fields (those of the class, subclass fields included).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Optional

from mtft.core.errors import ConfigError
from mtft.core.paths import check_name
from mtft.core.registry import check_plugin_import, import_reference
from mtft.core.safe_yaml import load_yaml, read_text
from mtft.core.templates import check_template
from mtft.tasks.base import Task
from mtft.tasks.kinds import TASK_CLASSES, task_kind

_NOT_IN_FILES = {"folder"}


def read_task_spec(path: Path) -> Optional[dict[str, Any]]:
    """The fields ``path`` declares, its task and language names checked (they become file names); None for a
    YAML file that declares no task (no top-level ``task``). Runs no code: ``class:`` is not resolved here."""
    path = Path(path)
    spec = load_yaml(read_text(path, "task file"), f"task file {path}")
    if not isinstance(spec, dict) or "task" not in spec:
        return None
    spec = dict(spec)
    spec["name"] = check_name(spec.pop("task"), f"task file {path}: task")
    languages = spec.get("languages")
    if not isinstance(languages, list) or not languages:
        raise ConfigError(f"task file {path}: 'languages' must be a non-empty list of language names")
    for language in languages:
        check_name(language, f"task file {path}: languages")
    return spec


def load_task_file(path: Path) -> Optional[Task]:
    """The task declared in ``path``; None for a YAML file that declares no task (no top-level ``task``).
    A ``class:`` plug-in is imported here, so call it only for a task the run uses (see :mod:`registry`)."""
    spec = read_task_spec(path)
    return None if spec is None else build_task(spec, Path(path))


def build_task(spec: dict[str, Any], path: Path) -> Task:
    """The task of a spec read by :func:`read_task_spec` (imports its ``class:`` plug-in, if any)."""
    spec = dict(spec)
    head = spec.get("head", "sequence_classification")
    # the plug-in first: its module may enrol the kind its task file names (mtft.tasks.kinds.register_kind)
    reference = spec.pop("class", None)
    own_class = _task_class(reference, path) if reference is not None else None
    try:
        default_class = task_kind(head)
    except ValueError as exc:
        raise ConfigError(f"task file {path}: {exc}") from None
    task_class = own_class or default_class
    valid = {f.name for f in dataclasses.fields(task_class)} - _NOT_IN_FILES
    unknown = set(spec) - valid
    if unknown:
        raise ConfigError(
            f"task file {path}: unknown key(s) {', '.join(sorted(unknown))}; valid keys: "
            f"task, class, {', '.join(sorted(valid - {'name'}))}"
        )
    _check_data_entries(spec.get("data", {}), path)
    task = task_class(folder=str(path.parent), **spec).configured({}, f"task file {path}")
    unknown_metrics = [m for m in task.metrics if m not in task.available_metrics()]
    if unknown_metrics or not task.metrics:
        raise ConfigError(
            f"task file {path}: metrics {list(task.metrics)}: {', '.join(unknown_metrics) or 'none given'} "
            f"not computed by a {head} task; valid: {', '.join(task.available_metrics())}"
        )
    return task


def _check_data_entries(data: Any, path: Path) -> None:
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"task file {path}: 'data' must map split names to dataset references")
    ref_keys = {"path", "split", "name", "data_files", "language"}
    for split, entry in data.items():
        entries = entry.values() if isinstance(entry, dict) and "path" not in entry else [entry]
        for ref in entries:
            if not isinstance(ref, dict) or "path" not in ref or "split" not in ref or set(ref) - ref_keys:
                raise ConfigError(
                    f"task file {path}: data.{split} must be {{path, split[, name, data_files, language]}} "
                    "or a mapping from protocol to such entries"
                )
            for key, value in ref.items():
                if isinstance(value, str):  # filled per language by Task.dataset_ref
                    check_template(value, {"language"}, f"task file {path}: data.{split}.{key}")


def _task_class(reference: str, path: Path) -> type[Task]:
    """The class ``class:`` names: ``<module>:<Class>`` with ``<module>.py`` beside the task file, or an importable
    ``<package.module>:<Class>``. Either way it is code executed on loading the task (see ``tasks/README.md``), so
    a name that could reach outside the task's folder (``../x``, ``/abs/x``) is refused before anything is run."""
    module_name, _, class_name = str(reference).partition(":")
    parts = module_name.split(".")
    if not class_name.isidentifier() or not all(part.isidentifier() for part in parts):
        raise ConfigError(
            f"task file {path}: class {reference!r} must be '<module>:<Class>' with <module>.py beside the task "
            "file, or '<package.module>:<Class>' naming an importable module"
        )
    try:
        if len(parts) > 1:
            return TASK_CLASSES.checked(import_reference(f"{module_name}:{class_name}"))
        return TASK_CLASSES.checked(getattr(_module_beside(module_name, reference, path), class_name, None))
    except ValueError as exc:
        raise ConfigError(f"task file {path}: class {reference!r}: {exc}") from None


def _module_beside(module_name: str, reference: str, path: Path) -> ModuleType:
    module_path = path.parent / f"{module_name}.py"
    if not module_path.is_file():
        raise ConfigError(
            f"task file {path}: class {reference!r}: {module_name}.py not found beside the task file (an importable "
            "module is named by its dotted path, '<package.module>:<Class>')"
        )
    unique = f"mtft_user_tasks.{path.parent.name}.{module_name}"
    try:
        check_plugin_import(str(module_path))
    except ValueError as exc:
        raise ConfigError(f"task file {path}: class {reference!r}: {exc}") from None
    module_spec = importlib.util.spec_from_file_location(unique, module_path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[unique] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:  # the plug-in's own bug: name the file the user wrote, on one line
        sys.modules.pop(unique, None)
        raise ConfigError(
            f"task file {path}: class {reference!r}: {module_path} failed on import: {type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:200]}"
        ) from None
    return module
