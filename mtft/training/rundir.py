"""The run directory's life: created complete (resolved config, a completeness marker saying it is an mtft run,
and whatever else the stage needs at its start) or not at all, by rank 0, after every input has been checked."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from mtft.config.load import config_to_yaml
from mtft.config.run_config import RunConfig
from mtft.core.atomic import AtomicFolder
from mtft.training.setup import resumes_existing_run
from mtft.training.standalone import absolute_paths, task_copies, write_task_copies


def create_run_dir(config: RunConfig, write: Optional[Callable[[Path], None]] = None) -> bool:
    """Write ``config.yaml`` (its local paths absolute), the copies of the run's task definitions (``tasks/``,
    :mod:`mtft.training.standalone`) and ``write(folder)``'s files into a new run directory in one rename; with
    ``run.overwrite`` it replaces the previous run's directory the same way. A resumed run keeps its directory
    untouched (returns False). Call on rank 0 only; the text log is attached by the caller once the run is
    accepted (:func:`mtft.reporting.logs.add_file_log`)."""
    if resumes_existing_run(config):
        return False
    copies = task_copies(config)
    with AtomicFolder(Path(config.run.output_dir)).writing(
        kind="run", name=config.run.name, stage=config.run.stage
    ) as folder:
        (folder / "config.yaml").write_text(config_to_yaml(absolute_paths(config)), encoding="utf-8")
        write_task_copies(folder, copies)
        if write is not None:
            write(folder)
    return True
