"""A run folder's config, its tasks read from the copies the run keeps (``tasks/<task>/``)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from mtft.config import load_config
from mtft.config.run_config import RunConfig

TASKS_DIR = "tasks"


def read_run_config(root: Path, overrides: Iterable[str] = ()) -> RunConfig:
    """A run folder's ``config.yaml`` (with ``overrides``), its tasks read from the copies it keeps: the task
    folders it was trained with are replaced by its ``tasks/``, and task folders an override adds are searched
    after it."""
    overrides = list(overrides)
    config = load_config(Path(root) / "config.yaml", overrides)
    kept = Path(root) / TASKS_DIR
    if not kept.is_dir():
        return config
    trained_with = load_config(Path(root) / "config.yaml").data.task_dirs if overrides else config.data.task_dirs
    added = [folder for folder in config.data.task_dirs if folder not in trained_with]
    data = config.data.model_copy(update={"task_dirs": [str(kept), *added]})
    return config.model_copy(update={"data": data})
