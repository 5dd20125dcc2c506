"""A run folder that stands alone: it keeps what it was trained with, so that predict, evaluate and export work
from any folder, and a later edit of a task file changes nothing about the run.

- ``config.yaml`` records every local path absolute (data folders and file patterns, task folders, the corpus,
  the retrieval set, the DeepSpeed file, a local backbone, the cache): the folder training ran from is not needed
  to read the run again. The training itself runs on the config as given.
- ``tasks/<task>/`` holds a copy of each task's definition: its task file (data paths made absolute) and the
  module of a ``class:`` plug-in beside it. A finished run reads its tasks from there first
  (:func:`mtft.runs.read_run_config`); a resumed run is refused where its task files changed since it started.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional, Sequence

import yaml

from mtft.config.deepspeed import BUILT_IN
from mtft.config.run_config import RunConfig
from mtft.core.errors import ConfigError
from mtft.core.safe_yaml import load_yaml, read_text
from mtft.models.named_backbones import NAMED
from mtft.runs import TASKS_DIR
from mtft.tasks.registry import discover_tasks


def absolute_paths(config: RunConfig) -> RunConfig:
    """``config`` with every local path absolute, from the working directory (where relative paths are read):
    Hub ids, named backbones and built-in DeepSpeed stages stay names. Idempotent."""
    data, model, training = config.data, config.model, config.training
    updates: dict[str, Any] = {
        "data": data.model_copy(
            update={
                "task_dirs": [_absolute(d) for d in data.task_dirs],
                "sources": {hub_id: _absolute(local) for hub_id, local in data.sources.items()},
                "cache_dir": _absolute(data.cache_dir) if data.cache_dir else None,
            }
        ),
        "model": model.model_copy(update={"backbone": _local_or_name(model.backbone, keep=("tiny", *NAMED))}),
        "training": training.model_copy(
            update={"deepspeed_config": _local_or_name(training.deepspeed_config, keep=tuple(BUILT_IN))}
        ),
        "corpus": config.corpus.model_copy(update={"path": _local_or_none(config.corpus.path)}),
    }
    retrieval = config.forgetting.retrieval
    updates["forgetting"] = config.forgetting.model_copy(
        update={"retrieval": retrieval.model_copy(update={"path": _local_or_none(retrieval.path)})}
    )
    return config.model_copy(update=updates)


def _absolute(path: str) -> str:
    """``path`` absolute, its ``~`` expanded; placeholders such as ``{name}`` are kept (no file is looked at)."""
    return os.path.abspath(os.path.expanduser(path))


def _local_or_name(value: str, keep: Sequence[str]) -> str:
    """A value that is a local path (it exists here) made absolute; a name (Hub id, built-in) as it is."""
    return value if value in keep or not Path(value).expanduser().exists() else _absolute(value)


def _local_or_none(value: Optional[str]) -> Optional[str]:
    return None if value is None else _local_or_name(value, keep=())


# ----- the task definitions ---------------------------------------------------------------------------------


def task_copies(config: RunConfig) -> dict[str, str]:
    """The files of ``tasks/`` for the run's tasks, by path relative to it: each task file as the run reads it now
    (its data paths absolute, a header saying where it came from) and its ``class:`` module beside it."""
    catalog = discover_tasks(config.data.task_dirs)
    copies: dict[str, str] = {}
    for name in dict.fromkeys(selection.name for selection in config.data.tasks):
        if name not in catalog:
            continue  # unknown: the run's own check names it
        source = catalog.file_of(name)
        spec = load_yaml(read_text(source, "task file"), f"task file {source}")
        spec["data"] = _absolute_data(spec.get("data"))
        header = f"# {name}: the task file {source.resolve()} as this run was trained with it\n"
        text = yaml.safe_dump(spec, sort_keys=False, allow_unicode=True, width=1 << 16)  # one line per path
        copies[f"{name}/{source.name}"] = header + text
        module = _plugin_module(spec.get("class"), source)
        if module is not None:
            copies[f"{name}/{module.name}"] = module.read_text(encoding="utf-8")
    return copies


def write_task_copies(run_dir: Path, copies: dict[str, str]) -> None:
    for relative, text in copies.items():
        path = run_dir / TASKS_DIR / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def changed_task_files(run_dir: Path, config: RunConfig) -> list[str]:
    """The task files that differ from the copies ``run_dir`` keeps (none for a run older than the copies)."""
    kept = Path(run_dir) / TASKS_DIR
    if not kept.is_dir():
        return []
    now = task_copies(config)
    before = {str(p.relative_to(kept)): p.read_text(encoding="utf-8") for p in kept.rglob("*") if p.is_file()}
    return sorted(set(before) ^ set(now) | {k for k in now if before.get(k, now[k]) != now[k]})


def _absolute_data(data: Any) -> Any:
    """A task file's ``data`` with its local paths absolute: a ``path`` that exists here, and the ``data_files``
    of a packaged builder (``json``, ``csv``, ...) -- those of a local folder are relative to that folder."""
    if not isinstance(data, dict):
        return data
    if "path" not in data:  # split -> entry, or protocol -> entry
        return {key: _absolute_data(entry) for key, entry in data.items()}
    entry = dict(data)
    path = entry["path"]
    folder = isinstance(path, str) and Path(path).expanduser().exists()
    if folder:
        entry["path"] = _absolute(path)
    if "data_files" in entry and not folder:
        entry["data_files"] = _absolute_files(entry["data_files"])
    return entry


def _absolute_files(files: Any) -> Any:
    if isinstance(files, str):
        return files if "://" in files else _absolute(files)
    if isinstance(files, dict):
        return {split: _absolute_files(value) for split, value in files.items()}
    if isinstance(files, list):
        return [_absolute_files(value) for value in files]
    return files


def _plugin_module(reference: Any, task_file: Path) -> Optional[Path]:
    """The ``<module>.py`` beside the task file that ``class: <module>:<Class>`` names (an importable dotted
    module is the environment's, not the task's)."""
    if not isinstance(reference, str) or ":" not in reference:
        return None
    module = reference.partition(":")[0]
    beside = task_file.parent / f"{module}.py"
    return beside if "." not in module and beside.is_file() else None


def check_task_files_unchanged(run_dir: Path, config: RunConfig) -> None:
    """Refuse to resume a run whose task files changed since it started (it would train on two definitions)."""
    changed = changed_task_files(run_dir, config)
    if changed:
        raise ConfigError(
            f"cannot resume {run_dir}: its task definitions changed since it started ({', '.join(changed[:5])} in "
            f"{Path(run_dir) / TASKS_DIR} differ from the task files read now); restore them, or start a new run"
        )
